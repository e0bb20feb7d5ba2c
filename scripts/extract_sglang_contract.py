"""Extract SGLang's request definitions from its wheel (no import, no GPU stack) into a small JSON contract.

    pip download sglang==0.5.23 --no-deps -d ~/.cache/swerl/wheels
    python scripts/extract_sglang_contract.py ~/.cache/swerl/wheels/sglang-0.5.23-*.whl \
        tests/fixtures/sglang_contract.json

The fields (name, annotation source, required) of the request classes swerl's engine client sends are read with
`ast` from sglang/srt/managers/io_struct.py and sglang/srt/sampling/sampling_params.py inside the wheel, and so
are the keys of a meta_info.weight_versions span (sglang/srt/utils/weight_versions.py:
add_weight_versions_to_meta_info); the wheel's version and sha256 are recorded. tests/engine/test_engine_contract.py
validates the client's payloads against the JSON, and re-extracts from the wheel when it is in the local cache.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

SOURCES = {
    "sglang/srt/managers/io_struct.py": [
        "GenerateReqInput",
        "UpdateWeightFromDiskReqInput",
        "PauseGenerationReqInput",
        "ContinueGenerationReqInput",
        "InitWeightsUpdateGroupReqInput",
        "DestroyWeightsUpdateGroupReqInput",
        "BeginWeightUpdateReqInput",
        "EndWeightUpdateReqInput",
        "UpdateWeightsFromDistributedReqInput",
    ],
    "sglang/srt/sampling/sampling_params.py": ["SamplingParams"],
}


RESPONSE_SOURCES = {"weight_version_span": ("sglang/srt/utils/weight_versions.py", "add_weight_versions_to_meta_info")}
"""Response shapes: the string keys of the dict literals a function builds."""


def dict_keys(tree: ast.Module, function: str) -> list[str]:
    """The string keys of every dict literal in a top-level function, in source order."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return [
                key.value
                for child in ast.walk(node)
                if isinstance(child, ast.Dict)
                for key in child.keys
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
            ]
    raise ValueError(f"no function {function} in the module")


def class_fields(tree: ast.Module) -> dict[str, tuple[list[str], dict[str, dict[str, Any]]]]:
    """Every top-level class: (base class names, its own annotated fields)."""
    classes = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(base) for base in node.bases]
        fields: dict[str, dict[str, Any]] = {}
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                annotation = ast.unparse(item.annotation)
                if annotation.startswith("ClassVar"):
                    continue
                fields[item.target.id] = {"annotation": annotation, "required": item.value is None}
        classes[node.name] = (bases, fields)
    return classes


def resolved_fields(classes: dict[str, tuple[list[str], dict[str, dict[str, Any]]]], name: str) -> dict[str, Any]:
    """A class's fields including those of its bases defined in the same module (BaseReq's rid, ...)."""
    bases, own = classes[name]
    fields: dict[str, Any] = {}
    for base in bases:
        if base in classes:
            fields |= resolved_fields(classes, base)
    return fields | own


def extract(wheel: Path) -> dict[str, Any]:
    name_parts = wheel.name.split("-")
    if name_parts[0] != "sglang":
        raise ValueError(f"{wheel} is not an sglang wheel")
    contract: dict[str, Any] = {
        "sglang_version": name_parts[1],
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "classes": {},
        "responses": {},
    }
    with zipfile.ZipFile(wheel) as archive:
        for source, wanted in SOURCES.items():
            classes = class_fields(ast.parse(archive.read(source).decode()))
            for cls in wanted:
                contract["classes"][cls] = {"source": source, "fields": resolved_fields(classes, cls)}
        for shape, (source, function) in RESPONSE_SOURCES.items():
            keys = dict_keys(ast.parse(archive.read(source).decode()), function)
            contract["responses"][shape] = {"source": f"{source}:{function}", "keys": keys}
    return contract


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    contract = extract(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps(contract, indent=1, sort_keys=True) + "\n")
    print(f"sglang {contract['sglang_version']}: {sum(len(c['fields']) for c in contract['classes'].values())} fields")


if __name__ == "__main__":
    main()
