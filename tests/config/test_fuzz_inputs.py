"""Fuzzed inputs (dataset rows, trajectory rows, config dicts and files, JSONL files) give a clear error naming the
problem (ConfigError, ValueError, RowError, a pydantic ValidationError, which is a ValueError) or a valid object,
never another exception type."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swerl.config import ConfigError, PipelineConfig, load_config
from swerl.data.loaders import RowError, read_rows, row_to_task, rows_to_tasks
from swerl.data.schema import TaskInstance, parse_test_list
from swerl.trajectory import EpisodeStatus, Trajectory

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

text = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\x00", "\ud800", "[", "[[[[", "null", "1" * 5000]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=10,
)


# ----------------------------------------------------------------------------------------------------------------
# Dataset rows

ROW_KEYS = [
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "test_patch",
    "image_name",
    "difficulty",
    "extra",
]
GOOD_ROW: dict[str, Any] = {
    "instance_id": "o__r-1",
    "repo": "o/r",
    "base_commit": "abc1234",
    "patch": "diff",
    "problem_statement": "it breaks",
    "FAIL_TO_PASS": '["t.py::test_a"]',
}
rows = st.one_of(
    st.dictionaries(st.sampled_from(ROW_KEYS), values, max_size=len(ROW_KEYS)),
    st.dictionaries(st.sampled_from(ROW_KEYS), values, max_size=4).map(lambda bad: {**GOOD_ROW, **bad}),
)


# The columns of the other sources (swerl/data/sources.py), over rows of every schema.
SOURCE_KEYS = [
    *ROW_KEYS,
    "eval_script",
    "image",
    "log_parser",
    "version",
    "dockerhub_tag",
    "fail_to_pass",
    "requirements",
    "interface",
    "install_config",
    "docker_image",
    "patch_kind",
    "source",
]
source_rows = st.one_of(
    rows,
    st.dictionaries(st.sampled_from(SOURCE_KEYS), values, max_size=6).map(lambda bad: {**GOOD_ROW, **bad}),
)


@FUZZ
@given(source_rows, st.sampled_from(["swesmith", "swebench", "swebench_pro", "swerebench", "swerl"]))
def test_dataset_rows_give_a_task_or_a_row_error(row: dict[str, Any], schema: str) -> None:
    try:
        task = row_to_task(row, schema, "fuzz", "train", 7)  # type: ignore[arg-type]
    except RowError as exc:
        assert exc.rejection.row == 7 and exc.rejection.field
        return
    assert isinstance(task, TaskInstance) and task.FAIL_TO_PASS


@FUZZ
@given(st.lists(rows, max_size=5))
def test_row_batches_never_raise_unless_strict(batch: list[dict[str, Any]]) -> None:
    tasks, report = rows_to_tasks(batch, "swebench", "fuzz")
    assert report.rows == len(batch) and report.accepted == len(tasks) == len(batch) - len(report.rejected)


@pytest.mark.parametrize("value", ["[" * 100_000, "1" * 5000, "[1, 2]", '"x"', "{}", "nan"])
def test_test_lists_that_are_not_lists_are_value_errors(value: str) -> None:
    with pytest.raises(ValueError, match="test ids"):
        parse_test_list(value)


# ----------------------------------------------------------------------------------------------------------------
# Trajectory rows

GOOD_TRAJECTORY: dict[str, Any] = {
    "task_id": "t",
    "status": "resolved",
    "reward": 1.0,
    "prompt_tokens": 1,
    "token_ids": [1, 2],
    "loss_mask": [0, 1],
    "behaviour_logprobs": [0.0, -0.5],
    "token_weight_versions": [-1, 0],
}
TRAJECTORY_KEYS = [*GOOD_TRAJECTORY, "attempt", "timings", "infra_cause", "messages", "patch", "bogus"]
trajectories = st.one_of(
    st.dictionaries(st.sampled_from(TRAJECTORY_KEYS), values, max_size=6).map(lambda bad: {**GOOD_TRAJECTORY, **bad}),
    st.dictionaries(st.sampled_from(TRAJECTORY_KEYS), values),
)


@FUZZ
@given(trajectories)
def test_trajectory_rows_validate_or_raise_value_error(row: dict[str, Any]) -> None:
    try:
        trajectory = Trajectory.model_validate(row)
    except ValueError:
        pass
    else:
        assert trajectory.status in EpisodeStatus
        assert all(math.isfinite(x) for x in trajectory.behaviour_logprobs)
        assert trajectory.reward is None or math.isfinite(trajectory.reward)
    try:
        body = json.dumps(row, allow_nan=True)
    except (ValueError, TypeError):
        return
    with contextlib.suppress(ValueError):
        Trajectory.model_validate_json(body)


@FUZZ
@given(st.binary(max_size=300))
def test_trajectory_json_bytes_validate_or_raise_value_error(junk: bytes) -> None:
    with pytest.raises(ValueError):
        Trajectory.model_validate_json(b'{"task_id": ' + junk)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rewards_and_logprobs_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        Trajectory.model_validate({**GOOD_TRAJECTORY, "reward": bad})
    with pytest.raises(ValueError, match="finite"):
        Trajectory.model_validate({**GOOD_TRAJECTORY, "behaviour_logprobs": [0.0, bad]})


# ----------------------------------------------------------------------------------------------------------------
# Config


SECTIONS = list(PipelineConfig.model_fields)


def _field_paths(model: Any, prefix: str = "") -> list[str]:
    paths: list[str] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            paths += _field_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


FIELD_PATHS = _field_paths(PipelineConfig)
yaml_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _nest(path: str, value: Any) -> dict[str, Any]:
    keys = path.split(".")
    node: dict[str, Any] = {}
    root = node
    for key in keys[:-1]:
        node[key] = {}
        node = node[key]
    node[keys[-1]] = value
    return root


def _merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


config_dicts = st.lists(st.tuples(st.sampled_from(FIELD_PATHS), yaml_values), max_size=4).map(
    lambda pairs: _merge({}, {}) if not pairs else _reduce(pairs)
)


def _reduce(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for path, value in pairs:
        _merge(data, _nest(path, value))
    return data


def _check_config(data: Any, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    try:
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
    except (yaml.YAMLError, UnicodeEncodeError):
        return
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        assert str(exc).startswith("invalid config") or "config file" in str(exc)
        return
    assert isinstance(cfg, PipelineConfig)


@FUZZ
@given(config_dicts)
def test_config_dicts_load_or_raise_config_error(tmp_path: Path, data: dict[str, Any]) -> None:
    _check_config(data, tmp_path)


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(SECTIONS), text), values, max_size=4))
def test_arbitrary_config_trees_load_or_raise_config_error(tmp_path: Path, data: dict[str, Any]) -> None:
    _check_config(data, tmp_path)


@FUZZ
@given(st.sampled_from(FIELD_PATHS), yaml_values)
def test_overrides_load_or_raise_config_error(path: str, value: Any) -> None:
    try:
        rendered = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    except yaml.YAMLError:
        return
    with contextlib.suppress(ConfigError):
        load_config(None, [f"{path}={rendered}"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("sft.time_budget_s=.inf", "sft.time_budget_s: Input should be a finite number"),
        ("grpo.schedule.time_budget_s=.inf", "finite number"),
        ("grpo.algorithm.lr=.nan", "grpo.algorithm.lr: Input should be a finite number"),
        ("grpo.algorithm.grad_clip=-.inf", "finite number"),
        ("agent.command_timeout_s=.nan", "finite number"),
        ("curate.validation_workers=true", "curate.validation_workers: Value error, must be a number, not"),
        ("grpo.schedule.steps=false", "must be a number"),
        ("sft.max_grad_norm=true", "must be a number"),
        ("agent.max_command_bytes=200000", "agent.max_command_bytes"),
    ],
)
def test_small_config_mistakes_are_refused_by_name(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match="invalid config") as raised:
        load_config(None, [override])
    assert message in str(raised.value)


def test_booleans_stay_booleans_and_numbers_numbers() -> None:
    cfg = load_config(None, ["curate.decontaminate=false", "curate.validation_workers=3", "sft.lr=1"])
    assert cfg.curate.decontaminate is False and cfg.curate.validation_workers == 3 and cfg.sft.lr == 1.0


# ----------------------------------------------------------------------------------------------------------------
# JSONL files


def test_a_broken_jsonl_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    good = json.dumps(GOOD_ROW)
    path.write_text(f"{good}\n{good}\n{good[:-5]}\n{good}\n")
    with pytest.raises(ValueError, match=rf"{path}:3: not valid JSON"):
        read_rows(str(path))
    path.write_text(f"{good}\n[1, 2]\n")
    with pytest.raises(ValueError, match=rf"{path}:2: a row must be a JSON object"):
        read_rows(str(path))
    path.write_bytes(good.encode() + b"\n" + b'{"a": "\xff"}\n')
    with pytest.raises(ValueError, match=rf"{path}:2: not UTF-8"):
        read_rows(str(path))
    directory = tmp_path / "dir"
    directory.mkdir()
    (directory / "a.jsonl").write_text(good + "\n")
    (directory / "b.jsonl").write_text("\n\n{oops\n")
    with pytest.raises(ValueError, match=r"b\.jsonl:3: not valid JSON"):
        read_rows(str(directory))


def test_good_jsonl_and_json_still_load(tmp_path: Path) -> None:
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps(GOOD_ROW) + "\n\n" + json.dumps({**GOOD_ROW, "instance_id": "o__r-2"}) + "\n")
    assert [row["instance_id"] for row in read_rows(str(jsonl))] == ["o__r-1", "o__r-2"]
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([GOOD_ROW]))
    assert read_rows(str(array))[0]["instance_id"] == "o__r-1"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.just(json.dumps(GOOD_ROW)), st.text(max_size=30)), min_size=1, max_size=4))
def test_fuzzed_jsonl_files_load_or_name_the_file(tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "fuzz.jsonl"
    try:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except UnicodeEncodeError:
        return
    try:
        read_rows(str(path))
    except ValueError as exc:
        assert str(path) in str(exc)
