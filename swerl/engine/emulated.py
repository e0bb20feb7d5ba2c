"""A latency-emulating engine: the Engine protocol in process, with the recipe's long-tail episode profile and no
model behind it. For benchmarks of the rollout system (scheduling, sandboxes, the trainer's waiting), where a real
model's latencies are the thing being emulated.

Each trajectory (keyed by the request id's "group/attempt" prefix, as the episode loop sets it) draws a plan
from the profile, seeded by that key: it either runs to the turn cap (`turn_cap_share`, 84% in the recipe) or
submits after a number of turns whose median is `success_median_turns` (8). A per-trajectory speed factor,
log-normal with `speed_sigma`, makes attempts of one group differ (sigma 0.45 gives a ~2.5x max/min spread in a
group of 4). A generation sleeps `turn_latency_s` x speed x a small jitter; its tokens are the tool call the plan
says, tokenized with the given tokenizer, so the real agent loop, tools, sandboxes and grading run on them:
- the first turn of a turn-capped plan breaks the repository (`break_command`), so real grading scores it 0;
- other turns run `idle_command`; the last turn of a submitting plan calls submit (graded 1 on a clean task).
Tokens are tagged with the weight version current when their part of the generation was "decoded" (the sleep is
split in chunks), so a generation that spans a weight update carries two versions, as with a real engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from swerl.engine.base import GenerateRequest, GenerateResponse
from swerl.errors import InfraError
from swerl.model.chat import IM_END
from swerl.model.toolcall import format_tool_call

NO_WEIGHT_GROUP = (
    "the emulated engine has no model to receive weights into: use engine.weight_sync.method disk "
    "(update_weights_from_disk emulates a sync's duration)"
)


@dataclass(frozen=True)
class EpisodeProfile:
    """Episode lengths and latencies of the emulated policy (defaults: the recipe's shape, scaled down)."""

    max_turns: int = 20
    """The agent's turn cap; a turn-capped plan generates this many turns."""
    turn_cap_share: float = 0.84
    """Share of trajectories that run to the turn cap."""
    success_median_turns: float = 8.0
    """Median turns of a submitting trajectory."""
    success_turns_sigma: float = 0.35
    """Log-normal spread of a submitting trajectory's turns."""
    turn_latency_s: float = 0.05
    """Median seconds of one generation (at speed 1)."""
    speed_sigma: float = 0.45
    """Log-normal sigma of a trajectory's slowness factor (within-group spread)."""
    jitter_sigma: float = 0.2
    """Log-normal sigma of one generation's latency around its trajectory's."""
    weight_sync_s: float = 0.0
    """Seconds an update_weights_from_disk takes."""
    break_command: str = "rm -f mod.py"
    idle_command: str = "true"

    def __post_init__(self) -> None:
        if self.max_turns < 2 or not 0 <= self.turn_cap_share <= 1 or self.turn_latency_s < 0:
            raise ValueError(f"invalid episode profile {self}")


@dataclass(frozen=True)
class Plan:
    turns: int
    submits: bool
    speed: float


class EmulatedEngine:
    """The Engine protocol with emulated latencies (see the module docstring).

    Args:
        tokenizer: encodes the tool calls the plans make (the trainer's tokenizer, so ids fit its model).
        profile: the episode profile.
        seed: plans and latencies are a function of (seed, trajectory key, turn).
        weight_version: version served at the start.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        profile: EpisodeProfile = EpisodeProfile(),
        *,
        seed: int = 0,
        weight_version: int = 0,
    ) -> None:
        self.profile = profile
        self.seed = seed
        self.weight_version = weight_version
        im_end = tokenizer.convert_tokens_to_ids(IM_END)
        assert isinstance(im_end, int)
        self.im_end_id = im_end
        self.vocab_size = len(tokenizer)

        def encode(name: str, arguments: dict[str, str]) -> list[int]:
            text = format_tool_call(name, arguments)
            return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.im_end_id]

        self.break_ids = encode("bash", {"command": profile.break_command})
        self.idle_ids = encode("bash", {"command": profile.idle_command})
        self.submit_ids = encode("submit", {})
        self._turns: dict[str, int] = {}
        self.calls = 0
        self.updates = 0
        self.closed = False

    def _random(self, *key: object) -> random.Random:
        digest = hashlib.sha256(repr((self.seed, *key)).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def plan(self, key: str) -> Plan:
        """The plan of trajectory `key` (deterministic in seed and key)."""
        rng, profile = self._random("plan", key), self.profile
        speed = math.exp(rng.gauss(0.0, profile.speed_sigma))
        if rng.random() < profile.turn_cap_share:
            return Plan(profile.max_turns, False, speed)
        turns = round(profile.success_median_turns * math.exp(rng.gauss(0.0, profile.success_turns_sigma)))
        return Plan(min(max(turns, 1), profile.max_turns - 1), True, speed)

    def turn_latency_s(self, key: str, turn: int) -> float:
        """Seconds generation `turn` of trajectory `key` takes (its plan's speed x that turn's jitter)."""
        jitter = math.exp(self._random("turn", key, turn).gauss(0.0, self.profile.jitter_sigma))
        return self.profile.turn_latency_s * self.plan(key).speed * jitter

    def planned_llm_seconds(self, key: str) -> float:
        """The emulated LLM time of a whole trajectory: the floor of its duration with free sandboxes and CPU."""
        return sum(self.turn_latency_s(key, turn) for turn in range(self.plan(key).turns))

    @staticmethod
    def trajectory_key(rid: str | None) -> str:
        """'group/attempt' of a request id 'group/attempt/retry' (a retry reruns the same plan)."""
        return "/".join((rid or "").split("/")[:2])

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        if self.closed:
            raise InfraError("engine_unreachable", "the emulated engine is closed")
        key = self.trajectory_key(request.rid)
        turn = self._turns.get(request.rid or "", 0)
        self._turns[request.rid or ""] = turn + 1
        self.calls += 1
        plan = self.plan(key)
        if plan.submits and turn + 1 >= plan.turns:
            output = self.submit_ids
        elif not plan.submits and turn == 0:
            output = self.break_ids
        else:
            output = self.idle_ids
        output = output[: request.sampling_params.max_new_tokens]
        latency = self.turn_latency_s(key, turn)
        chunks = 4
        versions: list[int] = []
        for chunk in range(chunks):
            await asyncio.sleep(latency / chunks)
            end = len(output) * (chunk + 1) // chunks
            versions += [self.weight_version] * (end - len(versions))
        uniform = -math.log(self.vocab_size)
        return GenerateResponse(
            output_ids=list(output),
            output_token_logprobs=[uniform] * len(output),
            finish_reason="stop" if output and output[-1] == self.im_end_id else "length",
            weight_version=self.weight_version,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(output),
            output_token_weight_versions=versions,
        )

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        if self.profile.weight_sync_s:
            await asyncio.sleep(self.profile.weight_sync_s)
        self.weight_version = weight_version
        self.updates += 1

    async def health(self) -> bool:
        return not self.closed

    # No model to receive weights into: an emulated engine that joined a weight group would leave the trainer's
    # broadcast waiting. Benchmarks emulate syncs through update_weights_from_disk (profile.weight_sync_s).

    async def weight_group_ranks(self) -> int:
        raise NotImplementedError(NO_WEIGHT_GROUP)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        raise NotImplementedError(NO_WEIGHT_GROUP)

    async def begin_weight_update(self) -> None:
        raise NotImplementedError(NO_WEIGHT_GROUP)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int | None = None,
        flush_cache: bool = True,
    ) -> None:
        raise NotImplementedError(NO_WEIGHT_GROUP)

    async def end_weight_update(self) -> None:
        raise NotImplementedError(NO_WEIGHT_GROUP)

    async def __aenter__(self) -> EmulatedEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True
