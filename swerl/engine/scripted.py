"""A deterministic model double at the engine edge (like mini-swe-agent's DeterministicModel), for tests.

It answers each generate() with the next pre-scripted list of token ids, as an engine would: cut at the
request's max_new_tokens (finish 'length') or at the first stop token, which it keeps (finish 'stop'), with a
fixed log-prob per token and its weight version. Every request is recorded, so a test can check that the agent
sent the exact ids it had (token in, token out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from transformers import PreTrainedTokenizerBase

from swerl.engine.base import FinishReason, GenerateRequest, GenerateResponse
from swerl.errors import InfraError
from swerl.model.chat import IM_END


class ScriptedEngine:
    """Replays scripted outputs in order; `cycle=True` starts over when they run out, else it raises."""

    def __init__(
        self,
        outputs: Iterable[Sequence[int]],
        *,
        logprob: float = -0.25,
        weight_version: int = 0,
        cycle: bool = False,
    ) -> None:
        self.outputs = [list(ids) for ids in outputs]
        self.logprob = logprob
        self.weight_version = weight_version
        self.cycle = cycle
        self.requests: list[GenerateRequest] = []

    @classmethod
    def from_texts(cls, tokenizer: PreTrainedTokenizerBase, texts: Iterable[str], **kwargs: object) -> ScriptedEngine:
        """Outputs that are each text's tokenization followed by <|im_end|>, as a chat model would sample them."""
        im_end = tokenizer.convert_tokens_to_ids(IM_END)
        outputs = [[*tokenizer(text, add_special_tokens=False)["input_ids"], im_end] for text in texts]
        return cls(outputs, **kwargs)  # type: ignore[arg-type]

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        turn = len(self.requests)
        self.requests.append(request)
        if turn >= len(self.outputs) and not self.cycle:
            raise InfraError("engine_http", f"the script has only {len(self.outputs)} turns")
        script = self.outputs[turn % len(self.outputs)]
        stops = set(request.sampling_params.stop_token_ids)
        output: list[int] = []
        reason: FinishReason = "length"
        for token in script:
            if len(output) == request.sampling_params.max_new_tokens:
                break
            output.append(token)
            if token in stops:
                reason = "stop"
                break
        else:
            if len(output) < request.sampling_params.max_new_tokens:
                reason = "stop"  # the script ended without a stop token: an engine-side end of sequence
        return GenerateResponse(
            output_ids=output,
            output_token_logprobs=[self.logprob] * len(output),
            finish_reason=reason,
            weight_version=self.weight_version,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(output),
        )

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        self.weight_version = weight_version

    async def health(self) -> bool:
        return True
