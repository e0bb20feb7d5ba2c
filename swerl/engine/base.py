"""The Engine protocol and SGLang's native /generate request and response shapes.

Token in, token out: requests carry `input_ids`, responses carry the sampled `output_ids` with their log-probs
under the policy that sampled them and the weight version of that policy. Text is never re-tokenized.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(BaseModel):
    """The subset of SGLang's sampling_params swerl uses."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    """Keep generating past the model's end-of-sequence token (stop_token_ids still stop)."""


class GenerateRequest(BaseModel):
    """Body of SGLang's native POST /generate, token ids only."""

    model_config = ConfigDict(extra="forbid")

    input_ids: list[int] = Field(min_length=1)
    sampling_params: SamplingParams
    return_logprob: bool = True
    rid: str | None = None
    """Request id; the router also uses it for stickiness (prefix-cache reuse across a trajectory's turns)."""


class GenerateResponse(BaseModel):
    """What swerl keeps of a /generate response."""

    output_ids: list[int]
    output_token_logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    prompt_tokens: int
    completion_tokens: int
    output_token_weight_versions: list[int] | None = None
    """Weight version that sampled each output token; None where the engine does not say (SGLang)."""

    def to_sglang(self, rid: str | None = None) -> dict[str, Any]:
        """The response in SGLang's native JSON shape (meta_info.output_token_logprobs as [logprob, id, None])."""
        return {
            "output_ids": self.output_ids,
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": self.finish_reason},
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "output_token_logprobs": [
                    [lp, tok, None] for lp, tok in zip(self.output_token_logprobs, self.output_ids, strict=True)
                ],
                "weight_version": str(self.weight_version),
                **(
                    {
                        "weight_versions": weight_version_spans(self.output_token_weight_versions, self.weight_version),
                        "output_token_weight_versions": self.output_token_weight_versions,
                    }
                    if self.output_token_weight_versions is not None
                    else {}
                ),
            },
        }

    @classmethod
    def from_sglang(cls, body: dict[str, Any], default_weight_version: int = 0) -> GenerateResponse:
        """Parse SGLang's native /generate JSON (finish_reason may be a dict or null while streaming).

        default_weight_version is used where the server does not report meta_info.weight_version. Per-token
        versions come from SGLang's meta_info.weight_versions spans (see versions_from_spans), else from the local
        engine server's meta_info.output_token_weight_versions, else they are None.
        """
        meta = body["meta_info"]
        pairs = meta.get("output_token_logprobs") or []
        reason = meta.get("finish_reason") or {"type": "abort"}
        reason_type = reason["type"] if isinstance(reason, dict) else str(reason)
        output_ids = body.get("output_ids") or [int(p[1]) for p in pairs]
        weight_version = _version(meta.get("weight_version"), default_weight_version)
        per_token: list[int] | None = None
        if meta.get("weight_versions"):
            per_token = versions_from_spans(meta["weight_versions"], len(output_ids), weight_version)
        elif meta.get("output_token_weight_versions") is not None:
            per_token = [int(version) for version in meta["output_token_weight_versions"]]
        return cls(
            output_ids=output_ids,
            output_token_logprobs=[float(p[0]) for p in pairs],
            finish_reason=reason_type if reason_type in ("stop", "length") else "abort",
            weight_version=weight_version,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", len(pairs))),
            output_token_weight_versions=per_token,
        )


def weight_version_spans(versions: list[int], current: int) -> list[dict[str, Any]]:
    """Per-token versions as SGLang's meta_info.weight_versions: [{"version": str, "start", "end"}], each span
    the half-open range of output tokens [start, end) one version sampled; no tokens: one empty span of the
    current version (sglang/srt/utils/weight_versions.py: compute_weight_version_spans,
    add_weight_versions_to_meta_info)."""
    if not versions:
        return [{"version": str(current), "start": 0, "end": 0}]
    spans: list[dict[str, Any]] = []
    for index, version in enumerate(versions):
        if spans and spans[-1]["version"] == str(version):
            spans[-1]["end"] = index + 1
        else:
            spans.append({"version": str(version), "start": index, "end": index + 1})
    return spans


def versions_from_spans(spans: list[Any], num_tokens: int, default: int) -> list[int]:
    """The version of each of num_tokens output tokens from SGLang's meta_info.weight_versions spans.

    A span is {"version": str, "start": int, "end": int} over output tokens [start, end) (SGLang 0.5.23,
    sglang/srt/utils/weight_versions.py: add_weight_versions_to_meta_info). A version that is not an integer
    (SGLang's initial "default") reads as `default`. A token no span covers gets the oldest version reported, so
    staleness is never under-counted.
    """
    per_token: list[int | None] = [None] * num_tokens
    seen: list[int] = []
    for span in spans:
        version = _version(span["version"] if isinstance(span, dict) else span[0], default)
        start, end = (int(span["start"]), int(span["end"])) if isinstance(span, dict) else map(int, span[1:3])
        seen.append(version)
        for index in range(max(0, start), min(end, num_tokens)):
            per_token[index] = version
    oldest = min(seen, default=default)
    return [oldest if version is None else version for version in per_token]


def _version(reported: Any, default: int) -> int:
    """SGLang reports weight_version as a string (its default is "default"); swerl's versions are integers."""
    try:
        return int(reported)
    except (TypeError, ValueError):
        return default


@runtime_checkable
class Engine(Protocol):
    """An inference engine: generate tokens with log-probs; load new weights under a version number."""

    async def generate(self, request: GenerateRequest) -> GenerateResponse: ...

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None: ...

    async def health(self) -> bool: ...

    # Weight sync over a process group (SGLang's API; swerl.engine.weight_sync holds the mechanics). The trainer
    # is rank 0; this engine's ranks are rank_offset ... rank_offset + weight_group_ranks() - 1.

    async def weight_group_ranks(self) -> int:
        """Ranks this engine puts in a weight group (SGLang: its tensor-parallel size; a router: its engines')."""
        ...

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        """Join the weight group (returns once every rank joined); WeightUpdateError if it cannot."""
        ...

    async def begin_weight_update(self) -> None:
        """Open a weight-update session (SGLang >= 0.5.23 refuses update_weights_from_distributed outside one)."""
        ...

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int | None = None,
        flush_cache: bool = True,
    ) -> None:
        """Receive one bucket broadcast by rank 0 and load it; weight_version (the sync's last bucket) moves the
        engine's version. A refusal is a WeightUpdateError."""
        ...

    async def end_weight_update(self) -> None:
        """Close the session opened by begin_weight_update."""
        ...


class InvalidRequestError(ValueError):
    """A request the engine refuses (the caller's bug, not an infrastructure error); SGLang answers HTTP 400."""


class ContextLengthError(InvalidRequestError):
    """The prompt leaves no room to generate under the engine's context length."""


class WeightUpdateError(RuntimeError):
    """New weights could not be loaded; the engine keeps serving the previous weights and version."""


def logprob_temperature(sampling_params: SamplingParams, return_original_logprob: bool = False) -> float:
    """The temperature whose distribution an engine's output log-probs describe (pass it to gather_logprobs).

    SGLang's sampler returns log-probs of the temperature-scaled distribution, softmax(logits / T), before top-p
    filtering; greedy requests (T = 0) report log_softmax(logits), i.e. T = 1. With
    SGLANG_RETURN_ORIGINAL_LOGPROB set it reports the unscaled distribution (T = 1) for every request.
    """
    if return_original_logprob or sampling_params.temperature == 0:
        return 1.0
    return sampling_params.temperature
