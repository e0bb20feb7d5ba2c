"""Containment, for every backend that runs here (bubblewrap, Docker): each case attacks for real, then checks
that the attack was contained, that the host is healthy and that the next sandbox starts normally.

Bombs are bounded (a few hundred MB, 64 processes, seconds) so the 2-core host survives a failed containment.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swerl.errors import InfraError
from swerl.sandbox.base import Sandbox
from swerl.sandbox.supervisor import Cgroups
from tests.sandbox_backends import Backend, Limits, backend_params, host_processes_matching, make_backend

PROJECT = Path(__file__).resolve().parents[2]
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-" + secrets.token_hex(8),
    "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8),
    "AWS_SESSION_TOKEN": "aws-session-" + secrets.token_hex(8),
    "E2B_API_KEY": "e2b-" + secrets.token_hex(8),
    "HF_TOKEN": "hf-" + secrets.token_hex(8),
    "OPENAI_API_KEY": "sk-" + secrets.token_hex(8),
    "GITHUB_TOKEN": "ghp-" + secrets.token_hex(8),
}


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    root.mkdir()
    (root / "mod.py").write_text("x = 1\n")
    return root


@pytest.fixture(params=backend_params(["local", "local-bwrap", "docker"]))
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    for key, value in SECRETS.items():  # set before the provider exists: nothing it copies may carry them
        monkeypatch.setenv(key, value)
    made = make_backend(request.param, tmp_path, Limits())
    yield made
    made.teardown()


def run(coro):
    return asyncio.run(coro)


async def attack(backend: Backend, env_dir: Path, body) -> None:
    """Run `body(sandbox)` in a fresh sandbox, close it, then check the host and a new sandbox."""
    sandbox = await backend.provider.start(env_dir)
    try:
        await body(sandbox)
    finally:
        await sandbox.close()
    assert backend.leftovers() == []
    t0 = time.monotonic()
    assert subprocess.run(["true"], timeout=10).returncode == 0
    assert _mem_available_mb() > 1024
    after = await backend.provider.start(env_dir)
    try:
        result = await after.exec("echo ok; ls", 30)
        assert result.output.split() == ["ok", "mod.py"], result.output
    finally:
        await after.close()
    assert time.monotonic() - t0 < 30, "the next sandbox took too long to start"
    assert backend.leftovers() == []


def _mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def _gone(marker: str, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while host_processes_matching(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_no_network_not_even_the_hosts_loopback(backend: Backend, env_dir: Path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')"

    async def body(sandbox: Sandbox) -> None:
        net = await sandbox.exec(f'python -c "{connect}"', 20)
        assert net.exit_code != 0 and "CONNECTED" not in net.output
        bash_tcp = await sandbox.exec(f"echo hi > /dev/tcp/127.0.0.1/{port} && echo SENT", 20)
        assert "SENT" not in bash_tcp.output
        interfaces = await sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1", 10)
        assert interfaces.output.split() in (["lo"], []), interfaces.output
        dns = await sandbox.exec("python -c \"import socket; print(socket.gethostbyname('deb.debian.org'))\"", 20)
        assert dns.exit_code != 0

    try:
        run(attack(backend, env_dir, body))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the host's listener
    finally:
        listener.close()


def test_host_files_outside_the_workspace_are_invisible(backend: Backend, env_dir: Path, tmp_path: Path):
    token, name = secrets.token_hex(16), f".swerl-security-{secrets.token_hex(4)}"  # content, file name
    markers = [Path("/root") / name, PROJECT / "runs" / name]
    markers.append(tmp_path / "host-secret.txt")
    for marker in markers:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"host secret {token}\n")

    async def body(sandbox: Sandbox) -> None:
        for marker in markers:
            read = await sandbox.exec(f"cat {marker}", 10)
            assert read.exit_code != 0 and token not in read.output, marker
        listing = await sandbox.exec(f"ls -A /root {PROJECT / 'runs'} {tmp_path}", 10)
        assert name not in listing.output and "host-secret" not in listing.output
        places = f"/root /etc /var /home /tmp /opt /srv /mnt {PROJECT / 'runs'} {tmp_path}"
        search = await sandbox.exec(f"grep -rl --exclude-dir=.pyenv {token} {places} 2>/dev/null | head", 60)
        assert not search.timed_out and search.output == "", search.output

    try:
        run(attack(backend, env_dir, body))
    finally:
        for marker in markers:
            marker.unlink(missing_ok=True)


def test_no_writes_outside_the_workspace(backend: Backend, env_dir: Path, tmp_path: Path):
    name = f"evil-{secrets.token_hex(6)}"
    targets = [f"/usr/{name}", f"/etc/{name}", f"/root/{name}", f"{sys.prefix}/{name}", str(tmp_path / name)]
    targets += [str(env_dir / name), str(PROJECT / name), f"/var/tmp/{name}"]

    async def body(sandbox: Sandbox) -> None:
        for target in targets:
            wrote = await sandbox.exec(f"mkdir -p $(dirname {target}) 2>/dev/null; echo x > {target}", 10)
            assert wrote.exit_code != 0 or not Path(target).exists(), target

    run(attack(backend, env_dir, body))
    assert [t for t in targets if Path(t).exists()] == []


def test_host_secrets_do_not_reach_the_sandbox(backend: Backend, env_dir: Path):
    async def body(sandbox: Sandbox) -> None:
        seen = await sandbox.exec("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'", 20)
        for key, value in SECRETS.items():
            assert value not in seen.output and f"{key}=" not in seen.output, key

    run(attack(backend, env_dir, body))


def test_fork_bomb_is_contained(backend: Backend, env_dir: Path):
    marker = f"bomb{secrets.token_hex(6)}"

    async def body(sandbox: Sandbox) -> None:
        t0 = time.monotonic()
        bomb = await sandbox.exec(f"{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 5", timeout=15)
        assert time.monotonic() - t0 < 40
        assert bomb.timed_out or "Resource temporarily unavailable" in bomb.output, bomb.output[-500:]
        assert _gone(marker), "fork-bomb processes outlived their command"

    run(attack(backend, env_dir, body))


def test_memory_bomb_is_contained(backend: Backend, env_dir: Path):
    marker = f"membomb{secrets.token_hex(6)}"
    bomb = f"python -c \"chunks = []  # {marker}\nwhile True: chunks.append(b'x' * (16 << 20))\""

    async def body(sandbox: Sandbox) -> None:
        t0 = time.monotonic()
        result = await sandbox.exec(bomb, timeout=60)
        assert not result.timed_out and result.exit_code != 0, result
        assert time.monotonic() - t0 < 60
        assert _gone(marker)
        assert (await sandbox.exec("echo still here", 10)).output == "still here\n"  # the sandbox survived

    run(attack(backend, env_dir, body))


def test_disk_fill_is_contained(backend: Backend, env_dir: Path):
    limits = Limits()
    total_mb = 5 * limits.workspace_mb  # bounded even when containment fails

    async def body(sandbox: Sandbox) -> None:
        fill = await sandbox.exec(
            f"for i in $(seq {total_mb // 8}); do head -c 8M /dev/zero > fill$i || break; done; du -sm .", 120
        )
        used_mb = int(fill.output.split()[-2])
        tmp = await sandbox.exec(
            f"head -c {2 * limits.tmp_size_mb}M /dev/zero > /tmp/fill; status=$?; du -smx /tmp; exit $status",
            60,
        )
        assert tmp.exit_code != 0 and int(tmp.output.split()[-2]) <= limits.tmp_size_mb
        assert (await sandbox.exec("rm -f fill* && echo freed", 30)).output == "freed\n"
        assert used_mb <= limits.workspace_mb, f"workspace grew to {used_mb} MB"

    run(attack(backend, env_dir, body))


def test_a_command_that_never_ends_is_killed(backend: Backend, env_dir: Path):
    marker = f"spin{secrets.token_hex(6)}"

    async def body(sandbox: Sandbox) -> None:
        t0 = time.monotonic()
        spin = await sandbox.exec(f"trap '' TERM INT HUP; while :; do :; done # {marker}", timeout=2)
        assert spin.timed_out and spin.exit_code == 124 and time.monotonic() - t0 < 15
        assert _gone(marker), "the spinning command survived its timeout"

    run(attack(backend, env_dir, body))


def test_no_process_is_left_behind_after_close(backend: Backend, env_dir: Path):
    detached = f"{98765 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"
    running = f"{87654 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"

    async def body(sandbox: Sandbox) -> None:
        await sandbox.exec(f"setsid nohup sleep {detached} >/dev/null 2>&1 < /dev/null & disown; echo ok", 10)
        pending = asyncio.ensure_future(sandbox.exec(f"(setsid sleep {running} &); sleep {running}", 120))
        await asyncio.sleep(1.0)
        await sandbox.close()
        with pytest.raises(InfraError):
            await pending

    run(attack(backend, env_dir, body))
    assert _gone(f"sleep {detached}") and _gone(f"sleep {running}")


# ---------------------------------------------------------------------------------------------------------------
# Per-sandbox limits (issue 19): memory and pids for the whole sandbox, IPC dying with it, seccomp, odd commands.

_HOLD = (
    'python -c \'import time; b = bytearray({mb} << 20); b[::4096] = b"x" * len(b[::4096]); '
    'print("held", flush=True); time.sleep({sleep}); print("survived", flush=True)\''
)


def _cgrouped(backend: Backend) -> None:
    if backend.name != "local":
        pytest.skip("whole-sandbox cgroups are the supervisor runtime's (bubblewrap: per-process rlimits)")
    cgroups, why = Cgroups.detect()
    if cgroups is None:
        pytest.skip(f"no per-sandbox cgroups here: {why}")


def test_memory_is_capped_for_the_whole_sandbox(backend: Backend, env_dir: Path):
    _cgrouped(backend)
    cap_mb = 1024  # the local backend's memory_mb (tests/sandbox_backends.py)

    async def body(sandbox: Sandbox) -> None:
        procs, each_mb = 6, 300  # 1.8 GB together, under 1 GB each
        cmd = "; ".join([_HOLD.format(mb=each_mb, sleep=4) + " &"] * procs) + " wait; echo end"
        result = await sandbox.exec(cmd.replace("&;", "&"), 60)
        # a holder killed after it printed "held" did not hold its memory to the end: count the survivors
        held = result.output.count("survived\n")
        assert held > 0 and held * each_mb <= cap_mb, result.output[-800:]
        usage = sandbox.cgroups[0] / "memory.max_usage_in_bytes"  # type: ignore[attr-defined]
        if usage.exists():  # cgroup v1
            assert int(usage.read_text()) <= cap_mb << 20

    run(attack(backend, env_dir, body))


def test_processes_are_capped_for_the_whole_sandbox(backend: Backend, env_dir: Path):
    _cgrouped(backend)

    async def body(sandbox: Sandbox) -> None:
        result = await sandbox.exec(
            "for i in $(seq 100); do sleep 3 & done 2>/dev/null; ls /proc | grep -c '^[0-9]'", 30
        )
        assert int(result.output.split()[-1]) <= Limits().max_processes + 2, result.output[-300:]

    run(attack(backend, env_dir, body))


_SHM = (
    "python -c 'import ctypes; c = ctypes.CDLL(None, use_errno=True); c.shmat.restype = ctypes.c_void_p; "
    'i = c.shmget(0, {mb} << 20, 0o1600); a = c.shmat(i, None, 0); ctypes.memset(a, 1, {mb} << 20); print("shm", i)\''
)


def _shmem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no Shmem in /proc/meminfo")


def test_shared_memory_dies_with_the_sandbox_and_is_capped(backend: Backend, env_dir: Path):
    before = _shmem_mb()

    async def body(sandbox: Sandbox) -> None:
        made = await sandbox.exec(_SHM.format(mb=200), 60)
        assert made.exit_code == 0 and "shm" in made.output, made.output
        if backend.name == "local":
            listed = await sandbox.exec("cat /proc/sysvipc/shm", 10)
            assert len(listed.output.splitlines()) == 2, listed.output  # kept for the sandbox's lifetime
            big = await sandbox.exec(_SHM.format(mb=2048), 60)  # twice the sandbox's memory_mb
            assert big.exit_code != 0, big.output
            assert _shmem_mb() - before < 1024 + 128

    run(attack(backend, env_dir, body))
    # Shmem is machine-wide (tmpfs pages of other sandboxes count too): wait out their teardown, a few seconds
    deadline = time.monotonic() + 15
    while _shmem_mb() - before >= 150 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _shmem_mb() - before < 150, "shared memory outlived its sandbox"


def test_new_namespaces_mounts_and_ptrace_are_refused(backend: Backend, env_dir: Path):
    ptrace = (
        "python -c 'import ctypes, os; c = ctypes.CDLL(None, use_errno=True); "
        "print(c.ptrace(0, 0, 0, 0), os.strerror(ctypes.get_errno()))'"
    )

    async def body(sandbox: Sandbox) -> None:
        userns = await sandbox.exec("unshare -Urm sh -c 'mount -t tmpfs x /tmp && echo MOUNTED'; echo rc=$?", 10)
        assert "MOUNTED" not in userns.output and "rc=0" not in userns.output, userns.output
        mount = await sandbox.exec("mkdir -p /tmp/m; mount -t tmpfs x /tmp/m && echo MOUNTED", 10)
        assert "MOUNTED" not in mount.output
        traced = await sandbox.exec(ptrace, 10)
        if backend.name != "docker":  # Docker's default seccomp profile allows ptrace (kernel >= 4.8): not ours yet
            assert "-1 Operation not permitted" in traced.output, traced.output
        python_threads = await sandbox.exec(
            "python -c 'import threading; t = threading.Thread(target=print, args=(\"t\",)); t.start(); t.join()'",
            10,
        )
        assert python_threads.output == "t\n", python_threads.output  # clone3 -> ENOSYS -> clone works

    run(attack(backend, env_dir, body))


def test_huge_commands_and_nul_bytes_are_the_policys_results(backend: Backend, env_dir: Path):
    async def body(sandbox: Sandbox) -> None:
        huge = await sandbox.exec("echo " + "a" * (2 << 20) + " | wc -c", 60)
        assert huge.exit_code == 0 and huge.output.split() == [str((2 << 20) + 1)], huge.output[:300]
        stdin_free = await sandbox.exec("cat; echo " + "b" * (200 << 10) + " >/dev/null; echo fine", 30)
        assert stdin_free.output == "fine\n", stdin_free.output[:300]
        nul = await sandbox.exec("echo a\0b", 10)
        assert nul.exit_code != 0 and "NUL" in nul.output
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("mod\0.py")
        with pytest.raises(OSError):
            await sandbox.write_file("new\0.py", "x")
        await sandbox.write_file("bin.txt", "a\0b")
        assert (await sandbox.exec("wc -c < bin.txt", 10)).output.strip() == "3"

    run(attack(backend, env_dir, body))
