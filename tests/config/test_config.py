"""Config files load and validate; every error names its dotted key; the resolved config round-trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from swerl.cli import main
from swerl.config import ConfigError, PipelineConfig, load_config
from swerl.config.load import apply_overrides, config_hash, dump_config, parse_override

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted((REPO / "configs").glob("*.yaml"))


def test_there_are_config_files() -> None:
    names = {p.name for p in CONFIG_FILES}
    assert {"local.yaml", "qwen3-30b-a3b.yaml"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_file_loads_and_validates(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    cfg = load_config(path)
    assert isinstance(cfg, PipelineConfig)
    # What the file says is what the model holds (nothing silently dropped or defaulted over).
    assert cfg.run.name == raw["run"]["name"]
    assert cfg.storage.root == raw["storage"]["root"]
    assert cfg.tracking.experiment == raw["tracking"]["experiment"]
    assert cfg.serve.eval_cron == raw["serve"]["eval_cron"]


def test_recipe_config_reads_published_datasets() -> None:
    cfg = load_config(REPO / "configs" / "qwen3-30b-a3b.yaml")
    assert cfg.curate.repos == []
    assert [(d.schema_name, d.path) for d in cfg.curate.datasets] == [("swesmith", "SWE-bench/SWE-smith")]
    assert cfg.curate.decontamination_sets[0].schema_name == "swebench"
    assert cfg.storage.max_pool_connections == 64
    # GRPO as the recipe ran it: two phases, the tighter trajectory cap second, 145 steps in all
    explore, capped = cfg.grpo_phases()
    assert (explore.stage, capped.stage) == ("grpo-explore", "grpo-capped")
    assert explore.steps + capped.steps == 145
    assert capped.agent.max_turns < explore.agent.max_turns
    assert capped.agent.max_trajectory_tokens < explore.agent.max_trajectory_tokens <= cfg.engine.max_context_tokens
    assert capped.grpo.algorithm == explore.grpo.algorithm == cfg.grpo.algorithm


def test_defaults_without_a_file() -> None:
    assert load_config(None) == PipelineConfig()


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD_VALUES = [
    # (override, dotted key the error must name)
    ("curate.bogus=1", "curate.bogus"),
    ("bogus_section.x=1", "bogus_section"),
    ("curate.max_candidates_per_repo=many", "curate.max_candidates_per_repo"),
    ("curate.sandbox.memory_mb=1", "curate.sandbox.memory_mb"),
    ("curate.sandbox.timeout_s=0", "curate.sandbox.timeout_s"),
    ("curate.modifiers=[not_a_modifier]", "curate.modifiers.0"),
    ("curate.modifiers=[]", "curate.modifiers"),
    ("storage.root=ftp://host/x", "storage.root"),
    ("run.name=has space", "run.name"),
    ("run.seed=-1", "run.seed"),
    ("services.prefect_port=80", "services.prefect_port"),
    ("curate.decontaminate=[1, 2]", "curate.decontaminate"),
    ("curate.datasets=[{schema: nope, path: x}]", "curate.datasets.0.schema"),
    ("curate.datasets=[{schema: swesmith, path: x, extra: 1}]", "curate.datasets.0.extra"),
]


@pytest.mark.parametrize(("override", "key"), BAD_VALUES)
def test_bad_override_names_the_dotted_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "configs" / "local.yaml", [override])
    assert f"  {key}:" in str(err.value), str(err.value)


@pytest.mark.parametrize(("override", "key"), BAD_VALUES)
def test_bad_value_in_a_file_names_the_dotted_key(tmp_path: Path, override: str, key: str) -> None:
    data = apply_overrides(yaml.safe_load((REPO / "configs" / "local.yaml").read_text()), [override])
    cfg_file = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_config(cfg_file)
    message = str(err.value)
    assert f"  {key}:" in message
    assert str(cfg_file) in message  # the source is named too


def test_only_the_bad_keys_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["run.seed=-1", "curate.bogus=2"])
    lines = str(err.value).splitlines()[1:]
    assert sorted(line.split(":")[0].strip() for line in lines) == ["curate.bogus", "run.seed"]


def test_file_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad_yaml)
    a_list = tmp_path / "list.yaml"
    a_list.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(a_list)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == PipelineConfig()


@pytest.mark.parametrize(
    ("item", "path", "value"),
    [
        ("run.seed=7", ["run", "seed"], 7),
        ("curate.sandbox.timeout_s=2.5", ["curate", "sandbox", "timeout_s"], 2.5),
        ("curate.decontaminate=false", ["curate", "decontaminate"], False),
        ("curate.eval_repos=[a, b]", ["curate", "eval_repos"], ["a", "b"]),
        ("storage.s3_endpoint_url=null", ["storage", "s3_endpoint_url"], None),
        ("run.name=", ["run", "name"], ""),
        ("run.name=a=b", ["run", "name"], "a=b"),
        (" run.name =x", ["run", "name"], "x"),
        ("serve.eval_cron='0 3 * * *'", ["serve", "eval_cron"], "0 3 * * *"),
    ],
)
def test_parse_override(item: str, path: list[str], value: object) -> None:
    assert parse_override(item) == (path, value)


@pytest.mark.parametrize("item", ["no-equals-sign", "=3", "...=3", "run.name=[unclosed"])
def test_malformed_override_is_a_config_error(item: str) -> None:
    with pytest.raises(ConfigError):
        parse_override(item)


def test_invalid_yaml_override_names_its_key() -> None:
    with pytest.raises(ConfigError, match="override run.name"):
        parse_override("run.name=[unclosed")


def test_override_into_a_scalar_is_rejected() -> None:
    with pytest.raises(ConfigError, match="run.name is not a section"):
        load_config(REPO / "configs" / "local.yaml", ["run.name.deeper=1"])
    with pytest.raises(ConfigError, match="  run.name: "):  # without a file, validation names it
        load_config(None, ["run.name.deeper=1"])


def test_overrides_apply_on_top_of_the_file() -> None:
    base = load_config(REPO / "configs" / "local.yaml")
    cfg = load_config(
        REPO / "configs" / "local.yaml",
        ["curate.validation_workers=5", "curate.sandbox.memory_mb=2048", "run.seed=3", "run.seed=4"],
    )
    assert cfg.curate.validation_workers == 5
    assert cfg.curate.sandbox.memory_mb == 2048
    assert cfg.run.seed == 4  # the last override wins
    # everything not overridden keeps the file's value
    assert cfg.curate.max_candidates_per_repo == base.curate.max_candidates_per_repo == 3
    assert cfg.curate.micro == base.curate.micro is not None
    assert cfg.curate.sandbox.file_size_mb == base.curate.sandbox.file_size_mb == 64


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_resolved_config_round_trips(tmp_path: Path, path: Path) -> None:
    cfg = load_config(path, ["run.seed=11"])
    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(dump_config(cfg))
    again = load_config(dumped)
    assert again == cfg
    assert config_hash(again) == config_hash(cfg)
    assert dump_config(again) == dump_config(cfg)


def test_config_hash_is_stable_and_sensitive() -> None:
    a, b = load_config(None), load_config(None)
    assert config_hash(a) == config_hash(b)
    assert config_hash(a.curate) != config_hash(load_config(None, ["curate.max_candidates_per_repo=7"]).curate)
    # only the section matters for a stage's hash
    assert config_hash(a.curate) == config_hash(load_config(None, ["run.name=other"]).curate)


def test_assignment_is_validated() -> None:
    cfg = PipelineConfig()
    with pytest.raises(ValueError, match="memory_mb"):
        cfg.curate.sandbox.memory_mb = 1


# ---- the CLI --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["config", "run", "serve"])
def test_cli_bad_override_exits_2_naming_the_key(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([command, str(REPO / "configs" / "local.yaml"), "--set", "curate.sandbox.memory_mb=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "curate.sandbox.memory_mb" in err
    assert err.startswith("swerl: invalid config")


def test_cli_bad_file_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_file = _write(tmp_path, {"curate": {"max_tasks_per_repo": 0}})
    assert main(["run", str(cfg_file)]) == 2
    assert "curate.max_tasks_per_repo" in capsys.readouterr().err
    assert main(["config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_rejects_unknown_force_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "configs" / "local.yaml"), "--force", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "['curate', 'traces', 'sft', 'grpo-explore', 'grpo-capped', 'evaluate']" in err


PHASES = [
    {"name": "wide", "steps": 3},
    {
        "name": "tight",
        "steps": 2,
        "reset_optimizer": True,
        "agent": {"max_trajectory_tokens": 512},
        "grpo": {"algorithm": {"lr": 2.0e-5}, "rollout": {"max_staleness": 1}},
        "tasks": {"difficulties": ["easy"]},
    },
]


def phased(phases: Any = PHASES, **sections: Any) -> dict[str, Any]:
    data = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    data["grpo"]["phases"] = phases
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return dict(data)


def test_grpo_phases_resolve_against_the_base_settings() -> None:
    cfg = PipelineConfig.model_validate(phased())
    wide, tight = cfg.grpo_phases()
    assert (wide.stage, wide.index, wide.steps, tight.stage, tight.steps) == (
        "grpo-wide",
        0,
        3,
        "grpo-tight",
        2,
    )
    # each phase changes what it names against the base, nothing else; the base is untouched
    assert wide.grpo.model_dump(exclude={"phases", "schedule"}) == cfg.grpo.model_dump(exclude={"phases", "schedule"})
    assert wide.agent == cfg.agent and wide.engine == cfg.engine
    assert tight.agent.max_trajectory_tokens == 512 and tight.agent.max_turns == cfg.agent.max_turns
    assert tight.grpo.algorithm.lr == 2.0e-5 and tight.grpo.algorithm.weight_decay == cfg.grpo.algorithm.weight_decay
    assert (
        tight.grpo.rollout.max_staleness == 1
        and tight.grpo.rollout.attempts_per_task == cfg.grpo.rollout.attempts_per_task
    )
    assert tight.grpo.schedule.steps == 2 and tight.grpo.phases is None and tight.reset_optimizer
    assert (
        tight.tasks is not None
        and tight.tasks.matches("easy", "r", None)
        and not tight.tasks.matches("hard", "r", None)
    )
    assert cfg.agent.max_trajectory_tokens != 512 and cfg.grpo.algorithm.lr != 2.0e-5
    # no phases: one, the stage `grpo`, with the base settings
    base = load_config(REPO / "configs" / "local.yaml", ["grpo.phases=null"])
    [only] = base.grpo_phases()
    assert (only.stage, only.steps, only.grpo, only.agent) == (
        "grpo",
        base.grpo.schedule.steps,
        base.grpo,
        base.agent,
    )
    # a phase is forced with every stage after it; `grpo` forces them all
    from swerl.pipeline import pipeline_stages, stages_to_force

    assert pipeline_stages(cfg) == ["curate", "traces", "sft", "grpo-wide", "grpo-tight", "evaluate"]
    assert stages_to_force(["grpo-tight"], cfg) == {"grpo-tight", "evaluate"}
    assert stages_to_force(["grpo"], cfg) == {"grpo-wide", "grpo-tight", "evaluate"}
    with pytest.raises(ConfigError, match="grpo-nope"):
        stages_to_force(["grpo-nope"], cfg)


@pytest.mark.parametrize(
    ("phases", "sections", "message"),
    [
        ([], {}, "grpo.phases is an empty list"),
        (
            [{"name": "a", "steps": 1, "grpo": {"algorithm": {"learning_rate": 1e-5}}}],
            {},
            r"grpo.phases\[0\] \(a\): grpo.algorithm.learning_rate: Extra inputs are not permitted",
        ),
        (
            [{"name": "a", "steps": 1}, {"name": "b", "steps": 1, "agent": {"max_trajectory_tokens": 4096}}],
            {},
            r"grpo.phases\[1\] \(b\): agent.max_trajectory_tokens \(4096\) exceeds the phase's "
            r"engine.max_context_tokens",
        ),
        (
            [{"name": "a", "steps": 1, "engine": {"max_context_tokens": 256}}],
            {},
            r"grpo.phases\[0\] \(a\): agent.max_trajectory_tokens \(\d+\) exceeds the phase's "
            r"engine.max_context_tokens \(256\)",
        ),
        ([{"name": "a", "steps": 1, "grpo": {"mode": "sync"}}], {}, r"grpo.phases\[0\] \(a\): grpo.mode cannot change"),
        (
            [{"name": "a", "steps": 1, "grpo": {"schedule": {"steps": 4}}}],
            {},
            r"grpo.schedule.steps cannot change in a phase: a phase's own steps are grpo.phases\[i\].steps",
        ),
        ([{"name": "a", "steps": 1, "grpo": {"distributed": {"ranks": 2}}}], {}, "grpo.distributed cannot change"),
        (
            [{"name": "a", "steps": 1, "grpo": {"rollout": {"attempts_per_task": 1}}}],
            {},
            r"grpo.phases\[0\] \(a\): grpo.rollout.attempts_per_task: Input should be greater than or equal to 2",
        ),
        ([{"name": "a", "steps": 1}, {"name": "a", "steps": 2}], {}, r"grpo.phases\[1\] \(a\): name 'a' is used"),
        (
            [{"name": "a", "steps": 1, "tasks": {"difficulties": ["easy"]}}],
            {"grpo": {"mode": "sync", "eval": {"every": 0}, "rollout": {"probe_attempts": 0}}},
            r"grpo.phases\[0\] \(a\): tasks needs grpo.mode async",
        ),
        ([{"name": "Bad Name", "steps": 1}], {}, r"grpo.phases.0.name"),
        ([{"name": "a"}], {}, r"grpo.phases.0.steps: Field required"),
        (
            [{"name": "a", "steps": 1}],
            {"evaluate": {"checkpoints": ["sft", "grpo-b"]}},
            r"evaluate.checkpoints names GRPO phase\(s\) \['grpo-b'\] that grpo.phases does not define; "
            r"phases: \['grpo-a'\]",
        ),
    ],
)
def test_bad_grpo_phases_are_refused_naming_the_phase_and_key(
    tmp_path: Path, phases: Any, sections: dict[str, Any], message: str
) -> None:
    path = tmp_path / "phases.yaml"
    path.write_text(yaml.safe_dump(phased(phases, **sections)))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_cli_config_prints_the_resolved_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", str(REPO / "configs" / "local.yaml"), "--set", "run.seed=9"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["run"]["seed"] == 9
    assert PipelineConfig.model_validate(printed) == load_config(REPO / "configs" / "local.yaml", ["run.seed=9"])


def test_cli_as_a_process_exits_2_on_bad_config(tmp_path: Path) -> None:
    cfg_file = _write(tmp_path, {"run": {"name": "ok"}, "curate": {"sandbox": {"cpu_time_s": "lots"}}})
    proc = subprocess.run(
        [sys.executable, "-m", "swerl.cli", "run", str(cfg_file)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "curate.sandbox.cpu_time_s" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "old, new",
    [
        ("lr", "algorithm.lr"),
        ("steps", "schedule.steps"),
        ("rollout_concurrency", "rollout.concurrency"),
        ("max_in_flight", "rollout.max_in_flight"),
        ("eval_every", "eval.every"),
        ("eval_at_end", "eval.at_end"),
    ],
)
def test_a_renamed_grpo_key_is_an_error_naming_its_new_key(tmp_path: Path, old: str, new: str) -> None:
    """GRPO's settings moved into sections (schedule, rollout, algorithm, eval): an old flat key, given by --set or
    in a file, is refused with the key it is now, never silently ignored or defaulted."""
    with pytest.raises(ConfigError, match=f"grpo.{old} is now grpo.{new}"):
        load_config(None, [f"grpo.{old}=1"])
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"grpo": {old: 1}}))
    with pytest.raises(ConfigError, match=f"grpo.{old} is now grpo.{new}"):
        load_config(path)


def test_every_moved_grpo_key_points_at_an_existing_field() -> None:
    from swerl.config.grpo import GRPO_MOVED_KEYS, GRPOConfig

    for old, new in GRPO_MOVED_KEYS.items():
        section, key = new.split(".")
        assert key in type(getattr(GRPOConfig(), section)).model_fields, (old, new)


ENGINE_RENAMES = [
    ("request_timeout_s", "http.request_timeout_s"),
    ("num_engines", "launch.num_engines"),
    ("threads", "local.threads"),
    ("health_interval_s", "router.health_interval_s"),
    ("tp_size", "sglang.tp_size"),
    ("weight_update_mode", "weight_sync.update_mode"),
    ("pause_mode", "weight_sync.pause_mode"),
]


@pytest.mark.parametrize("old, new", ENGINE_RENAMES)
def test_a_renamed_engine_key_in_a_file_or_override_is_an_error_naming_its_new_key(
    tmp_path: Path, old: str, new: str
) -> None:
    """The engine section's flat keys moved into sub-sections (launch, local, http, router, sglang, weight_sync): an
    old key in a file or a --set override is refused with the key it is now, never silently ignored."""
    message = f"engine.{old} was renamed to engine.{new}"
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"engine.{old}=5"])
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"engine": {"kind": "local", old: 5}}))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


@pytest.mark.parametrize("old, new", ENGINE_RENAMES)
def test_a_renamed_engine_key_in_a_grpo_phase_is_an_error_naming_its_new_key(
    tmp_path: Path, old: str, new: str
) -> None:
    """A GRPO phase's engine changes are checked against the same table: the phase and the new key are named."""
    phases = f"grpo.phases=[{{name: a, steps: 1}}, {{name: b, steps: 1, engine: {{{old}: 5}}}}]"
    renamed = f"engine.{old} was renamed to engine.{new}"
    with pytest.raises(ConfigError, match=rf"grpo.phases\[1\] \(b\): .*{renamed}"):
        load_config(None, [phases])
    path = tmp_path / "phases.yaml"
    path.write_text(yaml.safe_dump({"grpo": {"phases": [{"name": "a", "steps": 1, "engine": {old: 5}}]}}))
    with pytest.raises(ConfigError, match=rf"grpo.phases\[0\] \(a\): .*{renamed}"):
        load_config(path)


def test_every_renamed_engine_key_points_at_an_existing_field() -> None:
    from swerl.config.engine import ENGINE_RENAMED_KEYS, EngineConfig

    for old, new in ENGINE_RENAMED_KEYS.items():
        _, section, key = new.split(".")
        assert old.split(".")[1] not in EngineConfig.model_fields, old
        assert key in type(getattr(EngineConfig(), section)).model_fields, (old, new)


def test_the_trainers_update_settings_are_exactly_grpo_algorithm() -> None:
    """One mapping, no field by hand: grpo.algorithm's fields are UpdateSettings' fields (a field added to one and
    not the other fails here), and the builder carries every value over."""
    import dataclasses

    from swerl.config.grpo import GRPOAlgorithmConfig
    from swerl.stages.grpo import update_settings
    from swerl.train.grpo_step import UpdateSettings

    assert {f.name for f in dataclasses.fields(UpdateSettings)} == set(GRPOAlgorithmConfig.model_fields)
    algorithm = GRPOAlgorithmConfig(lr=3e-5, ppo_epochs=3, mis_high=4.0, tis_level="sequence")
    assert dataclasses.asdict(update_settings(algorithm)) == algorithm.model_dump()


def test_every_config_field_has_a_description() -> None:
    """The deployment form shows each field's docstring (use_attribute_docstrings): a field without one is a bare
    input box. (pydantic gives a docstring to the field right above it only.)"""
    import typing

    missing: list[str] = []

    def walk(model: Any, prefix: str) -> None:
        for name, f in model.model_fields.items():
            if not f.description:
                missing.append(prefix + name)
            for candidate in typing.get_args(f.annotation) or (f.annotation,):
                if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
                    walk(candidate, f"{prefix}{name}.")

    walk(PipelineConfig, "")
    assert missing == []
