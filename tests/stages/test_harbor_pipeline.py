"""Harbor tasks as a curate source (`curate.harbor`), and the stages after it on them.

Two hand-made Harbor tasks (tests/data/test_harbor.py's calc task): one whose solution/solve.sh fixes the bug, one whose
solve.sh makes a wrong edit, so that its verifier gives the reference patch 0 and curate drops it. The kept task's
repository also holds a visible self-test printing pytest's summary line, the test command the oracle retests with
(a Harbor verifier is hidden from the agent, and the image has no pytest).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swerl.config.data import CurateConfig
from swerl.data.harbor import HarborFormatError, load_harbor_task
from swerl.stages.curate import content_key
from swerl.stages.curate_harbor import harbor_eval_keys
from swerl.stages.runner import stage_key
from tests.data.test_harbor import write_harbor_task

SELFTEST = 'import calc\nprint("1 passed" if calc.add(2, 3) == 5 else "1 failed")\n'
WRONG_SOLVE = "#!/bin/bash\nset -e\ncd /app\nsed -i 's/a - b/a * b/' calc.py\n"


def harbor_tasks(root: Path) -> Path:
    """root/calc-add (solvable) and root/calc-wrong (solve.sh does not fix it)."""
    good = write_harbor_task(root / "calc-add")
    (good / "environment/repo/selftest.py").write_text(SELFTEST)
    bad = write_harbor_task(root / "calc-wrong")
    (bad / "environment/repo/selftest.py").write_text(SELFTEST)
    (bad / "solution/solve.sh").write_text(WRONG_SOLVE)
    return root


def test_harbor_entries_name_the_path_at_fault(tmp_path: Path):
    for entry, message in [
        (tmp_path / "nowhere", "no such directory"),
        (tmp_path, "neither a Harbor task"),
    ]:
        with pytest.raises(HarborFormatError, match=message) as info:
            content_key(CurateConfig(repos=[], harbor=[str(entry)]))
        assert str(entry) in str(info.value)


def test_the_stage_key_covers_the_task_directories(tmp_path: Path):
    root = harbor_tasks(tmp_path / "harbor")
    cfg = CurateConfig(repos=[], harbor=[str(root)])
    key = stage_key("curate", cfg, [], 0, content_key(cfg))
    assert stage_key("curate", cfg, [], 0, content_key(cfg)) == key
    seen = {key}
    for rel, text in [
        ("calc-add/tests/test.sh", "#!/bin/bash\nexit 1\n"),
        ("calc-wrong/environment/Dockerfile", "FROM swerl-base:bookworm\nWORKDIR /srv\n"),
        ("calc-add/solution/solve.sh", "#!/bin/bash\ntrue\n"),
    ]:
        (root / rel).write_text(text)
        seen.add(stage_key("curate", cfg, [], 0, content_key(cfg)))
    assert len(seen) == 4
    # one task directory alone is an entry too
    assert content_key(CurateConfig(repos=[], harbor=[str(root / "calc-add")])) != content_key(cfg)


def test_harbor_eval_keys(tmp_path: Path):
    _, harbor = load_harbor_task(write_harbor_task(tmp_path / "Calc-Add"))
    assert harbor_eval_keys(harbor) == {"harbor/calc-add", "calc-add", "harbor-category:programming"}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_curate_keeps_the_gold_checked_task_and_the_stages_run_on_it(tmp_path: Path):
    """curate.harbor -> train.parquet holds the solvable task with solve.sh's diff as its patch, the report counts
    the other as gold_unresolved -> oracle traces replay that diff through the agent's tools (graded 1 by the
    verifier) -> SFT -> curate again holding the task out by its category -> evaluate, every attempt graded by the
    task's verifier."""
    from swerl.config.agent import AgentConfig
    from swerl.config.data import TracesConfig
    from swerl.config.engine import EngineConfig
    from swerl.config.evaluate import EvaluateConfig
    from swerl.config.sandbox import SandboxLimits
    from swerl.config.train import SFTConfig, TinyModelConfig
    from swerl.data.taskio import tasks_from_parquet
    from swerl.stages.curate import run_curate
    from swerl.stages.evaluate import EvaluateStage, run_evaluate
    from swerl.stages.sft import SFTStage, run_sft
    from swerl.stages.traces import TracesStage, run_traces
    from swerl.storage import Store
    from swerl.tracking import Tracker
    from tests.sandbox_backends import docker_unavailable
    from tests.stage_helpers import Env

    if reason := docker_unavailable():
        pytest.skip(reason)
    root = harbor_tasks(tmp_path / "harbor")
    limits = SandboxLimits(backend="docker", memory_mb=1024, start_timeout_s=120, timeout_s=60)
    agent = AgentConfig(
        max_turns=3,
        max_trajectory_tokens=1024,
        max_new_tokens_per_turn=16,
        command_timeout_s=30,
        test_timeout_s=60,
        episode_timeout_s=120,
        infra_retries=0,
        sandbox=limits,
    )
    engine = EngineConfig.model_validate({"max_batch_size": 2, "max_context_tokens": 1024, "local": {"threads": 1}})
    tiny = TinyModelConfig(
        vocab_size=500, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, ffn_size=64, max_positions=4096
    )
    env = Env(Store(f"file://{tmp_path}/store"), Tracker(f"sqlite:///{tmp_path}/mlflow.db", "harbor-pipeline"))

    cfg = CurateConfig(repos=[], harbor=[str(root)], sandbox=limits)
    curate = env.run("curate", run_curate, cfg).manifest
    train = tasks_from_parquet(env.artifact(curate, "train.parquet"))
    assert [t.instance_id for t in train] == ["harbor__calc-add"] and train[0].split == "train"
    assert "-    return a - b\n+    return a + b" in train[0].patch and train[0].verifier == f"harbor://{root}/calc-add"
    assert tasks_from_parquet(env.artifact(curate, "eval.parquet")) == []
    report = env.json(curate, "curate_report.json")["harbor"]
    assert (report["tasks"], report["kept"], report["rejections"]) == (2, 1, {"gold_unresolved": 1}), report
    assert "RESOLVED_NO" in report["rejected"]["calc-wrong"]
    assert report["limits"]["calc-add"]["agent_timeout_s"] == 120.0

    traces = env.run(
        "traces",
        run_traces,
        TracesStage(traces=TracesConfig(test_command="python3 selftest.py", view_whole_file_lines=40), agent=agent),
        [curate],
    ).manifest
    traced = env.json(traces, "traces_report.json")
    assert traced["traces"] == 1, traced  # the oracle's sed fix, graded 1 by the task's verifier

    sft_cfg = SFTConfig(
        tiny=tiny,
        seq_len=4096,
        rows_per_micro_batch=1,
        max_steps=1,
        lr=5e-3,
        warmup_steps=1,
        checkpoint_every=1,
        keep_checkpoints=1,
        threads=1,
        truncate_overlong=True,
    )
    sft = env.run("sft", run_sft, SFTStage.build(sft=sft_cfg, agent=agent, engine=engine), [curate, traces]).manifest

    held = env.run("curate", run_curate, cfg.model_copy(update={"eval_repos": ["harbor-category:programming"]}))
    held_out = tasks_from_parquet(env.artifact(held.manifest, "eval.parquet"))
    assert [t.instance_id for t in held_out] == ["harbor__calc-add"] and held_out[0].split == "eval"
    assert env.json(held.manifest, "curate_report.json")["split"]["unmatched"] == []

    evaluate_cfg = EvaluateConfig(max_tasks=1, attempts=1, concurrency=1, bootstrap_samples=200, checkpoints=["sft"])
    evaluated = env.run(
        "evaluate", run_evaluate, EvaluateStage(evaluate=evaluate_cfg, agent=agent, engine=engine), [held.manifest, sft]
    ).manifest
    result = env.json(evaluated, "eval_results.json")["models"]["sft"]
    assert (result["tasks"], result["missing"]) == (1, 0), result
    episodes = env.artifact(evaluated, "episodes_sft.jsonl").decode()
    assert '"infra_cause": null' in episodes, episodes[:2000]
