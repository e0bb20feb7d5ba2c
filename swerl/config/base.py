"""What every config section shares: strict validation, the deployment form's schema, ConfigError, deep_merge.

Every limit the pipeline obeys is a field of a section (swerl.config's submodules), bounded and documented; nothing
is left to a library default.
"""

from __future__ import annotations

from typing import Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


def _numeric_annotation(annotation: Any) -> bool:
    """Whether a field's type is a number (int or float, maybe optional), not a boolean."""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    return any(_numeric_annotation(arg) for arg in get_args(annotation) if arg is not type(None))


class StrictModel(BaseModel):
    """Base for every config section: unknown keys and wrong types are errors.

    Numbers are strict where YAML would let a mistake through: a float must be finite (`.inf`, `.nan` are
    refused: a budget or a rate of infinity is written as the field's None, where it has one), and a boolean is
    not a number (`workers: true` is an error, not 1)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        frozen=False,
        allow_inf_nan=False,
        use_attribute_docstrings=True,  # each field's docstring is its description (the Prefect form shows it)
        json_schema_extra=lambda schema, cls: _form_schema(schema, cls),
    )

    form_first: ClassVar[tuple[str, ...]] = ()
    """Fields the deployment form shows first, in this order (the rest follow in definition order)."""
    form_hidden: ClassVar[tuple[str, ...]] = ()
    """Fields left out of the deployment form and of a deployment's parameters (settings of the services and of
    `swerl serve`, which a run never reads)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric_annotation(field.annotation):
                raise ValueError(f"must be a number, not the boolean {v}")
        return v


def _form_schema(schema: dict[str, Any], cls: Any) -> None:
    """The JSON schema Prefect renders as the deployment form: `form_first` fields first, `form_hidden` ones out."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return
    first = [k for k in getattr(cls, "form_first", ()) if k in props]
    hidden = set(getattr(cls, "form_hidden", ()))
    ordered = {k: props[k] for k in first} | {k: v for k, v in props.items() if k not in first}
    schema["properties"] = {k: v for k, v in ordered.items() if k not in hidden}
    if "required" in schema:
        schema["required"] = [k for k in schema["required"] if k not in hidden]


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` in place, section by section (a list or a value replaces the base's whole); neither is
    modified. What a GRPO phase and a partial run parameter do to a config."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
