"""The e2b backend against a FAKE of the e2b SDK (tests/doubles.py): the cloud cannot be reached from here.

The fake is only the SDK boundary (AsyncSandbox.create / commands.run / files / kill with the SDK's shapes and
exception classes); swerl.sandbox.e2b, the tar upload, the setup patch, git and the commands themselves run for
real (commands under bubblewrap). A live test against e2b runs only when E2B_API_KEY is set.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("e2b")

from swerl.errors import InfraError  # noqa: E402
from swerl.sandbox.base import Sandbox, SandboxProvider  # noqa: E402
from swerl.sandbox.e2b import E2BSandboxProvider  # noqa: E402
from tests.doubles import FakeAsyncSandbox  # noqa: E402
from tests.sandbox_helpers import e2b_provider, pool_around  # noqa: E402

PATCH = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value-123",
    "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKE",
    "E2B_API_KEY": "e2b_live_key_value_456",
    "HF_TOKEN": "hf_token_value_789",
}

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the fake VM runs commands under bwrap")


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    return root


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> type[FakeAsyncSandbox]:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    FakeAsyncSandbox.reset(tmp_path / "vms")
    (tmp_path / "vms").mkdir()
    return FakeAsyncSandbox


def provider(fake: type[FakeAsyncSandbox], **kw: object) -> E2BSandboxProvider:
    # start_timeout_s: what these tests ran with before (E2BSandboxProvider's old default; the config's is 60)
    return e2b_provider(sdk=fake, exec_grace_s=2.0, start_timeout_s=120.0, **kw)


def test_exec_files_patch_and_git_baseline(fake: type[FakeAsyncSandbox], env_dir: Path) -> None:
    async def body() -> None:
        prov = provider(fake, git_baseline=True)
        assert isinstance(prov, SandboxProvider)
        sandbox = await prov.start(env_dir, PATCH)
        assert isinstance(sandbox, Sandbox)
        try:
            result = await sandbox.exec("python3 -c 'from pkg.mod import answer; print(answer())'; echo err >&2", 30)
            assert (result.exit_code, result.output, result.timed_out) == (0, "42\nerr\n", False)
            assert (await sandbox.exec("exit 3", 10)).exit_code == 3
            assert (await sandbox.exec("ls pkg", 10)).output == "mod.py\n"  # caches are not uploaded
            assert (await sandbox.exec("git status --porcelain", 10)).output == ""  # baseline includes the patch
            await sandbox.write_file("notes/a.txt", "héllo\n")
            assert await sandbox.read_file("/workspace/notes/a.txt") == "héllo\n"
            assert (await sandbox.exec("cat a.txt", 10, cwd="/workspace/notes")).output == "héllo\n"
            with pytest.raises(FileNotFoundError):
                await sandbox.read_file("missing.txt")
            with pytest.raises(ValueError, match="only paths under /workspace"):
                await sandbox.write_file("/etc/x", "no")
        finally:
            await sandbox.close()
        vm = fake.created[0]
        assert not vm.alive and not vm.root.exists()
        assert fake.create_calls[0]["allow_internet_access"] is False
        with pytest.raises(InfraError) as info:
            await sandbox.exec("true", 5)
        assert info.value.cause == "sandbox_died"
        await sandbox.close()  # idempotent

    asyncio.run(body())


def test_timeout_is_an_observation_and_hung_exec_is_infra(fake: type[FakeAsyncSandbox], env_dir: Path) -> None:
    async def body() -> None:
        sandbox = await provider(fake).start(env_dir)
        try:
            result = await sandbox.exec("echo started; sleep 30", 0.5)
            assert result.timed_out and result.exit_code == 124
            assert "started" in result.output and result.duration_s < 5
            assert (await sandbox.exec("echo alive", 10)).output == "alive\n"
            fake.hang_commands_matching = "HANG"
            with pytest.raises(InfraError) as info:
                await sandbox.exec("echo HANG", 0.2)
            assert info.value.cause == "exec_unresponsive"
        finally:
            await sandbox.close()

    asyncio.run(body())


def test_vm_death_and_create_failures_map_to_causes(fake: type[FakeAsyncSandbox], env_dir: Path) -> None:
    async def body() -> None:
        sandbox = await provider(fake).start(env_dir)
        fake.created[0].die()
        for call in (sandbox.exec("true", 5), sandbox.read_file("pkg/mod.py"), sandbox.write_file("a", "b")):
            with pytest.raises(InfraError) as info:
                await call
            assert info.value.cause == "sandbox_died"
        await sandbox.close()

        with pytest.raises(InfraError) as info:
            await provider(fake, template="no-such-template").start(env_dir)
        assert info.value.cause == "image_missing"
        fake.rate_limited_creates = 1
        with pytest.raises(InfraError) as info:
            await provider(fake).start(env_dir)
        assert info.value.cause == "quota"
        with pytest.raises(InfraError) as info:
            await provider(fake).start(env_dir, "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n")
        assert info.value.cause == "start_failed"
        assert not fake.created[-1].root.exists()  # a failed setup kills its VM

        # The pool retries a quota refusal and succeeds; the counters say what happened.
        fake.rate_limited_creates = 1
        async with pool_around(provider(fake), retry_backoff_s=0.01) as pool:
            pooled = await pool.start(env_dir)
            assert (await pooled.exec("cat pkg/mod.py", 5)).exit_code == 0
            await pooled.close()
            assert pool.counters["start_error.quota"] == 1 and pool.counters["start_retry.quota"] == 1
            assert pool.counters["start.cold"] == 1

    asyncio.run(body())


def test_host_secrets_never_reach_the_vm(fake: type[FakeAsyncSandbox], env_dir: Path) -> None:
    async def body() -> None:
        sandbox = await provider(fake).start(env_dir)
        try:
            shown = (await sandbox.exec("env", 10)).output
        finally:
            await sandbox.close()
        for value in SECRETS.values():
            assert value not in shown
        call = fake.create_calls[0]
        assert call["api_key"] == SECRETS["E2B_API_KEY"]  # to the SDK connection only
        sent = [call["envs"]] + [c[1]["envs"] for vm in fake.created for c in vm.calls if c[0] == "commands.run"]
        for envs in sent:
            assert not set(envs) & set(SECRETS)
            assert not set(envs.values()) & set(SECRETS.values())

    asyncio.run(body())


def test_missing_api_key_is_start_failed(fake: type[FakeAsyncSandbox], env_dir: Path, monkeypatch) -> None:
    monkeypatch.delenv("E2B_API_KEY")
    with pytest.raises(InfraError) as info:
        asyncio.run(provider(fake).start(env_dir))
    assert info.value.cause == "start_failed" and "E2B_API_KEY" in str(info.value)
    assert fake.create_calls == []


@pytest.mark.skipif(not os.environ.get("E2B_API_KEY"), reason="live e2b test: needs E2B_API_KEY")
def test_live_e2b(env_dir: Path) -> None:
    async def body() -> None:
        live = e2b_provider(template=os.environ.get("SWERL_E2B_TEMPLATE", "swerl-base"), start_timeout_s=120.0)
        sandbox = await live.start(env_dir, PATCH)
        try:
            result = await sandbox.exec("python -c 'from pkg.mod import answer; print(answer())'", 60)
            assert result.output.strip() == "42"
            assert (await sandbox.exec("sleep 30", 1)).timed_out
        finally:
            await sandbox.close()

    asyncio.run(body())


def test_an_image_task_starts_from_the_template_made_from_its_image(
    fake: type[FakeAsyncSandbox], env_dir: Path, tmp_path: Path
) -> None:
    """FAKE at the cloud edge: the template's file system is the fake VM's (its /opt/swerl/env bound from a host
    directory, as write_e2b_template's layer leaves it); what is real is swerl's side: the template chosen by
    image, the workspace filled from it, the bug applied, the baseline, the PATH, the error without a template."""
    from swerl.sandbox.base import ImageEnvironment
    from swerl.sandbox.images import write_e2b_template

    image = ImageEnvironment("swebench/sweb.eval.x86_64.demo_1776_pkg-1:latest", path_prepend=("/opt/venv/bin",))
    name = write_e2b_template(image.image, "/testbed", tmp_path / "template")
    dockerfile = (tmp_path / "template" / "e2b.Dockerfile").read_text()
    assert dockerfile.startswith(f"FROM {image.image}\n") and "ln -s /workspace" in dockerfile
    assert f'template_name = "{name}"' in (tmp_path / "template" / "e2b.toml").read_text()

    async def body() -> None:
        with pytest.raises(InfraError) as info:
            await provider(fake).start(image)
        assert info.value.cause == "image_missing" and "e2b-template" in str(info.value)
        fake.image_templates[name] = env_dir
        prov = provider(fake, git_baseline=True, image_templates={image.image: name})
        sandbox = await prov.start(image, PATCH)
        try:
            assert fake.create_calls[-1]["template"] == name
            result = await sandbox.exec("python3 -c 'from pkg.mod import answer; print(answer())'", 30)
            assert result.output == "42\n"  # the template's repository, with the setup patch applied
            assert (await sandbox.exec("git log --format=%s | cat; echo $PATH", 10)).output.startswith(
                "start\n/opt/venv/bin:"
            )
        finally:
            await sandbox.close()

    asyncio.run(body())
