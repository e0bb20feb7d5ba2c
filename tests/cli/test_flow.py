"""The real Prefect flow against the session's Prefect server, with a literal curate stage (curation has its own tests).

The store is a tmp folder and MLflow a tmp sqlite file; only `run_curate` is replaced, everything else is real:
the flow, the task, the manifest checkpoints, the MLflow runs and the Prefect server's records.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from mlflow.tracking import MlflowClient

from swerl.config import PipelineConfig
from swerl.config.load import dump_config
from swerl.config.pipeline import STAGES
from swerl.plots import step_time_breakdown
from swerl.stages.runner import StageContext, StageResult, load_manifest, stage_key

pytestmark = pytest.mark.slow


@dataclass
class FakeStage:
    """A literal stage; `fail` injects a failure after it has written an artifact."""

    name: str
    calls: int = 0
    fail: bool = False
    stages: list[str] = field(default_factory=list)  # the stage of each call (a GRPO phase's grpo-NAME)

    def __call__(self, cfg: Any, ctx: StageContext) -> StageResult:
        self.calls += 1
        self.stages.append(ctx.stage)
        body = {"stage": self.name, "inputs": sorted(ctx.inputs)}
        if self.name == "curate":
            body |= {"repos": cfg.model_dump(mode="json")["repos"], "n": cfg.max_candidates_per_repo}
        ctx.write_artifact(f"{self.name}.json", json.dumps(body).encode())
        if self.fail:
            raise RuntimeError(f"injected {self.name} failure")
        rows = [{"repo": "toy", "tasks": 2}]
        ctx.progress(1, 2, "half way")
        return StageResult(
            metrics={"tasks": 2.0},
            tables={"yield": rows},
            markdown={"report": f"# {self.name}"},
            summary=self.name,
            images={"step time": _PNG},
        )


_PNG = step_time_breakdown([{"time_total_s": 10.0, "time_update_s": 6.3, "time_wait_rollouts_s": 2.9}]) or b""


STAGE_FUNCTIONS = {
    "curate": ("swerl.stages.curate", "run_curate"),
    "traces": ("swerl.stages.traces", "run_traces"),
    "sft": ("swerl.stages.sft", "run_sft"),
    "grpo": ("swerl.stages.grpo", "run_grpo"),
    "evaluate": ("swerl.stages.evaluate", "run_evaluate"),
}


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeStage]:
    """Every stage function replaced by a literal one (each stage has its own tests); the flow, the tasks, the
    manifests, MLflow and the Prefect server are real."""
    import importlib

    out = {}
    for stage, (module, function) in STAGE_FUNCTIONS.items():
        out[stage] = FakeStage(stage)
        monkeypatch.setattr(importlib.import_module(module), function, out[stage])
    return out


@pytest.fixture
def fake_curate(fakes: dict[str, FakeStage]) -> FakeStage:
    return fakes["curate"]


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One sqlite file for the module: MLflow migrates a new database for ~10 s.
    return f"sqlite:///{tmp_path_factory.mktemp('flow-mlflow') / 'mlflow.db'}"


@pytest.fixture
def cfg(tmp_path: Path, mlflow_db: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "run": {"name": "flowtest", "seed": 1},
            "storage": {"root": f"file://{tmp_path}/store"},
            "tracking": {"uri": mlflow_db, "experiment": f"flow-{uuid.uuid4().hex[:8]}"},
            "curate": {"repos": ["builtin:toy"], "max_candidates_per_repo": 3},
        }
    )


def _run(cfg: PipelineConfig, **kw: Any):  # type: ignore[no-untyped-def]
    from flows.pipeline import pipeline

    return pipeline(config=cfg, return_state=True, **kw)


def _client():  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _parent_runs(cfg: PipelineConfig) -> list[Any]:
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], "tags.`swerl.run_id` != ''", order_by=["start_time ASC"])
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def _children(cfg: PipelineConfig, parent_id: str) -> list[Any]:
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    assert exp is not None
    return client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")


def test_pipeline_runs_then_skips_curate(prefect_api: str, cfg: PipelineConfig, fake_curate: FakeStage) -> None:
    state = _run(cfg)
    assert state.is_completed(), state
    summary = state.result()
    flow_run_id = state.state_details.flow_run_id
    assert fake_curate.calls == 1
    assert summary["stages"]["curate"]["skipped"] is False
    assert list(summary["stages"]) == list(STAGES)

    # The flow run is on the session's server (not an ephemeral API), with its task run and artifacts.
    with _client() as client:
        assert str(client.api_url).rstrip("/") == prefect_api
        flow_run = client.read_flow_run(flow_run_id)
        assert flow_run.state is not None and flow_run.state.is_completed()
        assert flow_run.parameters["config"]["run"]["name"] == "flowtest"
        task_runs = client.read_task_runs(flow_run_filter=_flow_run_filter(flow_run_id))
        names = sorted(t.name.rsplit("-", 1)[0] for t in task_runs)
        assert names == sorted(["curate-tasks", "oracle-traces", "sft", "grpo", "evaluate"])
        assert all(t.state is not None and t.state.is_completed() for t in task_runs)
        artifacts = client.read_artifacts(flow_run_filter=_flow_run_filter(flow_run_id))
        keys = {a.key for a in artifacts}
        assert {"curate-yield", "curate-report", "evaluate-yield", "evaluate-report"} <= keys
        # Per stage: its plots inlined as data: URIs (what the Prefect UI's markdown renders as <img>), a progress
        # artifact at 100% once done, and the link to its MLflow runs.
        by_key = {a.key: a for a in artifacts}
        plots = str(by_key["sft-plots"].data)
        inline = plots.split("](data:image/png;base64,", 1)[1].split(")", 1)[0]
        assert base64.b64decode(inline) == _PNG and _PNG.startswith(b"\x89PNG")
        assert by_key["sft-progress"].type == "progress" and float(by_key["sft-progress"].data) == 100.0
        assert summary["mlflow_run_id"] in str(by_key["sft-mlflow"].data)
        assert not [k for k in keys if k.startswith(("sft-sft", "curate-curate"))]

    # One MLflow parent run tagged with the Prefect flow-run id, and a nested curate run.
    (parent,) = _parent_runs(cfg)
    assert parent.data.tags["prefect.flow_run_id"] == str(flow_run_id)
    assert parent.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{flow_run_id}")
    assert parent.info.run_id == summary["mlflow_run_id"]
    assert parent.data.tags["swerl.stage.curate"] == "ran"
    assert parent.info.status == "FINISHED"
    children = {c.data.tags["swerl.stage"]: c for c in _children(cfg, parent.info.run_id)}
    assert sorted(children) == sorted(STAGES)
    child = children["curate"]
    assert all(c.info.status == "FINISHED" for c in children.values())
    assert child.data.metrics["tasks"] == 2.0

    # The resolved config is saved with the run, and the manifest is where the summary says.
    from swerl.pipeline import store_for

    store = store_for(cfg)
    saved = store.read_bytes(f"pipelines/{summary['run_id']}/config.yaml").decode()
    assert saved == dump_config(cfg)
    assert PipelineConfig.model_validate(yaml.safe_load(saved)) == cfg
    manifest = load_manifest(store, "curate", stage_key("curate", cfg.curate, [], seed=cfg.run.seed))
    assert manifest is not None and manifest.uri == summary["stages"]["curate"]["manifest"]
    assert manifest.mlflow_run_id == child.info.run_id
    assert store.read_json(store.rel_of(manifest.artifact("curate.json").uri)) == {
        "stage": "curate",
        "inputs": [],
        "repos": ["builtin:toy"],
        "n": 3,
    }
    # Each later stage got the manifests it depends on.
    inputs = {
        name: store.read_json(
            store.rel_of(
                load_manifest(store, name, outcome["manifest"].rsplit("/", 2)[-2]).artifact(f"{name}.json").uri
            )
        )["inputs"]  # type: ignore[union-attr]
        for name, outcome in summary["stages"].items()
    }
    assert inputs == {
        "curate": [],
        "traces": ["curate"],
        "sft": ["curate", "traces"],
        "grpo": ["curate", "sft"],
        "evaluate": ["curate", "grpo", "sft"],
    }

    # Second run: curate is skipped (the function is not called) and says so.
    state2 = _run(cfg)
    assert state2.is_completed()
    summary2 = state2.result()
    assert fake_curate.calls == 1
    assert summary2["stages"]["curate"] == {**summary["stages"]["curate"], "skipped": True}
    assert all(stage["skipped"] for stage in summary2["stages"].values())
    assert "curate skipped: already done" in "\n".join(_flow_run_logs(state2.state_details.flow_run_id))
    # The same config continues the same MLflow parent run (one parent per config), now naming this flow run.
    (second_parent,) = _parent_runs(cfg)
    assert second_parent.info.run_id == parent.info.run_id
    assert second_parent.data.tags["prefect.flow_run_id"] == str(state2.state_details.flow_run_id)
    assert second_parent.data.tags["swerl.resumes"] == "1"
    assert second_parent.data.tags["swerl.stage.curate"] == "skipped"
    assert sorted(c.data.tags["swerl.stage"] for c in _children(cfg, second_parent.info.run_id)) == sorted(STAGES)
    with _client() as client:
        artifacts = client.read_artifacts(flow_run_filter=_flow_run_filter(state2.state_details.flow_run_id))
        status = [a for a in artifacts if a.key.endswith("-status")]
        assert sorted(a.key for a in status) == sorted(f"{s}-status" for s in STAGES)
        assert all("skipped" in str(a.data) for a in status)


def test_failed_stage_fails_the_flow_and_the_next_run_resumes(
    prefect_api: str, cfg: PipelineConfig, fake_curate: FakeStage
) -> None:
    from swerl.pipeline import store_for

    store = store_for(cfg)
    key = stage_key("curate", cfg.curate, [], seed=cfg.run.seed)
    fake_curate.fail = True
    state = _run(cfg)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match="injected curate failure"):
        state.result()
    assert fake_curate.calls == 1
    assert load_manifest(store, "curate", key) is None
    (parent,) = _parent_runs(cfg)
    assert parent.info.status == "FAILED"
    assert [c.info.status for c in _children(cfg, parent.info.run_id)] == ["FAILED"]  # later stages never ran
    with _client() as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
        assert flow_run.state is not None and flow_run.state.is_failed()

    fake_curate.fail = False
    state2 = _run(cfg)
    assert state2.is_completed()
    assert fake_curate.calls == 2
    assert state2.result()["stages"]["curate"]["skipped"] is False
    assert load_manifest(store, "curate", key) is not None
    # The resume continued the failed parent and its failed curate run: one parent, one curate run, both finished.
    (resumed,) = _parent_runs(cfg)
    assert resumed.info.run_id == parent.info.run_id and resumed.info.status == "FINISHED"
    curate_runs = [c for c in _children(cfg, parent.info.run_id) if c.data.tags["swerl.stage"] == "curate"]
    assert [(c.info.status, c.data.tags.get("swerl.resumes")) for c in curate_runs] == [("FINISHED", "1")]


def test_force_curate_reruns(prefect_api: str, cfg: PipelineConfig, fake_curate: FakeStage) -> None:
    first = _run(cfg).result()
    forced = _run(cfg, force=["curate"])
    assert forced.is_completed()
    summary = forced.result()
    assert fake_curate.calls == 2
    assert summary["stages"]["curate"]["skipped"] is False
    assert summary["stages"]["curate"]["manifest"] == first["stages"]["curate"]["manifest"]  # same key
    (parent,) = _parent_runs(cfg)  # the same config: the same parent run, continued
    assert json.loads(parent.data.tags["swerl.forced_stages"]) == sorted(STAGES)
    assert json.loads(parent.data.params["forced_stages"]) == []  # the first invocation's (params never change)


def test_grpo_phases_run_as_one_prefect_task_and_mlflow_run_each_and_a_changed_phase_reruns_only_what_follows(
    prefect_api: str, cfg: PipelineConfig, fakes: dict[str, FakeStage]
) -> None:
    def phased(lr: float) -> PipelineConfig:
        data = cfg.model_dump(mode="json", by_alias=True)
        data["grpo"]["phases"] = [
            {"name": "wide", "steps": 2},
            {"name": "tight", "steps": 1, "grpo": {"algorithm": {"lr": lr}}},
        ]
        return PipelineConfig.model_validate(data)

    state = _run(phased(1e-5))
    assert state.is_completed(), state
    summary = state.result()
    order = ["curate", "traces", "sft", "grpo-wide", "grpo-tight", "evaluate"]
    assert list(summary["stages"]) == order
    assert fakes["grpo"].stages == ["grpo-wide", "grpo-tight"]
    # The Prefect run graph: one task run per phase, named by its stage, the second fed by the first.
    with _client() as client:
        task_runs = client.read_task_runs(flow_run_filter=_flow_run_filter(state.state_details.flow_run_id))
        names = {t.name for t in task_runs}
        assert {"grpo-wide", "grpo-tight"} <= names and "grpo" not in names, names
        tight = next(t for t in task_runs if t.name == "grpo-tight")
        wide = next(t for t in task_runs if t.name == "grpo-wide")
        upstream = {str(i.id) for inputs in tight.task_inputs.values() for i in inputs if hasattr(i, "id")}
        assert str(wide.id) in upstream
    # MLflow: one nested run per phase; each phase got the manifests it depends on (phase 2: phase 1's)
    (parent,) = _parent_runs(cfg)
    children = {c.data.tags["swerl.stage"] for c in _children(cfg, parent.info.run_id)}
    assert children == set(order)
    from swerl.pipeline import store_for

    store = store_for(cfg)

    def inputs(stage: str, outcome: dict[str, Any]) -> list[str]:
        manifest = load_manifest(store, stage, outcome["manifest"].rsplit("/", 2)[-2])
        assert manifest is not None
        artifact = "grpo.json" if stage.startswith("grpo") else f"{stage}.json"  # FakeStage's, named by its fake
        return list(store.read_json(store.rel_of(manifest.artifact(artifact).uri))["inputs"])

    got = {stage: inputs(stage, outcome) for stage, outcome in summary["stages"].items()}
    assert got["grpo-wide"] == ["curate", "sft"] and got["grpo-tight"] == ["curate", "grpo-wide", "sft"]
    assert got["evaluate"] == ["curate", "grpo-tight", "grpo-wide", "sft"]

    # Phase 2's learning rate changes: phase 2 and the evaluation rerun, nothing before them.
    before = {name: fake.calls for name, fake in fakes.items()}
    summary2 = _run(phased(5e-6)).result()
    ran = [stage for stage, outcome in summary2["stages"].items() if not outcome["skipped"]]
    assert ran == ["grpo-tight", "evaluate"]
    assert fakes["grpo"].stages[-1:] == ["grpo-tight"] and fakes["grpo"].calls == before["grpo"] + 1
    assert {name: fake.calls - before[name] for name, fake in fakes.items()} == {
        "curate": 0,
        "traces": 0,
        "sft": 0,
        "grpo": 1,
        "evaluate": 1,
    }
    # --force on a phase reruns it and what follows
    summary3 = _run(phased(5e-6), force=["grpo-tight"]).result()
    assert [s for s, o in summary3["stages"].items() if not o["skipped"]] == ["grpo-tight", "evaluate"]


def _flow_run_logs(flow_run_id: UUID) -> list[str]:
    """What the Prefect UI shows for a flow run (its logs as the server stored them)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)  # logs are sent in batches by a background worker
    with _client() as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


def _flow_run_filter(flow_run_id: UUID):  # type: ignore[no-untyped-def]
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))


def test_serve_deployments_register_with_schedule_and_form(prefect_api: str, tmp_path: Path) -> None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from flows.deploy import build_deployments
    from swerl.config import load_config

    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(repo / "configs" / "local.yaml", ["serve.eval_cron=15 4 * * 1", "serve.timezone=Europe/Paris"])
    ids = {d.name: d.apply() for d in build_deployments(cfg)}
    assert set(ids) == {"local-pipeline", "local-evaluate"}

    with _client() as client:
        evaluate = client.read_deployment(ids["local-evaluate"])
        pipeline = client.read_deployment(ids["local-pipeline"])
        found = client.read_deployments(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=list(ids.values())))
        )
        assert {d.name for d in found} == {"local-pipeline", "local-evaluate"}

    # The evaluation runs on the configured cron, in the configured time zone; the pipeline runs on demand.
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in evaluate.schedules] == [
        ("15 4 * * 1", "Europe/Paris", True)
    ]
    assert pipeline.schedules == []
    assert set(evaluate.tags) == {"swerl", "evaluation"}
    # Both carry the resolved config as their default parameters, less the services' and serve's settings.
    hidden = {"serve", "services"}
    assert pipeline.parameters["config"] == cfg.model_dump(mode="json", by_alias=True, exclude=hidden)
    assert PipelineConfig.model_validate(evaluate.parameters["config"]) == cfg.model_copy(
        update={name: type(getattr(cfg, name))() for name in hidden}
    )

    # The pipeline's parameter schema describes the config model, so the UI renders a form for it.
    schema = pipeline.parameter_openapi_schema
    assert set(schema["properties"]) == {"config", "force"}
    definitions = schema.get("definitions") or schema.get("$defs")
    config_ref = json.dumps(schema["properties"]["config"])
    assert "PipelineConfig" in config_ref
    form = definitions["PipelineConfig"]["properties"]
    assert set(form) == set(PipelineConfig.model_fields) - hidden  # no field that a run never reads
    # What a user edits first comes first: the run, the budgets and model (sft, grpo), the data, the evaluation.
    assert list(form)[:5] == ["run", "sft", "grpo", "curate", "evaluate"]
    assert list(definitions["SFTConfig"]["properties"])[:2] == ["max_steps", "time_budget_s"]
    # Every field is described from its docstring (a field documented together with the ones above it shares
    # their docstring, which pydantic gives the last of them).
    described = [p for d in definitions.values() for p in d.get("properties", {}).values() if p.get("description")]
    total = [p for d in definitions.values() for p in d.get("properties", {}).values()]
    assert len(described) >= 0.9 * len(total), (len(described), len(total))
    assert definitions["SFTConfig"]["properties"]["max_steps"]["description"].startswith("Optimizer steps")
    curate_fields = set(definitions["CurateConfig"]["properties"])
    assert {"repos", "modifiers", "validation_workers", "sandbox"} <= curate_fields
    # force: stage names (a GRPO phase's grpo-NAME depends on the config), each named in its description
    force = schema["properties"]["force"]
    assert "array" in json.dumps(force) and all(stage in force["description"] for stage in STAGES), force


def test_swerl_curate_runs_only_curate_and_follows_the_repository_contents(
    prefect_api: str,
    cfg: PipelineConfig,
    fakes: dict[str, FakeStage],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from swerl.cli import main

    repo = tmp_path / "mine"
    repo.mkdir()
    (repo / "mod.py").write_text("X = 1\n")
    cfg.curate.repos = [{"path": str(repo), "install": ["hypothesis"]}]  # type: ignore[list-item]
    config = tmp_path / "curate.yaml"
    config.write_text(dump_config(cfg))

    def curate() -> dict[str, Any]:
        assert main(["curate", str(config)]) == 0
        return json.loads(capsys.readouterr().out)

    first = curate()
    assert fakes["curate"].calls == 1 and all(fakes[s].calls == 0 for s in STAGES if s != "curate")
    assert list(first["stages"]) == ["curate"] and first["stages"]["curate"]["skipped"] is False
    assert curate()["stages"]["curate"]["skipped"] is True  # unchanged repository: skipped
    (repo / "mod.py").write_text("X = 2\n")
    changed = curate()  # changed repository: curate reruns under a new key
    assert changed["stages"]["curate"]["skipped"] is False and fakes["curate"].calls == 2
    assert changed["stages"]["curate"]["manifest"] != first["stages"]["curate"]["manifest"]


def test_swerl_records_reach_the_flow_run_logs_from_any_thread_and_prints_do_not(
    prefect_api: str, cfg: PipelineConfig, fakes: dict[str, FakeStage], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow-run process started by a worker, a schedule or the UI never runs the CLI's logging set-up: the flow sets
    up swerl's logger itself. The swerl logger starts here as such a process has it (no level: WARNING from root)."""
    import logging
    import threading

    import swerl.stages.curate

    swerl_logger = logging.getLogger("swerl")
    monkeypatch.setattr(swerl_logger, "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)
    fake = fakes["curate"]

    def curate(cfg_: Any, ctx: StageContext) -> StageResult:
        logging.getLogger("swerl.stages.curate").info("curate-main-thread-record")
        worker = threading.Thread(target=lambda: logging.getLogger("swerl.rollout").info("curate-plain-thread-record"))
        worker.start()
        worker.join()
        logging.getLogger("swerl.stages.curate").debug("curate-debug-record")
        print("curate-printed-line")  # a library's print: not the run's log
        return fake(cfg_, ctx)

    monkeypatch.setattr(swerl.stages.curate, "run_curate", curate)
    state = _run(cfg)
    assert state.is_completed(), state
    logs = "\n".join(_flow_run_logs(state.state_details.flow_run_id))
    assert "curate-main-thread-record" in logs, logs
    assert "curate-plain-thread-record" in logs, logs
    assert "stage curate: running" in logs and "stage evaluate: done" in logs  # the stage runner's own lines
    assert "curate-debug-record" not in logs  # INFO and above
    assert "curate-printed-line" not in logs  # no print capture
    # The flow run is named by run.name (a deployment's when its parameters leave it out: tests/cli/test_deployments.py)
    with _client() as client:
        assert client.read_flow_run(state.state_details.flow_run_id).name == "flowtest"
