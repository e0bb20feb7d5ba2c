"""swebench's own harness (`run_evaluation`, unchanged but for network "none") referees swerl's grader.

Real parts throughout: toolz instance images built from its PyPI sdist with synthesized bugs (pytest; tests/
swebench_instances.py) and Django instance images from its sdist with hand-written bugs (Django's own runner;
swerl/data/django_tasks.py), swebench 5.0.2's run_evaluation in a process of its own, swerl's grader in Docker
sandboxes, `swerl crosscheck` as a user runs it. Each instance is graded on its reference fix (gold), the empty
patch, a wrong patch (toolz: one that applies and fixes nothing; Django: a plausible fix that resolves nothing, or
only part), and the bug applied again (swerl: the patch does not apply; swebench: its patch chain finds it "already
applied" and runs the tests on the bug): both graders must say the same of every one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from swerl.cli import main as swerl_main
from swerl.data.diffs import reverse_patch
from swerl.data.django_tasks import build_django_rows
from swerl.grading.crosscheck import AGREE, DISAGREE
from swerl.grading.swebench_referee import force_network_none
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.sandbox.images import BASE_IMAGE
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider
from tests.swebench_instances import Instance, new_file_patch, toolz_instances

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.network]

WRONG = new_file_patch("crosscheck_wrong.py", "WRONG = True\n")
"""A patch that applies to any instance and fixes nothing."""


@pytest.fixture(scope="module")
def provider() -> DockerSandboxProvider:
    if reason := docker_unavailable():
        pytest.skip(reason)
    return docker_provider(git_baseline=True, memory_mb=1024, start_timeout_s=120)


@pytest.fixture(scope="module")
def instances(provider: DockerSandboxProvider, tmp_path_factory: pytest.TempPathFactory) -> list[Instance]:
    return toolz_instances(provider, tmp_path_factory.mktemp("toolz"), [7101, 7102])


@pytest.fixture(scope="module")
def django(provider: DockerSandboxProvider, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """swerl/data/django_tasks.py's rows (images built, or reused when present), each with its `wrong_patch`."""
    return build_django_rows(tmp_path_factory.mktemp("django"))


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_swebench_and_swerl_agree_on_gold_empty_and_wrong_patches(
    instances: list[Instance], django: list[dict[str, Any]], tmp_path: Path
) -> None:
    rows = [i.row for i in instances] + [{k: v for k, v in r.items() if k != "wrong_patch"} for r in django]
    wrong = {i.task.instance_id: WRONG for i in instances} | {r["instance_id"]: r["wrong_patch"] for r in django}
    predictions = write_jsonl(
        tmp_path / "predictions.jsonl",
        [
            {"instance_id": row["instance_id"], "model_patch": patch, "model_name_or_path": label}
            for row in rows
            for label, patch in (("wrong", wrong[row["instance_id"]]), ("bug_again", reverse_patch(row["patch"])))
        ],
    )
    out = tmp_path / "crosscheck"
    # Django's repository needs a larger workspace than configs/local.yaml's micro repositories.
    code = swerl_main(
        [
            "crosscheck",
            "configs/local.yaml",
            "--tasks",
            str(write_jsonl(tmp_path / "rows.jsonl", rows)),
            "--predictions",
            str(predictions),
            "--gold",
            "--empty",
            "--out",
            str(out),
            "--timeout",
            "300",
            "--set",
            "agent.sandbox.workspace_mb=1024",
            "--set",
            "agent.sandbox.memory_mb=2048",
        ]
    )
    report = json.loads((out / "crosscheck.json").read_text())
    print((out / "crosscheck.md").read_text())
    assert code == 0, report
    assert report["networks"] == ["none"]  # every container swebench's harness created had no network
    verdicts = {(c["instance_id"], c["label"]): c for c in report["comparisons"]}
    expected = {"gold": True, "empty": False, "wrong": False, "bug_again": False}
    assert set(verdicts) == {(row["instance_id"], label) for row in rows for label in expected}
    assert report["instances"] == 4
    for (_, label), c in verdicts.items():
        resolved = expected[label]
        assert c["outcome"] == AGREE, c
        assert (c["swerl"]["resolved"], c["swebench"]["resolved"]) == (resolved, resolved), c
    assert {verdicts[(row["instance_id"], "bug_again")]["swerl"]["status"] for row in rows} == {"PATCH_APPLY_FAILED"}
    # swebench's own runs of the empty patches happened (its no-patch mode): their test commands failed
    empty_logs = sorted(out.rglob("empty/*/test_output.txt"))
    assert len(empty_logs) == 4
    assert all(re.search(r">>>>> Test Exit Code: [1-9]", log.read_text()) for log in empty_logs)


def test_a_recorded_verdict_swebench_disputes_fails_the_crosscheck(instances: list[Instance], tmp_path: Path) -> None:
    """An evaluate stage's episode file whose grade says an empty patch resolved the task: both graders say it
    did not, so the crosscheck reports a disagreement and exits 1."""
    task = instances[0].task
    rows = write_jsonl(tmp_path / "rows.jsonl", [instances[0].row])
    episodes = write_jsonl(
        tmp_path / "episodes_sft.jsonl",
        [
            {"task_id": task.instance_id, "attempt": 0, "status": "resolved", "reward": 1.0, "patch": ""},
        ],
    )
    out = tmp_path / "crosscheck"
    code = swerl_main(
        [
            "crosscheck",
            "configs/local.yaml",
            "--tasks",
            str(rows),
            "--predictions",
            str(episodes),
            "--out",
            str(out),
            "--timeout",
            "300",
        ]
    )
    report = json.loads((out / "crosscheck.json").read_text())
    assert code == 1
    (only,) = report["comparisons"]
    assert only["label"] == "sft/attempt-0" and only["recorded"] is True
    assert only["swerl"]["resolved"] is False and only["swebench"]["resolved"] is False
    assert only["outcome"] == DISAGREE


def test_the_referee_creates_containers_on_network_none_only() -> None:
    """The one change to swebench: docker-py's create gets network_mode "none"; another network is refused."""
    if reason := docker_unavailable():
        pytest.skip(reason)
    import docker

    force_network_none()
    client = docker.from_env()
    container = client.containers.create(BASE_IMAGE, "true")
    try:
        assert container.attrs["HostConfig"]["NetworkMode"] == "none"
    finally:
        container.remove(force=True)
    with pytest.raises(RuntimeError, match="network 'none' only"):
        client.containers.create(BASE_IMAGE, "true", network_mode="bridge")
    client.close()
