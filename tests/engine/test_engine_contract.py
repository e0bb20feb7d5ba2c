"""Contract: the JSON the engine client sends fits SGLang's own request definitions (pinned sglang version).

tests/fixtures/sglang_contract.json holds the fields of GenerateReqInput, SamplingParams, UpdateWeightFromDiskReqInput,
PauseGenerationReqInput, ContinueGenerationReqInput and the weight-group requests (InitWeightsUpdateGroupReqInput,
DestroyWeightsUpdateGroupReqInput, Begin/EndWeightUpdateReqInput, UpdateWeightsFromDistributedReqInput), and the
keys of a meta_info.weight_versions span, extracted with `ast` from the sglang wheel by
scripts/extract_sglang_contract.py (version and wheel sha256 recorded). Nothing is downloaded at test time; when
the wheel is in the local cache (~/.cache/swerl/wheels or $SWERL_WHEEL_DIR), the contract is re-extracted from it
and must equal the vendored one.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from swerl.engine.base import GenerateRequest, GenerateResponse, SamplingParams, weight_version_spans
from swerl.engine.client import (
    generate_payload,
    init_weights_update_group_payload,
    update_weights_from_distributed_payload,
    update_weights_payload,
)

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_PATH = ROOT / "tests/fixtures/sglang_contract.json"
CONTRACT: dict[str, Any] = json.loads(CONTRACT_PATH.read_text())


def fields(cls: str) -> dict[str, dict[str, Any]]:
    return CONTRACT["classes"][cls]["fields"]  # type: ignore[no-any-return]


def matches(value: Any, annotation: ast.expr) -> bool:
    """Whether a JSON value fits a (source) type annotation; unknown names never match."""
    if isinstance(annotation, ast.Name):
        name = annotation.id
        checks = {
            "Any": lambda v: True,
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "bool": lambda v: isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
        }
        return name in checks and bool(checks[name](value))
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return value is None
    if isinstance(annotation, ast.Subscript):
        head = ast.unparse(annotation.value)
        args = list(annotation.slice.elts) if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if head == "Optional":
            return value is None or matches(value, args[0])
        if head == "Union":
            return any(matches(value, arg) for arg in args)
        if head == "Annotated":
            return matches(value, args[0])
        if head in ("List", "list", "Set", "set"):  # a set arrives as a JSON list
            return isinstance(value, list) and all(matches(item, args[0]) for item in value)
        if head in ("Dict", "dict"):
            return isinstance(value, dict) and all(matches(v, args[1]) for v in value.values())
        if head == "Literal":
            return value in [ast.literal_eval(arg) for arg in args]
    return False


def violations(payload: dict[str, Any], cls: str) -> list[str]:
    """Unknown keys, missing required fields and values that do not fit their annotations."""
    spec = fields(cls)
    problems = [f"{cls}: unknown field {key!r}" for key in payload if key not in spec]
    problems += [f"{cls}: missing {name!r}" for name, f in spec.items() if f["required"] and name not in payload]
    for key, value in payload.items():
        if key in spec and not matches(value, ast.parse(spec[key]["annotation"], mode="eval").body):
            problems.append(f"{cls}.{key}: {value!r} does not fit {spec[key]['annotation']}")
    return problems


def test_the_checker_has_teeth() -> None:
    """The type check rejects what SGLang would: a wrong type, an unknown key, a missing model_path."""
    assert violations({"input_ids": ["a"]}, "GenerateReqInput")
    assert violations({"input_ids": [1], "prompt_ids": [1]}, "GenerateReqInput")
    assert violations({"max_new_tokens": "8"}, "SamplingParams")
    assert violations({"weight_version": 3}, "UpdateWeightFromDiskReqInput")  # SGLang's version is a string
    assert violations({}, "UpdateWeightFromDiskReqInput")
    assert violations({"mode": "drain"}, "PauseGenerationReqInput")
    assert not violations({"input_ids": [1, 2], "rid": "x"}, "GenerateReqInput")


@pytest.mark.parametrize(
    "request_",
    [
        GenerateRequest(input_ids=[1, 2, 3], sampling_params=SamplingParams(max_new_tokens=8)),
        GenerateRequest(
            input_ids=list(range(100)),
            sampling_params=SamplingParams(
                max_new_tokens=4096, temperature=0.7, top_p=0.95, stop_token_ids=[7, 9], ignore_eos=True
            ),
            return_logprob=True,
            rid="group-3/1/0",
        ),
    ],
)
def test_generate_payload_fits_generate_req_input(request_: GenerateRequest) -> None:
    payload = generate_payload(request_)
    assert violations(payload, "GenerateReqInput") == []
    assert violations(payload["sampling_params"], "SamplingParams") == []
    # token in: never text; log-probs requested
    assert "text" not in payload and payload["input_ids"] == request_.input_ids
    assert payload["return_logprob"] is True


def test_weight_update_and_pause_payloads_fit() -> None:
    for flush in (True, False):
        payload = update_weights_payload("/ckpt/weights_v00000003", 3, flush_cache=flush)
        assert violations(payload, "UpdateWeightFromDiskReqInput") == [] and payload["flush_cache"] is flush
    assert update_weights_payload("/p", 3, flush_cache=True)["weight_version"] == "3"
    for mode in ("in_place", "retract"):  # the router's pause modes
        assert violations({"mode": mode}, "PauseGenerationReqInput") == []
    assert violations({}, "ContinueGenerationReqInput") == []


def test_contract_version_is_the_pinned_one() -> None:
    """The gpu extra pins the sglang version the contract was extracted from."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pins = [spec for spec in extras if re.match(r"sglang\b", spec)]
    assert pins == [f"sglang=={CONTRACT['sglang_version']}"]
    assert re.fullmatch(r"[0-9a-f]{64}", CONTRACT["wheel_sha256"])


def cached_wheel() -> Path | None:
    directories = [Path(os.environ.get("SWERL_WHEEL_DIR", "")), Path.home() / ".cache/swerl/wheels"]
    for directory in directories:
        candidate = directory / CONTRACT["wheel"]
        if str(directory) and candidate.is_file():
            return candidate
    return None


def test_reextracted_from_the_cached_wheel_equals_the_vendored_contract() -> None:
    wheel = cached_wheel()
    if wheel is None:
        pytest.skip(f"{CONTRACT['wheel']} is not in the local wheel cache (no download at test time)")
    spec = importlib.util.spec_from_file_location("extract", ROOT / "scripts/extract_sglang_contract.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.extract(wheel) == CONTRACT


def test_weight_group_payloads_fit() -> None:
    init = init_weights_update_group_payload("10.0.0.1", 29500, 1, 3, "swerl-weights", "nccl")
    assert violations(init, "InitWeightsUpdateGroupReqInput") == []
    assert violations({"group_name": "swerl-weights"}, "DestroyWeightsUpdateGroupReqInput") == []
    assert violations({}, "BeginWeightUpdateReqInput") == [] and violations({}, "EndWeightUpdateReqInput") == []
    names, dtypes, shapes = (
        ["model.norm.weight", "lm_head.weight"],
        ["bfloat16", "float32"],
        [[64], [300, 64]],
    )
    for version, flush in ((None, False), (7, True)):
        payload = update_weights_from_distributed_payload(names, dtypes, shapes, "g", version, flush_cache=flush)
        assert violations(payload, "UpdateWeightsFromDistributedReqInput") == []
        assert payload["flush_cache"] is flush and payload.get("weight_version") == (None if version is None else "7")
    assert violations(
        {"names": ["a"], "dtypes": ["float32"], "shapes": [[1.5]]}, "UpdateWeightsFromDistributedReqInput"
    )


def test_weight_version_spans_have_sglangs_shape() -> None:
    """The local engine server's spans and the parser use the keys SGLang's add_weight_versions_to_meta_info writes."""
    keys = CONTRACT["responses"]["weight_version_span"]["keys"]
    spans = weight_version_spans([3, 3, 4], 4)
    assert spans == [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}]
    assert all(list(span) == keys for span in spans)
    body = {
        "output_ids": [5, 6, 7],
        "meta_info": {
            "weight_version": "4",
            "weight_versions": spans,
            "output_token_logprobs": [[-1.0, 5, None], [-1.0, 6, None], [-1.0, 7, None]],
        },
    }
    assert GenerateResponse.from_sglang(body).output_token_weight_versions == [3, 3, 4]
