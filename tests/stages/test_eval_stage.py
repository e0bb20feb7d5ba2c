"""The evaluate stage on a real checkpoint, and its scheduled form: a Prefect deployment on a cron schedule, served by
`swerl serve` against the session's real `prefect server`, firing and producing its report.

Real parts: micro tasks curated in bubblewrap sandboxes, a tiny Qwen3 with a tokenizer trained here (the literal
"sft" stage below builds it instead of training it: SFT has its own tests), the local engine, swebench grading of
the attempts' test logs, a file:// store and a sqlite MLflow store.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from swerl.agent.tools import system_prompt
from swerl.config.agent import AgentConfig
from swerl.config.data import CurateConfig, MicroSource
from swerl.config.engine import EngineConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.config.train import TinyModelConfig
from swerl.eval.stratify import Subset, stratify
from swerl.model.loading import build_tiny_model, save_model_and_tokenizer
from swerl.model.tokenizer import train_tokenizer
from swerl.stages.common import load_tasks, put_dir
from swerl.stages.curate import run_curate
from swerl.stages.evaluate import CheckpointLoadError, EvaluateStage, run_evaluate
from swerl.stages.runner import (
    Manifest,
    StageContext,
    StageOutcome,
    StageResult,
    load_manifest,
    read_manifest,
    run_stage,
    stage_key,
)
from swerl.stages.schedule import pending_evaluations
from swerl.storage import Store
from swerl.tracking import Tracker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "micro_cache")]

REPO_ROOT = Path(__file__).resolve().parents[2]
MODIFIERS = ["flip_comparison", "swap_binop", "off_by_one"]
CURATE = CurateConfig(
    repos=[],
    micro=MicroSource(train_repos=0, eval_repos=2),
    modifiers=MODIFIERS,
    max_candidates_per_repo=2,
    clean_runs=1,
    validation_workers=2,
)
TINY = TinyModelConfig(
    vocab_size=400, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, ffn_size=64, max_positions=1024
)
AGENT = AgentConfig(
    max_turns=2,
    max_trajectory_tokens=768,
    max_new_tokens_per_turn=16,
    max_malformed_calls=2,
    command_timeout_s=20,
    test_timeout_s=30,
    episode_timeout_s=120,
    infra_retries=1,
)
ENGINE = EngineConfig.model_validate({"max_batch_size": 4, "max_context_tokens": 1024, "local": {"threads": 1}})
EVALUATE = EvaluateConfig(
    max_tasks=2, attempts=2, concurrency=4, bootstrap_samples=200, comparison_samples=200, temperature=1.0
)


def tiny_sft(cfg: TinyModelConfig, ctx: StageContext) -> StageResult:
    """A literal sft stage: a tokenizer trained on the prompt and the tasks, two random tiny models (base, model)."""
    tasks = load_tasks(ctx.store, ctx.inputs["curate"], "eval.parquet")
    corpus = [system_prompt(), *(t.problem_statement for t in tasks), "python run_tests.py -q\n"] * 4
    tokenizer = train_tokenizer(corpus, cfg.vocab_size, ctx.workdir / "tokenizer")
    for seed, name in enumerate(("base", "model")):
        model = build_tiny_model(
            tokenizer,
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.ffn_size,
            cfg.max_positions,
            seed=seed,
        )
        put_dir(ctx, name, save_model_and_tokenizer(model, tokenizer, ctx.workdir / name))
    return StageResult(metrics={"steps": 0.0})


def broken_sft(cfg: TinyModelConfig, ctx: StageContext) -> StageResult:
    """An sft stage whose published models do not load (a config that is not JSON, no weights)."""
    for name in ("base", "model"):
        (ctx.workdir / name).mkdir()
        (ctx.workdir / name / "config.json").write_text("{not json")
        put_dir(ctx, name, ctx.workdir / name)
    return StageResult()


@dataclass
class Env:
    root: Path
    store: Store
    tracker: Tracker

    def run(self, stage: str, fn: Any, cfg: Any, inputs: list[Manifest] | None = None) -> StageOutcome:
        return run_stage(
            stage,
            fn,
            cfg,
            store=self.store,
            tracker=self.tracker,
            parent=None,
            inputs=inputs,
            seed=0,
            log=logging.getLogger(f"swerl.test.{stage}"),
        )

    def json(self, manifest: Manifest, name: str) -> Any:
        return json.loads(self.store.read_bytes(self.store.rel_of(manifest.artifact(name).uri)))

    def eval_runs(self, stage_run_id: str) -> list[Any]:
        experiment = self.tracker.client.get_run(stage_run_id).info.experiment_id
        return self.tracker.client.search_runs([experiment], f"tags.mlflow.parentRunId = '{stage_run_id}'")


def make_env(root: Path) -> Env:
    return Env(root, Store(f"file://{root}/store"), Tracker(f"sqlite:///{root}/mlflow.db", "eval-test"))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    return make_env(tmp_path_factory.mktemp("eval"))


@pytest.fixture(scope="module")
def curate(env: Env) -> Manifest:
    manifest = env.run("curate", run_curate, CURATE).manifest
    assert len(load_tasks(env.store, manifest, "eval.parquet")) >= 3
    return manifest


@pytest.fixture(scope="module")
def sft(env: Env, curate: Manifest) -> Manifest:
    return env.run("sft", tiny_sft, TINY, [curate]).manifest


def test_evaluate_stage_scores_base_and_sft_on_a_saved_stratified_subset(
    env: Env, curate: Manifest, sft: Manifest
) -> None:
    outcome = env.run(
        "evaluate", run_evaluate, EvaluateStage(evaluate=EVALUATE, agent=AGENT, engine=ENGINE), [curate, sft]
    )
    manifest, result = outcome.manifest, outcome.result
    assert result is not None
    held_out = {t.instance_id: t for t in load_tasks(env.store, curate, "eval.parquet")}
    subset = Subset.from_json(json.dumps(env.json(manifest, "eval_subset.json")))
    assert len(subset.instance_ids) == EVALUATE.max_tasks and set(subset.instance_ids) <= set(held_out)
    assert env.json(manifest, "eval_tasks.json") == subset.instance_ids
    # micro tasks carry no difficulty: repository strata, and the report says so
    assert not subset.by_difficulty and "no difficulty labels" in subset.note
    assert "no difficulty labels" in result.markdown["evaluation"]
    saved = [p for p in env.store.list("eval_subsets")]
    assert len(saved) == 1 and Subset.from_json(env.store.read_bytes(saved[0])) == subset

    results = env.json(manifest, "eval_results.json")
    models = results["models"]
    assert set(models) == {"base", "sft"}  # no grpo input: grpo is not evaluated
    for name, summary in models.items():
        assert summary["tasks"] + summary["missing"] == len(subset.instance_ids)
        assert sum(summary["statuses"].values()) == len(subset.instance_ids) * EVALUATE.attempts
        assert [row["k"] for row in summary["pass@k"]] == [1, 2]
        assert sorted(summary["per_task"]) == subset.instance_ids
        assert sum(row["chosen"] for row in summary["by_stratum"]) == len(subset.instance_ids)
        assert {row["stratum"] for row in summary["by_stratum"]} == set(subset.population)
        assert summary["grading"].startswith("swebench verdicts on")
        assert manifest.metrics[f"{name}/pass_at_1"] == summary["pass@1"] or summary["tasks"] == 0
    (comparison,) = results["comparisons"]
    assert (comparison["a"], comparison["b"]) == ("base", "sft") and "sft - base" in comparison["text"]
    episodes = [
        json.loads(line)
        for line in env.store.read_bytes(env.store.rel_of(manifest.artifact("episodes_sft.jsonl").uri))
        .decode()
        .splitlines()
        if line
    ]
    assert len(episodes) == len(subset.instance_ids) * EVALUATE.attempts
    graded = [e for e in episodes if e["grade"] is not None]
    assert len(graded) == sum(e["status"] != "infra_error" for e in episodes)
    assert all(e["grade"]["parser"] == "sealed" and e["grade"]["sealed"] for e in graded)  # micro: the sealed runner
    png = env.store.read_bytes(env.store.rel_of(manifest.artifact("pass_at_1_by_stratum.png").uri))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    # One MLflow eval run per model under the stage's run, linked to the sft stage's run and manifest.
    runs = {r.data.tags["swerl.eval.checkpoint"]: r for r in env.eval_runs(manifest.mlflow_run_id)}
    assert set(runs) == {"base", "sft"}
    for name, run in runs.items():
        assert run.data.tags["swerl.checkpoint.run_id"] == sft.mlflow_run_id
        assert run.data.tags["swerl.checkpoint.manifest"] == sft.uri
        assert run.data.metrics["pass_at_1"] == pytest.approx(models[name]["pass@1"], nan_ok=True)
        assert run.data.metrics["tasks"] == models[name]["tasks"]
    assert set(runs["base"].data.metrics) == set(runs["sft"].data.metrics)

    # A second evaluation of the same held-out set reuses the saved subset, whatever else changed.
    other = EvaluateStage(
        evaluate=EVALUATE.model_copy(update={"attempts": 1, "checkpoints": ["sft"]}), agent=AGENT, engine=ENGINE
    )
    again = env.run("evaluate", run_evaluate, other, [curate, sft]).manifest
    assert env.json(again, "eval_tasks.json") == subset.instance_ids
    assert list(env.json(again, "eval_results.json")["models"]) == ["sft"]


def test_bad_input_is_refused_with_nothing_written(env: Env, curate: Manifest, sft: Manifest) -> None:
    held_out = len(load_tasks(env.store, curate, "eval.parquet"))
    too_many = EvaluateStage(
        evaluate=EVALUATE.model_copy(update={"max_tasks": held_out + 1}), agent=AGENT, engine=ENGINE
    )
    with pytest.raises(ValueError, match=rf"evaluate.max_tasks \({held_out + 1}\) is larger than the {held_out} "):
        env.run("evaluate-bad", run_evaluate, too_many, [curate, sft])
    assert load_manifest(env.store, "evaluate-bad", stage_key("evaluate-bad", too_many, [curate, sft])) is None

    broken = env.run("sft", broken_sft, TINY.model_copy(update={"hidden_size": 16}), [curate]).manifest
    cfg = EvaluateStage(evaluate=EVALUATE, agent=AGENT, engine=ENGINE)
    with pytest.raises(CheckpointLoadError, match=rf"checkpoint 'base' \(sft manifest {broken.uri}\) does not load"):
        env.run("evaluate-bad", run_evaluate, cfg, [curate, broken])
    assert load_manifest(env.store, "evaluate-bad", stage_key("evaluate-bad", cfg, [curate, broken])) is None
    failed = [
        r for r in env.tracker.client.search_runs([env.tracker.experiment_id], "tags.`swerl.stage` = 'evaluate-bad'")
    ]
    assert failed and all(r.info.status == "FAILED" for r in failed)
    assert all(env.eval_runs(r.info.run_id) == [] for r in failed)  # no eval run half-written

    with pytest.raises(ValueError, match="names no model of the inputs"):
        env.run(
            "evaluate-bad",
            run_evaluate,
            cfg.model_copy(update={"evaluate": EVALUATE.model_copy(update={"checkpoints": ["grpo"]})}),
            [curate, sft],
        )


def tiny_phase(cfg: TinyModelConfig, ctx: StageContext) -> StageResult:
    """A literal GRPO phase: publishes a tiny random model (seeded by its stage name) as its `model`."""
    from swerl.model.loading import load_tokenizer
    from swerl.stages.common import get_dir

    tokenizer = load_tokenizer(get_dir(ctx.store, ctx.inputs["sft"], "model", ctx.workdir / "sft"))
    model = build_tiny_model(
        tokenizer,
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.ffn_size,
        cfg.max_positions,
        seed=len(ctx.stage),
    )
    put_dir(ctx, "model", save_model_and_tokenizer(model, tokenizer, ctx.workdir / "model"))
    return StageResult()


def test_every_grpo_phase_is_evaluated_beside_base_and_sft_and_each_can_be_named(
    env: Env, curate: Manifest, sft: Manifest
) -> None:
    wide = env.run("grpo-wide", tiny_phase, TINY, [curate, sft]).manifest
    tight = env.run("grpo-tight", tiny_phase, TINY, [curate, sft, wide]).manifest
    one = EVALUATE.model_copy(update={"attempts": 1})
    cfg = EvaluateStage(evaluate=one, agent=AGENT, engine=ENGINE)
    manifest = env.run("evaluate-phases", run_evaluate, cfg, [curate, sft, wide, tight]).manifest
    results = env.json(manifest, "eval_results.json")
    # `grpo` stands for every phase, in phase order; consecutive models are compared (sft -> wide -> tight)
    assert set(results["models"]) == {"base", "sft", "grpo-wide", "grpo-tight"}
    assert [(c["a"], c["b"]) for c in results["comparisons"]] == [
        ("base", "sft"),
        ("sft", "grpo-wide"),
        ("grpo-wide", "grpo-tight"),
    ]
    runs = {r.data.tags["swerl.eval.checkpoint"]: r for r in env.eval_runs(manifest.mlflow_run_id)}
    assert set(runs) == {"base", "sft", "grpo-wide", "grpo-tight"}
    assert runs["grpo-tight"].data.tags["swerl.checkpoint.manifest"] == tight.uri
    assert runs["grpo-wide"].data.tags["swerl.checkpoint.stage"] == "grpo-wide"
    assert "grpo-tight/pass_at_1" in manifest.metrics
    # a phase named on its own
    named = cfg.model_copy(update={"evaluate": one.model_copy(update={"checkpoints": ["sft", "grpo-wide"]})})
    again = env.run("evaluate-phases", run_evaluate, named, [curate, sft, wide, tight]).manifest
    assert set(env.json(again, "eval_results.json")["models"]) == {"sft", "grpo-wide"}


# ----------------------------------------------------------------------------------------------------------------
# scheduled evaluation on a real Prefect server


def _flow_runs(deployment_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def _wait_for_deployment(name: str, deadline: float) -> Any:
    from prefect.client.orchestration import get_client

    while time.monotonic() < deadline:
        with get_client(sync_client=True) as client:
            try:
                return client.read_deployment_by_name(name)
            except Exception:  # noqa: BLE001 - not registered yet
                time.sleep(2)
    raise AssertionError(f"deployment {name} never registered")


def test_scheduled_evaluation_fires_on_its_cron_and_evaluates_pending_checkpoints(
    prefect_api: str, tmp_path: Path, micro_cache: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )

    env = make_env(tmp_path)
    curate = env.run("curate", run_curate, CURATE).manifest
    sft = env.run("sft", tiny_sft, TINY, [curate]).manifest
    assert [p.checkpoint.uri for p in pending_evaluations(env.store)[0]] == [sft.uri]

    name = f"sched-{uuid.uuid4().hex[:6]}"
    config = {
        "run": {"name": name, "seed": 0},
        "storage": {"root": f"file://{tmp_path}/store"},
        "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "eval-test"},
        "agent": AGENT.model_dump(mode="json"),
        "engine": ENGINE.model_dump(mode="json"),
        "evaluate": EVALUATE.model_dump(mode="json") | {"attempts": 1, "max_tasks": 1, "checkpoints": ["sft"]},
        "serve": {"eval_cron": "* * * * *", "timezone": "UTC"},  # fires at the next minute
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "serve.log"
    child_env = {**os.environ, "PREFECT_API_URL": prefect_api, "SWERL_CACHE_DIR": str(micro_cache)}
    with open(log_path, "wb") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "swerl.cli", "serve", str(config_path), "--foreground"],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600  # the next minute, the runner's poll, a flow run on 2 shared cores
        deployment = _wait_for_deployment(f"swerl-evaluate/{name}-evaluate", deadline)
        assert [s.schedule.cron for s in deployment.schedules] == ["* * * * *"]
        finished = None
        while finished is None and time.monotonic() < deadline:
            assert serve.poll() is None, log_path.read_text()[-3000:]
            runs = _flow_runs(deployment.id)
            finished = next((r for r in runs if r.state and r.state.is_final()), None)
            time.sleep(3)
        assert finished is not None, f"no scheduled run finished; serve log:\n{log_path.read_text()[-3000:]}"
    finally:
        os.killpg(serve.pid, signal.SIGTERM)  # our own child's process group
        serve.wait(timeout=60)

    # The run came from the deployment's schedule (not a direct call), completed, and published its reports.
    assert finished.auto_scheduled and finished.deployment_id == deployment.id
    assert finished.state.is_completed(), (finished.state, log_path.read_text()[-3000:])
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[finished.id])),
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["scheduled-evaluation", "evaluate-evaluation"])),
        )
    by_key = {a.key: str(a.data) for a in artifacts}
    assert sft.uri in by_key["scheduled-evaluation"] and "evaluated:" in by_key["scheduled-evaluation"]
    assert "# Held-out evaluation" in by_key["evaluate-evaluation"] and "| sft |" in by_key["evaluate-evaluation"]

    # The store records the evaluation; nothing is pending any more; the eval runs link to the sft run.
    assert pending_evaluations(env.store) == ([], [])
    evaluations = [read_manifest(env.store, f"{d}/manifest.json") for d in env.store.list("stages/evaluate")]
    (evaluation,) = evaluations
    assert [ref.uri for ref in evaluation.inputs] == [curate.uri, sft.uri]
    runs = env.eval_runs(evaluation.mlflow_run_id)
    assert {r.data.tags["swerl.eval.checkpoint"] for r in runs} == {"sft"}
    assert all(r.data.tags["swerl.checkpoint.run_id"] == sft.mlflow_run_id for r in runs)


def test_grade_attempt_reruns_the_patch_in_a_fresh_sandbox_and_grades_its_log(env: Env, curate: Manifest) -> None:
    """The real grading path: the fix (the bug patch reversed, taken with git in a sandbox) is resolved; a patch
    that does not apply, and one that edits the tests instead of the code, are not."""
    from swerl.grading.grader import start_task_sandbox, workspace_patch
    from swerl.grading.verdict import grade_attempt
    from swerl.stages.common import run_async, sandbox_provider

    task = load_tasks(env.store, curate, "eval.parquet")[0]
    provider = sandbox_provider(AGENT.sandbox, git_baseline=True)

    async def patches() -> tuple[str, str]:
        sandbox = await start_task_sandbox(provider, task)
        try:
            await sandbox.write_file(".bug.patch", task.patch)
            reverted = await sandbox.exec("git apply -R .bug.patch && rm .bug.patch", timeout=30)
            assert reverted.exit_code == 0, reverted.output
            fix = await workspace_patch(sandbox)
            await sandbox.exec("git reset -q --hard HEAD && git clean -qfd", timeout=30)
            # "fix" the tests instead: their check() never raises
            cheat = await sandbox.exec("sed -i 's/raise AssertionError/return/' tests/test_mod.py", timeout=30)
            assert cheat.exit_code == 0
            cheat_patch = await workspace_patch(sandbox)
        finally:
            await sandbox.close()
        assert fix and cheat_patch
        return fix, cheat_patch

    fix, cheat = run_async(patches())
    graded = run_async(grade_attempt(provider, task, fix, AGENT.test_timeout_s))
    assert graded.grade.resolved and graded.grade.status == "RESOLVED_FULL", graded.log
    assert graded.sealed is not None and graded.sealed.sealed and "@@swerl-end" in graded.log
    assert sorted(graded.grade.tests["FAIL_TO_PASS"]["success"]) == sorted(task.FAIL_TO_PASS)

    cheated = run_async(grade_attempt(provider, task, cheat, AGENT.test_timeout_s))
    assert not cheated.grade.resolved and cheated.grade.log_valid
    assert cheated.grade.tests["FAIL_TO_PASS"]["failure"]
    assert cheated.sealed is not None and cheated.sealed.dropped == ("tests/test_mod.py",)

    bad = run_async(
        grade_attempt(
            provider,
            task,
            "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n",
            AGENT.test_timeout_s,
        )
    )
    assert not bad.grade.resolved and bad.grade.status == "PATCH_APPLY_FAILED"
    empty = run_async(grade_attempt(provider, task, "", AGENT.test_timeout_s))
    assert not empty.grade.resolved and empty.grade.status == "RESOLVED_NO"  # graded by the tests, like any patch


def test_an_attempt_lost_to_the_infrastructure_is_retried_then_missing_never_scored(
    env: Env, curate: Manifest, sft: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grading of one task's attempts always hits a dead sandbox (injected at the sandbox edge): each attempt is
    retried agent.infra_retries times, then the task is reported missing and leaves the denominator."""
    from swerl.errors import InfraError
    from swerl.stages import evaluate as evaluate_module

    real = evaluate_module.grade_attempt
    # one task of three is lost on purpose: allow that share missing (the default 20% would fail the stage)
    cfg = EvaluateStage(
        evaluate=EVALUATE.model_copy(update={"checkpoints": ["sft"], "max_tasks": 3, "max_missing_share": 0.5}),
        agent=AGENT,
        engine=ENGINE,
    )
    held_out = load_tasks(env.store, curate, "eval.parquet")
    victim = stratify(held_out, 3, seed=0).instance_ids[0]  # the stage draws the same subset (run seed 0)
    calls: list[str] = []

    async def flaky(provider: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(task.instance_id)
        if task.instance_id == victim:
            raise InfraError("sandbox_died", "injected: the grading sandbox died")
        return await real(provider, task, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "grade_attempt", flaky)
    outcome = env.run("evaluate-infra", run_evaluate, cfg, [curate, sft])
    summary = env.json(outcome.manifest, "eval_results.json")["models"]["sft"]
    ids = env.json(outcome.manifest, "eval_tasks.json")
    assert victim in ids
    tries = EVALUATE.attempts * (AGENT.infra_retries + 1)
    assert calls.count(victim) == tries
    assert (summary["tasks"], summary["missing"]) == (len(ids) - 1, 1)
    assert summary["per_task"][victim] == [None] * EVALUATE.attempts
    assert summary["statuses"]["infra_error"] == EVALUATE.attempts
    assert summary["failures"]["infra_error.sandbox_died"] == tries
    assert summary["failures"]["infra_error.gave_up"] == EVALUATE.attempts
    report = outcome.result.markdown["evaluation"] if outcome.result else ""
    assert f"| sft | {summary['pass@1']:.3f} |" in report and f"| {len(ids) - 1} | 1 |" in report


def recipe_section() -> dict[str, Any]:
    """The `evaluate` section of docs/operations.md's recipe "Evaluate models on new tasks"."""
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    block = text.split("<!-- recipe: evaluate-new-tasks -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    return dict(yaml.safe_load(block)["evaluate"])


def test_the_documented_recipe_evaluates_the_models_on_new_tasks_in_their_environments(
    env: Env, curate: Manifest, sft: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations.md's recipe on a task file of swerl's own (a curate stage's eval.parquet): every model named
    is evaluated on those tasks, each started from its own environment (micro://: read as SWE-bench rows they
    would have been given SWE-bench image names, and every attempt would have failed as image_missing); the same
    file under a published schema is refused before anything runs. The stage loads each model's weights once, in
    its engine: the tokenizer it needs itself comes without them."""
    from transformers import AutoModelForCausalLM

    from swerl.data.loaders import SchemaMismatch

    new_tasks = tmp_path / "eval.parquet"
    new_tasks.write_bytes(env.store.read_bytes(env.store.rel_of(curate.artifact("eval.parquet").uri)))
    section = recipe_section()
    assert section["dataset"]["schema"] == "swerl"
    section["dataset"]["path"] = str(new_tasks)
    evaluate = EvaluateConfig.model_validate(
        EVALUATE.model_dump(by_alias=True, exclude={"dataset", "checkpoints", "max_tasks", "attempts"}) | section
    )
    loads: list[Any] = []
    real = AutoModelForCausalLM.from_pretrained

    def counted(*args: Any, **kwargs: Any) -> Any:
        loads.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    outcome = env.run(
        "evaluate-recipe", run_evaluate, EvaluateStage(evaluate=evaluate, agent=AGENT, engine=ENGINE), [curate, sft]
    )
    results = env.json(outcome.manifest, "eval_results.json")["models"]
    assert set(results) == {"base", "sft"}  # grpo is named, but no GRPO stage is among the inputs
    assert len(loads) == len(results)  # one load per model: its engine's
    new_ids = {t.instance_id for t in load_tasks(env.store, curate, "eval.parquet")}
    assert set(env.json(outcome.manifest, "eval_tasks.json")) <= new_ids
    for name in results:
        body = env.store.read_bytes(env.store.rel_of(outcome.manifest.artifact(f"episodes_{name}.jsonl").uri))
        episodes = [json.loads(line) for line in body.decode().splitlines() if line]
        assert episodes and not [e for e in episodes if e["infra_cause"] == "image_missing"]
        assert any(e["grade"] is not None for e in episodes)
    report = outcome.result.markdown["evaluation"] if outcome.result else ""
    assert f"Tasks from evaluate.dataset {new_tasks} (split train, schema swerl)." in report

    assert evaluate.dataset is not None
    wrong = evaluate.model_copy(update={"dataset": evaluate.dataset.model_copy(update={"schema_name": "swebench"})})
    cfg = EvaluateStage(evaluate=wrong, agent=AGENT, engine=ENGINE)
    with pytest.raises(SchemaMismatch, match=r"would lose its environment and harness: set the dataset's schema"):
        env.run("evaluate-recipe-wrong", run_evaluate, cfg, [curate, sft])
    assert (
        load_manifest(env.store, "evaluate-recipe-wrong", stage_key("evaluate-recipe-wrong", cfg, [curate, sft]))
        is None
    )


def test_the_tokenizer_loads_from_a_checkpoint_whose_weights_do_not(env: Env, sft: Manifest, tmp_path: Path) -> None:
    """What evaluate loads for its episodes (load_tokenizer) never reads the weights: a checkpoint with corrupted
    weights still gives its tokenizer, while loading the model fails."""
    from transformers import AutoModelForCausalLM

    from swerl.model.loading import load_tokenizer
    from swerl.stages.common import get_dir

    path = get_dir(env.store, sft, "model", tmp_path / "model")
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    tokenizer = load_tokenizer(path)
    assert tokenizer.encode("python run_tests.py") and tokenizer.chat_template
    with pytest.raises(Exception, match=r"(?i)safetensors|header|deserializ"):
        AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
