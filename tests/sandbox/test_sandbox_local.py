"""The bubblewrap sandbox for real: exec, timeouts, files, close, isolation (network, env, file system)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swerl.errors import InfraError
from swerl.sandbox import ExecResult, LocalSandbox, LocalSandboxProvider, Sandbox, SandboxProvider
from swerl.sandbox.supervisor import SupervisedSandbox
from tests.sandbox_backends import local_leftovers
from tests.sandbox_helpers import local_provider


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
    return root


@pytest.fixture(params=["auto", "bubblewrap"])
def provider(tmp_path: Path, request: pytest.FixtureRequest) -> LocalSandboxProvider:
    """Both runtimes: auto is the supervisor where this process may mount (root), else bubblewrap."""
    return local_provider(
        sys.executable,
        max_processes=64,
        memory_mb=1024,
        root_dir=tmp_path / "sandboxes",
        runtime=request.param,
    )


def run(coro):
    return asyncio.run(coro)


def test_protocols(provider: LocalSandboxProvider):
    assert isinstance(provider, SandboxProvider)


def test_exec_files_and_setup_patch(provider: LocalSandboxProvider, env_dir: Path):
    patch = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"

    async def body() -> None:
        sandbox = await provider.start(env_dir, patch)
        assert isinstance(sandbox, Sandbox)
        try:
            result = await sandbox.exec("python -c 'from pkg.mod import answer; print(answer())'; echo err >&2", 30)
            assert result == ExecResult(0, "42\nerr\n", False, result.duration_s)
            assert (await sandbox.exec("exit 3", 10)).exit_code == 3
            await sandbox.write_file("notes/a.txt", "héllo\n")
            assert await sandbox.read_file("/workspace/notes/a.txt") == "héllo\n"
            assert (await sandbox.exec("cat a.txt", 10, cwd="/workspace/notes")).output == "héllo\n"
            with pytest.raises(FileNotFoundError):
                await sandbox.read_file("missing.txt")
            with pytest.raises(ValueError, match="only paths under /workspace"):
                await sandbox.write_file("/etc/x", "no")
        finally:
            await sandbox.close()
        if isinstance(sandbox, SupervisedSandbox):  # the tmpfs went with the init; the host's mount point is empty
            assert not Path(f"/proc/{sandbox.init_pid}").exists() and list(sandbox.root.iterdir()) == []
        else:
            assert not sandbox.root.exists()
        with pytest.raises(InfraError) as info:
            await sandbox.exec("true", 5)
        assert info.value.cause == "sandbox_died"

    run(body())
    assert "return 41" in (env_dir / "pkg" / "mod.py").read_text()  # the environment itself is untouched


def test_timeout_kills_the_process_tree(provider: LocalSandboxProvider, env_dir: Path):
    async def body() -> None:
        sandbox = await provider.start(env_dir)
        try:
            t0 = time.monotonic()
            result = await sandbox.exec("(sleep 30; touch late) & sleep 30", timeout=1)
            assert result.timed_out and result.exit_code == 124 and time.monotonic() - t0 < 10
            await asyncio.sleep(0.5)
            assert (await sandbox.exec("ls", 5)).output.split() == ["pkg"]
        finally:
            await sandbox.close()

    run(body())


def test_close_kills_running_commands(provider: LocalSandboxProvider, env_dir: Path):
    async def body() -> None:
        sandbox = await provider.start(env_dir)
        running = asyncio.ensure_future(sandbox.exec("sleep 60 & sleep 60 & wait", timeout=120))
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await sandbox.close()
        with pytest.raises(InfraError) as info:
            await running
        assert info.value.cause == "sandbox_died" and time.monotonic() - t0 < 10

    run(body())


def test_no_network_no_secrets_no_host_files(
    provider: LocalSandboxProvider, env_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    (tmp_path / "host-secret.txt").write_text("host only")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')"

    async def body() -> None:
        sandbox = await provider.start(env_dir)
        try:
            net = await sandbox.exec(f'python -c "{connect}"', 20)
            assert net.exit_code != 0 and "CONNECTED" not in net.output
            env = await sandbox.exec("env", 10)
            assert "very-secret-value" not in env.output and "AWS_SECRET_ACCESS_KEY" not in env.output
            assert (await sandbox.exec(f"cat {tmp_path / 'host-secret.txt'}", 10)).exit_code != 0
            assert (await sandbox.exec("ls -A /root", 10)).output.split() == [".pyenv"] or sys.prefix.startswith("/usr")
            assert (await sandbox.exec("cat /root/.bashrc /root/.ssh/id_rsa", 10)).exit_code != 0
            assert (await sandbox.exec("ls /work/main/runs", 10)).exit_code != 0
            for outside in ("/usr/evil", "/etc/evil", f"{sys.prefix}/evil"):
                assert (await sandbox.exec(f"touch {outside}", 10)).exit_code != 0, outside
            assert (await sandbox.exec("id -u", 10)).output.strip() != "0"
        finally:
            await sandbox.close()

    try:
        run(body())
    finally:
        listener.close()


def test_process_and_file_size_limits(tmp_path: Path, env_dir: Path):
    provider = local_provider(max_processes=16, file_size_mb=8, tmp_size_mb=4)

    async def body() -> None:
        sandbox = await provider.start(env_dir)
        try:
            forks = await sandbox.exec("for i in $(seq 40); do sleep 1 & done; wait", 30)
            assert "fork" in forks.output and "Resource temporarily unavailable" in forks.output
            big = await sandbox.exec("head -c 10000000 /dev/zero > big.bin", 10)
            assert big.exit_code != 0 and "File size limit exceeded" in big.output
            tmp = await sandbox.exec("head -c 6000000 /dev/zero > /tmp/x", 10)
            assert tmp.exit_code != 0 and "No space left" in tmp.output
        finally:
            await sandbox.close()

    run(body())


def test_missing_bwrap_is_a_clear_start_error(env_dir: Path):
    provider = local_provider(bwrap="bwrap-not-installed", runtime="bubblewrap")
    with pytest.raises(InfraError) as info:
        run(provider.start(env_dir))
    assert info.value.cause == "start_failed" and "install bubblewrap" in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor runtime needs root")
def test_the_supervisor_is_built_once_and_needs_a_c_compiler_for_it(
    tmp_path: Path, env_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # A real missing compiler (CC names no program) and an empty build cache; nothing in swerl is patched.
    cache = tmp_path / "cache"
    monkeypatch.setenv("SWERL_CACHE_DIR", str(cache))
    monkeypatch.setenv("CC", "cc-not-installed")
    strict = local_provider(root_dir=tmp_path / "strict", runtime="supervisor")
    with pytest.raises(InfraError) as info:
        run(strict.start(env_dir))
    assert info.value.cause == "start_failed" and "needs a C compiler" in str(info.value)
    assert "'cc-not-installed' was not found" in str(info.value)

    async def echo(provider: LocalSandboxProvider) -> Sandbox:
        sandbox = await provider.start(env_dir)
        try:
            assert (await sandbox.exec("echo ok", 10)).output == "ok\n"
        finally:
            await sandbox.close()
        return sandbox

    assert isinstance(run(echo(local_provider(root_dir=tmp_path / "auto"))), LocalSandbox)
    monkeypatch.setenv("CC", f"{shutil.which('cc')} -pipe")  # a compiler command with a flag of its own
    built = local_provider(root_dir=tmp_path / "built", runtime="supervisor")
    assert isinstance(run(echo(built)), SupervisedSandbox)
    built.close()
    [binary] = cache.iterdir()  # one build, named after the source's digest; the next provider reuses it
    again = local_provider(root_dir=tmp_path / "again", runtime="supervisor")
    monkeypatch.setenv("CC", "cc-not-installed")
    assert isinstance(run(echo(again)), SupervisedSandbox)
    again.close()
    assert list(cache.iterdir()) == [binary]
    binary.chmod(0o777)  # anyone could have replaced it: it is not run (as root)
    tampered = local_provider(root_dir=tmp_path / "tampered", runtime="supervisor")
    with pytest.raises(InfraError, match="refusing to run the sandbox supervisor .* writable by others"):
        run(tampered.start(env_dir))


@pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor runtime needs root")
def test_the_supervisor_refuses_what_its_messages_cannot_carry(tmp_path: Path, env_dir: Path):
    provider = local_provider(root_dir=tmp_path / "sandboxes", runtime="supervisor")

    async def body() -> None:
        with pytest.raises(ValueError, match="NUL byte"):
            await provider.start(env_dir, env={"A": "x\0y"})
        with pytest.raises(ValueError, match="hold no '='"):
            await provider.start(env_dir, env={"A=B": "x"})
        sandbox = await provider.start(env_dir, env={"SWERL_X": "a b=c"})
        try:
            assert (await sandbox.exec("echo $SWERL_X", 10)).output == "a b=c\n"
            # the policy's command: an error result, not a ValueError
            nul = await sandbox.exec("echo a\0b", 10)
            assert nul.exit_code != 0 and "NUL byte" in nul.output
            assert (await sandbox.exec("echo still", 10)).output == "still\n"  # the refusal left it working
        finally:
            await sandbox.close()

    run(body())
    provider.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor runtime needs root")
def test_the_supervisor_refuses_to_run_with_inheritable_capabilities(tmp_path: Path, env_dir: Path):
    # A real process with a non-empty inheritable set (setpriv): a command could keep what it inherits through exec.
    script = (
        "import asyncio, sys\n"
        "from swerl.errors import InfraError\n"
        "from swerl.config.sandbox import SandboxLimits\n"
        "from swerl.stages.common import sandbox_provider\n"
        f"p = sandbox_provider(SandboxLimits(workspace_dir={str(tmp_path / 'sandboxes')!r}, runtime='supervisor'))\n"
        "try:\n"
        f"    asyncio.run(p.start({str(env_dir)!r}))\n"
        "except InfraError as exc:\n"
        "    print(exc.cause, exc.message)\n"
        "p.close()\n"
    )
    done = subprocess.run(
        ["setpriv", "--inh-caps=+net_raw", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("start_failed sandbox set-up failed: swerl's inheritable capabilities are not empty")


def test_bad_environment_and_patch(provider: LocalSandboxProvider, env_dir: Path, tmp_path: Path):
    with pytest.raises(InfraError) as missing:
        run(provider.start(tmp_path / "nope"))
    assert missing.value.cause == "image_missing"
    with pytest.raises(InfraError) as bad_patch:
        run(provider.start(env_dir, "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"))
    assert bad_patch.value.cause == "start_failed" and "setup patch" in str(bad_patch.value)
    assert local_leftovers(provider, tmp_path / "sandboxes") == []  # a failed start leaves nothing behind


def test_output_is_bounded(tmp_path: Path, env_dir: Path):
    provider = local_provider(max_output_bytes=1000)

    async def body() -> ExecResult:
        sandbox = await provider.start(env_dir)
        try:
            return await sandbox.exec("seq 1 100000", 30)
        finally:
            await sandbox.close()

    result = run(body())
    assert len(result.output) < 1200 and result.output.startswith("1\n2\n") and result.output.endswith("100000\n")
    assert "bytes of output omitted" in result.output


def test_git_baseline(env_dir: Path):
    provider = local_provider(git_baseline=True)

    async def body() -> str:
        sandbox = await provider.start(env_dir)
        try:
            await sandbox.exec("echo 'x = 1' >> pkg/mod.py", 10)
            return (await sandbox.exec("git diff", 10)).output
        finally:
            await sandbox.close()

    assert "+x = 1" in run(body())


def test_a_command_cannot_end_its_sandbox(provider: LocalSandboxProvider, env_dir: Path):
    """Signals to pid 1 (the supervisor's init, or bubblewrap's) and a kill of everything it may signal end the
    command, never the sandbox: a policy must not be able to turn its own failure into an infrastructure error.
    Nor can it read pid 1's environment or memory."""

    async def body() -> None:
        sandbox = await provider.start(env_dir)
        try:
            probe = await sandbox.exec(
                "cat /proc/1/environ >/dev/null 2>&1 && echo environ-readable; "
                "head -c1 /proc/1/mem >/dev/null 2>&1 && echo mem-readable; "
                "for s in INT TERM HUP QUIT USR1 USR2 CHLD PIPE STOP KILL; do kill -$s 1 2>/dev/null; done; "
                "echo signalled",
                10,
            )
            assert probe.output.split() == ["signalled"], probe.output
            everything = await sandbox.exec("sleep 30 & kill -KILL -1; wait; echo survived", 10)
            assert everything.output.endswith("survived\n") and not everything.timed_out  # kill(-1) spares the caller
            assert "Killed" in everything.output  # ... and took the sleep
            after = await sandbox.exec("echo alive; ls", 10)
            assert (after.exit_code, after.output.split()) == (0, ["alive", "pkg"])
        finally:
            await sandbox.close()

    run(body())


def test_sandboxes_are_private_to_each_other(provider: LocalSandboxProvider, env_dir: Path):
    async def body() -> None:
        a, b = await provider.start(env_dir), await provider.start(env_dir)
        try:
            assert isinstance(a, LocalSandbox | SupervisedSandbox) and isinstance(b, LocalSandbox | SupervisedSandbox)
            assert a.uid != b.uid
            await a.write_file("only-a.txt", "a")
            assert (await b.exec("ls", 10)).output.split() == ["pkg"]
        finally:
            await a.close()
            await b.close()

    run(body())


def test_interpreter_under_tmp_is_visible(tmp_path: Path, env_dir: Path):
    """A venv under /tmp (CI clones live there) must not be hidden by the sandbox's private /tmp."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp", prefix="swerl-venv-") as venv_dir:
        # Sandboxed commands run as an unprivileged uid: the venv must be readable by others.
        Path(venv_dir).chmod(0o755)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv_dir], check=True)
        venv_python = str(Path(venv_dir) / "bin" / "python")
        provider = local_provider(venv_python, max_processes=64, root_dir=tmp_path / "sandboxes")

        async def body() -> str:
            sandbox = await provider.start(env_dir)
            try:
                result = await sandbox.exec("python -c 'import sys; print(sys.prefix)'; ls /tmp | wc -l", 30)
                assert result.exit_code == 0, result.output
                return result.output
            finally:
                await sandbox.close()

        prefix, tmp_entries = run(body()).split()
        assert prefix == venv_dir
        assert tmp_entries == "1"  # the private /tmp holds only the mount point of the venv's ancestor


def _host_mounts_under(parent: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [line for line in mounts if f" {parent}" in line]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
@pytest.mark.parametrize(
    ("quota", "runtime"),
    [
        ("auto", "bubblewrap"),
        ("tmpfs", "bubblewrap"),
        ("none", "bubblewrap"),
        ("auto", "auto"),
        ("tmpfs", "auto"),
    ],
)
def test_workspace_quota(tmp_path: Path, env_dir: Path, quota: str, runtime: str):
    """auto/tmpfs (as root): each sandbox's workspace is a tmpfs of workspace_mb in a mount namespace held by a
    process of its own (bubblewrap: a holder; the supervisor: the sandbox's init), never a host mount, gone with
    that process on close; none: a plain directory."""
    root = tmp_path / "sandboxes"
    provider = local_provider(memory_mb=1024, root_dir=root, workspace_mb=16, workspace_quota=quota, runtime=runtime)

    async def body() -> None:
        sandbox = await provider.start(env_dir)
        holder = sandbox.holder
        holder_pid = sandbox.init_pid if isinstance(sandbox, SupervisedSandbox) else holder and holder.proc.pid
        try:
            assert isinstance(sandbox, SupervisedSandbox) == (runtime == "auto")
            assert (holder_pid is None) == (quota == "none")
            assert _host_mounts_under(root) == []  # the host's mount table does not grow
            fill = await sandbox.exec("head -c 24M /dev/zero > big; echo status=$?; du -sm big", 60)
            used_mb = int(fill.output.split()[-2])
            if quota == "none":
                assert "status=0" in fill.output and used_mb == 24
                assert (sandbox.workspace / "big").stat().st_size == 24 << 20
            else:
                assert "status=1" in fill.output and "No space left" in fill.output and used_mb <= 16
                assert not (sandbox.root / "workspace" / "big").exists()  # not on the host's disk
                assert (sandbox.workspace / "big").exists()  # the host reaches it through the holder
            assert (await sandbox.exec("rm big && cat pkg/mod.py", 10)).output.startswith("def answer")
        finally:
            await sandbox.close()
        assert local_leftovers(provider, root) == []
        if holder is not None:
            assert holder.proc.returncode is not None
        if holder_pid is not None:
            assert not Path(f"/proc/{holder_pid}").exists()
        assert provider.limits()["workspace_mb"] == (0 if quota == "none" else 16)

    run(body())


def test_workspace_quota_is_checked():
    with pytest.raises(ValueError, match="workspace_quota must be auto, tmpfs or none"):
        local_provider(workspace_quota="quota")


_HOLD_A_SANDBOX = """
import asyncio, sys
from pathlib import Path
from swerl.config.sandbox import SandboxLimits
from swerl.stages.common import sandbox_provider

async def main():
    provider = sandbox_provider(SandboxLimits(workspace_dir=sys.argv[1], workspace_quota=sys.argv[3]))
    sandbox = await provider.start(Path(sys.argv[2]))
    print(sandbox.root, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.parametrize("quota", ["auto", "none"])
def test_a_dead_runs_sandbox_directories_are_swept(tmp_path: Path, env_dir: Path, quota: str):
    """A run SIGKILLed with a sandbox open leaves its directory (whole workspace with quota none, an empty
    directory with the tmpfs); the next provider's first start removes it, and leaves alone a live process's
    directory and one whose name says no owner."""
    import subprocess

    from swerl.sandbox.process import owner_tag

    root = tmp_path / "sandboxes"
    dead = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_SANDBOX, str(root), str(env_dir), quota],
        stdout=subprocess.PIPE,
        text=True,
    )
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        assert dead.stdout is not None
        dead_dir = Path(dead.stdout.readline().strip())
        assert dead_dir.parent == root.resolve() and dead_dir.name.startswith(f"swerl-sbx-{owner_tag(dead.pid)}-")
        dead.kill()
        dead.wait(10)
        assert dead_dir.is_dir()  # what a crash leaves
        assert (dead_dir / "workspace" / "pkg" / "mod.py").exists() == (quota == "none")
        live_dir = root / f"swerl-sbx-{owner_tag(live.pid)}-abc123"
        unowned_dir = root / "swerl-sbx-abc123"
        for directory in (live_dir, unowned_dir):
            (directory / "workspace").mkdir(parents=True)
        recycled = root / f"swerl-sbx-{live.pid}-1-abc123"  # the live pid with another start time: dead

        recycled.mkdir()
        provider = local_provider(root_dir=root, workspace_quota=quota)

        async def body() -> None:
            sandbox = await provider.start(env_dir)
            await sandbox.close()

        run(body())
        assert local_leftovers(provider, root) == sorted([live_dir.name, unowned_dir.name])
    finally:
        for process in (dead, live):
            process.kill()
            process.wait(10)
