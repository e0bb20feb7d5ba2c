"""The artifact store: file:// and a real S3 server (SeaweedFS); atomic writes survive SIGKILL mid-write."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swerl.errors import InfraError
from swerl.storage import Store, open_store, sha256_file

# A writer process: it uploads SRC to REL in STORE_ROOT, printing "start" first. With SLOW=1 the copy is done
# in small flushed chunks with pauses (a slow disk), so the parent can kill it while the bytes are half written.
WRITER = r"""
import os, sys, time
from pathlib import Path
from swerl.storage import open_store

root, endpoint, src, rel, slow = sys.argv[1:6]
store = open_store(root, s3_endpoint_url=endpoint or None, max_attempts=1)
if slow == "1":
    def slow_put(lpath, rpath, **kw):
        with open(lpath, "rb") as fin, open(rpath, "wb") as fout:
            while block := fin.read(1 << 20):
                fout.write(block)
                fout.flush()
                time.sleep(0.01)
    store.fs.put_file = slow_put
print("start", flush=True)
store.put_file(Path(src), rel)
print("done", flush=True)
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _big_file(path: Path, mib: int, seed: int) -> str:
    rng = random.Random(seed)
    block = rng.randbytes(1 << 20)
    with open(path, "wb") as fh:
        for i in range(mib):
            fh.write(i.to_bytes(8, "little") + block[8:])  # every MiB differs: a torn copy cannot look whole
    return sha256_file(path)


def _start_writer(tmp_path: Path, root: str, endpoint: str, src: Path, rel: str, slow: bool) -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), root, endpoint, str(src), rel, "1" if slow else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "start", proc.stderr.read() if proc.stderr else line
    return proc


# ---- file:// --------------------------------------------------------------------------------------------


def test_file_round_trip(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    art = store.write_bytes("a/b/c.bin", b"\x00hello\xff")
    assert store.read_bytes("a/b/c.bin") == b"\x00hello\xff"
    assert (tmp_path / "store/a/b/c.bin").read_bytes() == b"\x00hello\xff"
    assert art.uri == f"file://{tmp_path}/store/a/b/c.bin"
    assert art.name == "c.bin"
    assert art.size == 7
    assert store.rel_of(art.uri) == "a/b/c.bin"
    assert store.exists("a/b/c.bin")
    assert not store.exists("a/b/missing.bin")
    assert store.list("a/b") == ["a/b/c.bin"]
    assert store.list("nowhere") == []
    store.write_json("a/obj.json", {"z": 1, "a": [1, 2]})
    assert store.read_json("a/obj.json") == {"z": 1, "a": [1, 2]}
    assert store.list("a") == ["a/b", "a/obj.json"]
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/missing")


def test_relative_root_resolves_against_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("file://runs/store")
    store.write_bytes("x.txt", b"1")
    assert (tmp_path / "runs/store/x.txt").read_bytes() == b"1"
    assert Store("plain/dir").root_uri == f"file://{tmp_path}/plain/dir"


def test_sha256_matches_content_computed_another_way(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    data = os.urandom(3 * (1 << 20) + 17)  # spans several read chunks
    art = store.write_bytes("blob.bin", data)
    assert art.sha256 == _sha(data)
    assert art.size == len(data)
    src = tmp_path / "src.bin"
    src.write_bytes(data[::-1])
    art2 = store.put_file(src, "copy.bin", name="reversed")
    assert art2.sha256 == _sha(data[::-1]) == sha256_file(tmp_path / "store/copy.bin")
    assert art2.name == "reversed"
    out = store.get_file("copy.bin", tmp_path / "down/copy.bin")
    assert _sha(out.read_bytes()) == art2.sha256
    assert [p.name for p in (tmp_path / "down").iterdir()] == ["copy.bin"]  # no temporary left behind


@pytest.mark.parametrize("rel", ["../escape", "a/../../escape", "a/..", "", "/", "..", "a/./../b"])
def test_path_traversal_and_empty_paths_are_rejected(tmp_path: Path, rel: str) -> None:
    store = open_store(f"file://{tmp_path}/store")
    for op in (
        lambda: store.write_bytes(rel, b"x"),
        lambda: store.read_bytes(rel),
        lambda: store.exists(rel),
        lambda: store.uri(rel),
    ):
        with pytest.raises(ValueError, match="invalid store path"):
            op()
    assert not (tmp_path / "escape").exists()


def test_absolute_looking_path_stays_inside_the_root(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    art = store.write_bytes("/etc/passwd-copy", b"x")
    assert art.uri == f"file://{tmp_path}/store/etc/passwd-copy"


def test_rel_of_rejects_uri_outside_store(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    with pytest.raises(ValueError, match="not inside store"):
        store.rel_of(f"file://{tmp_path}/store-other/x")


def test_overwrite_replaces_whole_object(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("o", b"a much longer first version")
    store.write_bytes("o", b"short")
    assert store.read_bytes("o") == b"short"
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["o"]


def test_sigkill_mid_write_never_leaves_a_partial_object(tmp_path: Path) -> None:
    """Kill a slowed writer at many points: the final name holds the old or the complete new bytes, never a part."""
    root = f"file://{tmp_path}/store"
    store = open_store(root)
    old = store.write_bytes("obj.bin", b"the previous, complete version")
    src = tmp_path / "new.bin"
    new_sha = _big_file(src, mib=48, seed=1)
    final = tmp_path / "store" / "obj.bin"
    outcomes = []
    # Delays cover the sha256 pass, the copy (~48 chunks x 10 ms) and beyond it.
    for delay in (0.05, 0.25, 0.4, 0.55, 0.7, 2.5):
        proc = _start_writer(tmp_path, root, "", src, "obj.bin", slow=True)
        time.sleep(delay)
        partial_seen = any(p.name.startswith("obj.bin.tmp-") for p in final.parent.iterdir())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        digest = sha256_file(final)
        assert digest in (old.sha256, new_sha), f"torn object after kill at {delay}s"
        outcomes.append((partial_seen, digest == new_sha))
        for leftover in final.parent.glob("obj.bin.tmp-*"):
            leftover.unlink()  # what a crash leaves behind is a temporary, never the object
        if digest == new_sha:
            store.write_bytes("obj.bin", b"the previous, complete version")
    # The kill window was really exercised: some writers died mid-copy, and a late kill finds the new object.
    assert any(seen and not done for seen, done in outcomes), outcomes
    assert outcomes[-1][1], outcomes


def test_sigkill_of_unslowed_writer_of_a_large_file(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/store"
    store = open_store(root)
    old = store.write_bytes("obj.bin", b"old")
    src = tmp_path / "new.bin"
    new_sha = _big_file(src, mib=96, seed=2)
    final = tmp_path / "store" / "obj.bin"
    rng = random.Random(0)
    for _ in range(4):
        proc = _start_writer(tmp_path, root, "", src, "obj.bin", slow=False)
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert sha256_file(final) in (old.sha256, new_sha)


# ---- S3 on a real SeaweedFS -----------------------------------------------------------------------------


def _s3_store(s3, prefix: str, **kw) -> Store:  # type: ignore[no-untyped-def]
    return open_store(f"s3://{s3.bucket}/{prefix}", s3_endpoint_url=s3.endpoint_url, **kw)


def test_s3_round_trip(s3_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = _s3_store(s3_env, "round-trip")
    assert store.root_uri == f"s3://{s3_env.bucket}/round-trip"
    data = os.urandom(100_000)
    art = store.write_bytes("d/blob.bin", data)
    assert art.uri == f"s3://{s3_env.bucket}/round-trip/d/blob.bin"
    assert (art.sha256, art.size) == (_sha(data), len(data))
    assert store.read_bytes("d/blob.bin") == data
    assert store.exists("d/blob.bin")
    assert not store.exists("d/nothing.bin")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("d/nothing.bin")
    store.write_json("d/meta.json", {"k": "v"})
    assert store.read_json("d/meta.json") == {"k": "v"}
    assert store.list("d") == ["d/blob.bin", "d/meta.json"]
    assert store.list("empty") == []

    # A file large enough for a multipart upload (s3fs switches at 50 MiB), through put_file / get_file.
    src = tmp_path / "big.bin"
    big_sha = _big_file(src, mib=56, seed=3)
    big = store.put_file(src, "d/big.bin")
    assert (big.sha256, big.size) == (big_sha, src.stat().st_size)
    back = store.get_file("d/big.bin", tmp_path / "back" / "big.bin")
    assert sha256_file(back) == big_sha
    assert store.list("d") == ["d/big.bin", "d/blob.bin", "d/meta.json"]

    # What boto sees is the same object (checked through another client).
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.endpoint_url, region_name="us-east-1")
    body = client.get_object(Bucket=s3_env.bucket, Key="round-trip/d/blob.bin")["Body"].read()
    assert _sha(body) == art.sha256


def test_s3_listing_sees_writes_of_another_store(s3_env) -> None:  # type: ignore[no-untyped-def]
    """Two handles on one bucket (two processes, a long-lived server): a listing must not be served stale."""
    reader, writer = _s3_store(s3_env, "two-handles"), _s3_store(s3_env, "two-handles")
    writer.write_bytes("stages/x/k1/manifest.json", b"1")
    assert reader.list("stages/x") == ["stages/x/k1"]
    writer.write_bytes("stages/x/k2/manifest.json", b"2")
    assert reader.list("stages/x") == ["stages/x/k1", "stages/x/k2"]
    assert reader.exists("stages/x/k2/manifest.json")


def test_s3_wrong_credentials_are_infra_errors(s3_env, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    good = _s3_store(s3_env, "creds")
    good.write_bytes("x.txt", b"x")
    wrong_secret = "wrong-" + s3_env.secret_key[::-1]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    bad = _s3_store(s3_env, "creds", max_attempts=1)
    ops = {
        "exists": lambda: bad.exists("x.txt"),
        "read_bytes": lambda: bad.read_bytes("x.txt"),
        "write_bytes": lambda: bad.write_bytes("y.txt", b"y"),
        "list": lambda: bad.list("anything"),
        "get_file": lambda: bad.get_file("x.txt", Path("/tmp/never-written-by-swerl-test")),
    }
    for name, op in ops.items():
        with pytest.raises(InfraError) as err:
            op()
        assert err.value.cause == "storage", name
        assert s3_env.secret_key not in str(err.value) and wrong_secret not in str(err.value), name
    assert not good.exists("y.txt")


def test_s3_unreachable_endpoint_is_infra_error(s3_env) -> None:  # type: ignore[no-untyped-def]
    from swerl.services import free_port

    dead = open_store(
        f"s3://{s3_env.bucket}/x",
        s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
        max_attempts=1,
        connect_timeout_s=1,
        read_timeout_s=1,
    )
    with pytest.raises(InfraError) as err:
        dead.write_bytes("a", b"a")
    assert err.value.cause == "storage"


def test_s3_credentials_never_in_repr_or_logs(s3_env, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    store = _s3_store(s3_env, "secrets")
    store.write_bytes("a.txt", b"a")
    store.read_bytes("a.txt")
    store.list("x")
    shown = " ".join([repr(store), str(vars(store)), repr(store.fs), str(store.fs.storage_options)])
    assert s3_env.secret_key not in shown
    assert s3_env.access_key not in shown
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert s3_env.secret_key not in logged
    swerl_logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("swerl"))
    assert s3_env.access_key not in swerl_logged


def test_s3_sigkill_mid_upload_leaves_old_or_complete(s3_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = _s3_store(s3_env, "kill")
    old = store.write_bytes("obj.bin", b"old version")
    src = tmp_path / "new.bin"
    new_sha = _big_file(src, mib=24, seed=4)
    for delay in (0.1, 0.3, 0.5):
        proc = _start_writer(tmp_path, store.root_uri, s3_env.endpoint_url, src, "obj.bin", slow=False)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert _sha(_s3_store(s3_env, "kill").read_bytes("obj.bin")) in (old.sha256, new_sha)
