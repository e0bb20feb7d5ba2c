"""The `swerl` command line: version, help texts, the environment `swerl up` writes, `compare`'s store, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from swerl.cli import COMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[2]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "swerl 0.1.0"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_a_description_and_examples(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]  # type: ignore[union-attr]
    text = sub.format_help()
    assert COMMANDS[command][1].split(".")[0][:40] in " ".join(text.split())
    examples = text.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.startswith("  ") for line in examples)
    assert any(line.strip().startswith(f"swerl {command}") for line in examples), examples


def test_services_env_overrides_the_file_and_set_overrides_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWERL_TRACKING_URI", "http://127.0.0.1:5999")
    monkeypatch.setenv("SWERL_STORAGE_ROOT", "s3://swerl/store")
    monkeypatch.setenv("SWERL_S3_ENDPOINT_URL", "http://127.0.0.1:8399")
    assert main(["config", str(REPO / "configs/local.yaml"), "--set", "storage.root=s3://swerl/other"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["tracking"]["uri"] == "http://127.0.0.1:5999"
    assert cfg["storage"] == {
        **cfg["storage"],
        "root": "s3://swerl/other",
        "s3_endpoint_url": "http://127.0.0.1:8399",
    }
    monkeypatch.setenv("SWERL_STORAGE_ROOT", "ftp://nope")  # bad input from the environment names the key
    assert main(["config", str(REPO / "configs/local.yaml")]) == 2
    assert "storage.root" in capsys.readouterr().err


def test_compare_never_creates_a_store_and_takes_the_config_as_a_positional(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWERL_TRACKING_URI", raising=False)
    config = tmp_path / "c.yaml"
    config.write_text("tracking: {uri: 'sqlite:///runs/mlflow.db'}\n")
    assert main(["compare", "a" * 32, "b" * 32, str(config)]) == 2
    err = capsys.readouterr().err
    assert f"no MLflow store at {tmp_path / 'runs/mlflow.db'}" in err and str(config) in err
    assert not (tmp_path / "runs").exists()  # nothing created to read from
    monkeypatch.setenv("SWERL_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere.db")  # the environment wins
    assert main(["compare", "a" * 32, "b" * 32, str(config)]) == 2
    assert "SWERL_TRACKING_URI" in capsys.readouterr().err and not (tmp_path / "elsewhere.db").exists()
    # An existing store is read: the run is then what is missing
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/elsewhere.db").search_experiments()  # creates it
    assert main(["compare", "a" * 32, "b" * 32]) == 2
    assert "no MLflow store" not in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_during_a_run_prints_one_line_saying_how_to_resume(prefect_server: str, tmp_path: Path) -> None:
    """A real `swerl run` in its own process against the session's Prefect server, interrupted in its curate stage;
    the curate stage is a literal one that waits (curation has its own tests), the rest is real."""
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "ctrlc"},
                "storage": {"root": f"file://{tmp_path}/store"},
                "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
            }
        )
    )
    script = (
        "import sys, time, logging, swerl.stages.curate as c\n"
        "def slow(cfg, ctx):\n"
        "    logging.getLogger('swerl.stages.curate').warning('fake curate waiting')\n"
        "    time.sleep(600)\n"
        "c.run_curate = slow\n"
        "from swerl.cli import main\n"
        f"sys.exit(main(['run', {str(config)!r}, '--ignore-doctor']))\n"
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out_lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 300
        for line in proc.stderr:  # wait until the curate stage runs
            out_lines.append(line)
            if "fake curate waiting" in line:
                break
            assert time.monotonic() < deadline, "".join(out_lines)[-3000:]
        else:
            pytest.fail("swerl run ended before curate: " + "".join(out_lines)[-3000:])
        os.kill(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    after = [line for line in rest.splitlines() if line.strip()]
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest, rest
    assert len(after) == 1, rest
    assert (
        after[0] == f"swerl run: interrupted; every finished stage is kept; the same command resumes from the "
        f"stage that was running: swerl run {config} --ignore-doctor"
    )


def test_serve_without_a_prefect_api_refuses_quickly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deployments on a throw-away ephemeral API would run nothing: `swerl serve` says so and stops."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    t0 = time.monotonic()
    for extra in ([], ["--foreground"]):
        assert main(["serve", str(REPO / "configs/local.yaml"), *extra]) == 2
        err = capsys.readouterr().err
        assert "PREFECT_API_URL is not set" in err and "swerl up" in err
    assert time.monotonic() - t0 < 60  # it never starts a server (~70 s to stop before)
