"""`swerl compare RUN_A RUN_B`: the paired comparison printed from two MLflow eval runs' saved per-task results,
and the eval runs' shape (same metric names for every checkpoint, links to the checkpoint's run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from swerl.cli import main
from swerl.eval.metrics import pass_at_1
from swerl.eval.report import eval_metrics, log_eval_runs
from swerl.tracking import Tracker


def summary_of(per_task: dict[str, list[float | None]]) -> dict:
    s = pass_at_1(per_task, samples=200)
    return {
        **s.to_dict(),
        "pass@k": [{"k": 1, "value": s.value}],
        "by_stratum": [{"stratum": "a/a | <15 min fix", "pass@1": s.value}],
    }


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Tracker:
    return Tracker(f"sqlite:///{tmp_path_factory.mktemp('cmp')}/mlflow.db", "compare-test")


def log_runs(tracker: Tracker, per_task: dict[str, dict[str, list[float | None]]]) -> dict[str, str]:
    with tracker.run("evaluate", tags={"swerl.stage": "evaluate"}) as stage:
        results = {name: summary_of(tasks) for name, tasks in per_task.items()}
        links = {name: {"swerl.checkpoint.run_id": f"run-of-{name}"} for name in per_task}
        return log_eval_runs(
            tracker.client,
            stage.run_id,
            results,
            per_task,
            links,
            {"swerl.eval.subset": "file:///subset.json"},
            None,
            "# report\n",
        )


def test_eval_runs_share_metric_names_and_link_to_their_checkpoint(tracker: Tracker) -> None:
    per_task = {"base": {"t1": [0.0], "t2": [None]}, "sft": {"t1": [1.0], "t2": [1.0]}}
    ids = log_runs(tracker, per_task)
    runs = {name: tracker.client.get_run(run_id) for name, run_id in ids.items()}
    assert (
        set(runs["base"].data.metrics) == set(runs["sft"].data.metrics) == set(eval_metrics(summary_of({"x": [1.0]})))
    )
    assert runs["base"].data.metrics["tasks"] == 1 and runs["base"].data.metrics["missing"] == 1
    assert runs["sft"].data.metrics["pass_at_1"] == 1.0
    assert runs["sft"].data.tags["swerl.checkpoint.run_id"] == "run-of-sft"
    assert runs["sft"].data.tags["swerl.eval.checkpoint"] == "sft"
    assert runs["sft"].info.status == "FINISHED"
    assert "stratum/a/a _ lt15 min fix/pass_at_1" in runs["sft"].data.metrics


def test_swerl_compare_prints_a_significant_gain_and_a_null_result(
    tracker: Tracker, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    base = {f"t{i}": [float(rng.random() < 0.2)] for i in range(60)}
    sft = {t: [1.0] if v[0] == 1.0 or i % 2 == 0 else [0.0] for i, (t, v) in enumerate(base.items())}
    ids = log_runs(tracker, {"base": base, "sft": sft})
    code = main(["compare", ids["base"], ids["sft"], "--tracking-uri", tracker.uri, "--samples", "2000"])
    out = capsys.readouterr().out
    assert code == 0
    assert "over 60 common tasks" in out and "-> significant" in out, out
    assert f"base[{ids['base'][:8]}]: pass@1" in out and "(0 missing)" in out

    again = log_runs(tracker, {"base": base, "sft": {t: list(v) for t, v in base.items()}})
    assert main(["compare", again["base"], again["sft"], "--tracking-uri", tracker.uri]) == 0
    out = capsys.readouterr().out
    assert "difference +0.0000" in out and "not significant" in out and "p = 1" in out


def test_swerl_compare_refuses_a_run_that_is_not_an_eval_run(
    tracker: Tracker, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ids = log_runs(tracker, {"base": {"t": [1.0]}})
    with tracker.run("not-eval") as other:
        pass
    assert main(["compare", ids["base"], other.run_id, "--tracking-uri", tracker.uri]) == 2
    assert "is not a swerl eval run" in capsys.readouterr().err
    assert main(["compare", ids["base"], "0" * 32, "--tracking-uri", tracker.uri]) == 2
    assert "swerl compare:" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=tracker.uri)
    assert client.get_run(ids["base"]).data.tags["swerl.eval.subset"] == "file:///subset.json"


def test_eval_runs_carry_params_real_timestamps_and_their_dataset(tracker: Tracker) -> None:
    """Eval runs are shown with their settings (secret-looking ones dropped) and at the time they were logged,
    never at the epoch (MLflow's 1970), with the evaluated subset as their evaluation dataset input."""
    import time

    from swerl.tracking import dataset_input

    before = int(time.time() * 1000)
    with tracker.run("evaluate", tags={"swerl.stage": "evaluate"}) as stage:
        per_task: dict[str, dict[str, list[float | None]]] = {"base": {"t1": [1.0]}}
        dataset = dataset_input("eval_subset", "file:///store/subset.json", "ab" * 32, "evaluation")
        ids = log_eval_runs(
            tracker.client,
            stage.run_id,
            {"base": summary_of(per_task["base"])},
            per_task,
            {},
            {},
            None,
            "# r\n",
            params={"attempts": 2, "e2b": {"api_key": "sk-x"}},
            dataset=dataset,
        )
    run = tracker.client.get_run(ids["base"])
    assert run.data.params == {"attempts": "2", "checkpoint": "base"}
    assert run.data.tags["swerl.kind"] == "eval"
    history = tracker.client.get_metric_history(ids["base"], "pass_at_1")
    assert history and all(m.timestamp >= before for m in history)
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "eval_subset"
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "evaluation"
