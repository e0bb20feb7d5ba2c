"""One contract, every backend: exec, exit codes, output, files, cwd, timeouts, close, failures.

Each test runs against every entry of tests/sandbox_backends.py:BACKENDS for real (bubblewrap; a Docker engine,
skipped with the reason only when none answers).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swerl.errors import InfraError
from swerl.sandbox.base import ExecResult, Sandbox, SandboxProvider
from tests.sandbox_backends import Backend, Limits, backend_params, make_backend

PATCH = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
    (root / "pkg" / "__init__.py").write_text("")
    return root


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = make_backend(request.param, tmp_path, Limits(max_output_bytes=4096))
    yield made
    made.teardown()


def run(coro):
    return asyncio.run(coro)


async def started(backend: Backend, env_dir: Path, patch: str | None = None) -> Sandbox:
    sandbox = await backend.provider.start(env_dir, patch)
    assert isinstance(sandbox, Sandbox)
    return sandbox


def test_protocol_exec_output_and_exit_codes(backend: Backend, env_dir: Path):
    assert isinstance(backend.provider, SandboxProvider)

    async def body() -> None:
        sandbox = await started(backend, env_dir, PATCH)
        try:
            result = await sandbox.exec("python -c 'from pkg.mod import answer; print(answer())'; echo err >&2", 30)
            assert result == ExecResult(0, "42\nerr\n", False, result.duration_s) and result.duration_s > 0
            assert (await sandbox.exec("exit 3", 10)).exit_code == 3
            assert (await sandbox.exec("false", 10)).exit_code == 1
            assert (await sandbox.exec("no-such-command-xyz", 10)).exit_code == 127
            assert (await sandbox.exec("kill -9 $$", 10)).exit_code == 137
            assert (await sandbox.exec("printf 'a\\0b'; printf '\\xff'", 10)).output == "a\0b\ufffd"
            assert (await sandbox.exec("pwd; echo $HOME; id -u", 10)).output.split()[:2] == [
                "/workspace",
                "/tmp",
            ]
            assert (await sandbox.exec("id -u", 10)).output.strip() != "0"
        finally:
            await sandbox.close()

    run(body())
    assert "return 41" in (env_dir / "pkg" / "mod.py").read_text()  # the environment itself is untouched
    assert backend.leftovers() == []


def test_output_is_bounded_head_and_tail(backend: Backend, env_dir: Path):
    async def body() -> ExecResult:
        sandbox = await started(backend, env_dir)
        try:
            return await sandbox.exec("seq 1 100000", 30)
        finally:
            await sandbox.close()

    result = run(body())
    assert len(result.output) < 4300 and result.output.startswith("1\n2\n") and result.output.endswith("100000\n")
    assert "bytes of output omitted" in result.output


def test_files_and_cwd(backend: Backend, env_dir: Path):
    big = "".join(f"line {i} é\n" for i in range(30_000))  # ~300 kB: more than one command-line argument holds

    async def body() -> None:
        sandbox = await started(backend, env_dir)
        try:
            await sandbox.write_file("notes/deep/a.txt", "héllo\n")
            assert await sandbox.read_file("/workspace/notes/deep/a.txt") == "héllo\n"
            assert await sandbox.read_file("notes/deep/../deep/a.txt") == "héllo\n"
            assert (await sandbox.exec("cat a.txt", 10, cwd="/workspace/notes/deep")).output == "héllo\n"
            assert (await sandbox.exec("pwd", 10, cwd="/workspace/notes")).output == "/workspace/notes\n"
            await sandbox.write_file("/workspace/pkg/mod.py", "def answer():\n    return 7\n")
            assert (await sandbox.exec("python -c 'import pkg.mod as m; print(m.answer())'", 30)).output == "7\n"
            await sandbox.write_file("big.txt", big)
            digest = (await sandbox.exec("md5sum big.txt", 10)).output.split()[0]
            assert digest == hashlib.md5(big.encode()).hexdigest()
            await sandbox.write_file("empty.txt", "")
            assert (await sandbox.exec("stat -c %s empty.txt", 10)).output.strip() == "0"
            with pytest.raises(FileNotFoundError):
                await sandbox.read_file("missing.txt")
            with pytest.raises(ValueError, match="only paths under /workspace"):
                await sandbox.write_file("/etc/x", "no")
            with pytest.raises(ValueError, match="only paths under /workspace"):
                await sandbox.write_file("../escape.txt", "no")
            state = await sandbox.exec("echo kept > state.txt", 10)
            assert state.exit_code == 0 and (await sandbox.exec("cat state.txt", 10)).output == "kept\n"
        finally:
            await sandbox.close()

    run(body())


def test_timeout_is_an_observation_and_kills_the_tree(backend: Backend, env_dir: Path):
    async def body() -> None:
        sandbox = await started(backend, env_dir)
        try:
            t0 = time.monotonic()
            result = await sandbox.exec("echo begun; (sleep 3; touch late) & sleep 30", timeout=1)
            assert result.timed_out and result.exit_code == 124 and time.monotonic() - t0 < 10
            assert result.output == "begun\n"
            await asyncio.sleep(4)  # the background child would have touched `late` by now
            after = await sandbox.exec("ls", 5)
            assert not after.timed_out and after.output.split() == ["pkg"]
            quick = await sandbox.exec("echo fine", timeout=5)
            assert quick == ExecResult(0, "fine\n", False, quick.duration_s)
        finally:
            await sandbox.close()

    run(body())


def test_no_process_outlives_its_command(backend: Backend, env_dir: Path):
    async def body() -> None:
        sandbox = await started(backend, env_dir)
        try:
            t0 = time.monotonic()
            result = await sandbox.exec("(sleep 2; echo late > late.txt) > /dev/null 2>&1 & echo started", 30)
            assert result.output == "started\n" and time.monotonic() - t0 < 2
            await asyncio.sleep(3)
            assert (await sandbox.exec("ls", 10)).output.split() == ["pkg"]
        finally:
            await sandbox.close()

    run(body())


def test_close_is_idempotent_and_kills_running_commands(backend: Backend, env_dir: Path):
    async def body() -> None:
        sandbox = await started(backend, env_dir)
        running = asyncio.ensure_future(sandbox.exec("sleep 60 & sleep 60 & wait", timeout=120))
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await asyncio.gather(sandbox.close(), sandbox.close())
        with pytest.raises(InfraError) as info:
            await running
        assert info.value.cause == "sandbox_died" and time.monotonic() - t0 < 15
        await sandbox.close()
        for call in (sandbox.exec("true", 5), sandbox.read_file("pkg/mod.py"), sandbox.write_file("x", "y")):
            with pytest.raises(InfraError) as after:
                await call
            assert after.value.cause == "sandbox_died"

    run(body())
    assert backend.leftovers() == []


def test_start_failures_are_infra_errors_and_leave_nothing(backend: Backend, env_dir: Path, tmp_path: Path):
    with pytest.raises(InfraError) as missing:
        run(backend.provider.start(tmp_path / "nope"))
    assert missing.value.cause == "image_missing"
    with pytest.raises(InfraError) as bad_patch:
        run(backend.provider.start(env_dir, "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"))
    assert bad_patch.value.cause == "start_failed" and "setup patch" in str(bad_patch.value)
    assert backend.leftovers() == []


@pytest.mark.parametrize("backend_name", backend_params())
def test_git_baseline_and_private_sandboxes(backend_name: str, tmp_path: Path, env_dir: Path):
    made = make_backend(backend_name, tmp_path, Limits(), git_baseline=True)

    async def body() -> None:
        a, b = await asyncio.gather(*(started(made, env_dir, PATCH) for _ in range(2)))
        try:
            await a.exec("echo 'x = 1' >> pkg/mod.py", 10)
            diff = (await a.exec("git diff", 10)).output
            assert "+x = 1" in diff and "return 41" not in diff  # the setup patch is part of the baseline
            await a.write_file("only-a.txt", "a")
            assert (await b.exec("ls; git status --short", 10)).output.split() == ["pkg"]
        finally:
            await asyncio.gather(a.close(), b.close())

    try:
        run(body())
        assert made.leftovers() == []
    finally:
        made.teardown()


def test_concurrent_starts(backend: Backend, env_dir: Path):
    async def body() -> list[str]:
        sandboxes = await asyncio.gather(*(started(backend, env_dir) for _ in range(6)))
        try:
            writes = [s.write_file("who.txt", str(i)) for i, s in enumerate(sandboxes)]
            await asyncio.gather(*writes)
            return [await s.read_file("who.txt") for s in sandboxes]
        finally:
            await asyncio.gather(*(s.close() for s in sandboxes))

    assert run(body()) == [str(i) for i in range(6)]
    assert backend.leftovers() == []
