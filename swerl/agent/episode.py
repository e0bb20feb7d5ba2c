"""One agent episode, token in / token out: prompt -> (generate -> parse -> tool -> observation)* -> grade.

The trajectory's token ids are built by appending, never by re-tokenizing what the model wrote:
- the prompt (system + user + generation prompt) is rendered with the chat template and tokenized once;
- each turn appends the engine's `output_ids` exactly as sampled (loss mask 1, with their log-probs and weight
  version). If a turn did not end with <|im_end|> (cut by max_new_tokens), <|im_end|> is appended as a
  NON-sampled token (mask 0): the conversation stays well-formed for the next turn, and the policy is not
  taught to stop where it did not;
- the text between turns (turn close, the tool message, the next generation prompt) is cut from the chat
  template's render of the conversation and tokenized alone, at the same cut points swerl.model's
  render_messages uses (one render per turn: the previous render is its prefix). So when every sampled turn is the
  tokenization of its own text, the trajectory's ids equal render_messages(messages) exactly, and its mask is 1
  exactly on the sampled tokens.

Exceptions end an episode (mini-swe-agent style): Submitted (the model called submit), LimitsExceeded (turn,
token or time cap), InfraError (sandbox or engine failure: status infra_error, reward None, never graded).
Every other ending is graded on the task's pristine tests, in the agent's workspace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from swerl.agent.tools import TOOL_SPECS, Submitted, Tools, system_prompt
from swerl.config.agent import AgentConfig
from swerl.data.environments import task_environment
from swerl.data.harbor import harbor_task_of
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine, GenerateRequest, SamplingParams
from swerl.errors import InfraError
from swerl.grading.grader import grade_patch, workspace_patch
from swerl.model.chat import IM_END, render_text
from swerl.model.toolcall import ToolCallError, parse_tool_call
from swerl.sandbox.base import Sandbox, SandboxProvider
from swerl.trajectory import EpisodeStatus, PhaseTimings, Trajectory


@dataclass(frozen=True)
class EpisodeLimits:
    """Every cap of an episode (logged by the caller at start); swerl.stages.common.episode_limits fills it from
    AgentConfig, which holds the defaults."""

    max_turns: int
    max_trajectory_tokens: int
    max_new_tokens_per_turn: int
    command_timeout_s: float
    max_observation_chars: int
    test_timeout_s: float
    episode_timeout_s: float
    """Wall clock for the agent's turns (sandbox start and grading excluded)."""
    max_malformed_calls: int
    """Consecutive malformed tool calls before the episode ends with status malformed."""
    max_command_bytes: int = AgentConfig.model_fields["max_command_bytes"].default
    """The largest command a tool call may run (longer: an error observation). Default: AgentConfig's."""
    max_edit_bytes: int = AgentConfig.model_fields["max_edit_bytes"].default
    """The largest file or old+new text a str_replace may handle. Default: AgentConfig's."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"EpisodeLimits.{name} must be > 0, got {value}")


class LimitsExceeded(Exception):
    """A cap ended the episode before the model submitted; carries the status to record."""

    def __init__(self, status: EpisodeStatus, message: str = "") -> None:
        super().__init__(message or status.value)
        self.status = status


def initial_messages(task: TaskInstance) -> list[dict[str, Any]]:
    """The conversation an episode starts from: tool instructions, then the task's problem statement."""
    return [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": task.problem_statement},
    ]


class _Episode:
    """The state of one running episode: the conversation, its aligned token arrays, counters, timings."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        engine: Engine,
        limits: EpisodeLimits,
        sampling: SamplingParams,
        messages: list[dict[str, Any]],
        rid: str | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.engine = engine
        self.limits = limits
        self.sampling = sampling
        self.rid = rid
        self.messages = messages
        self.im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
        self.token_ids: list[int] = []  # (T,)
        self.loss_mask: list[int] = []  # (T,)
        self.logprobs: list[float] = []  # (T,)
        self.versions: list[int] = []  # (T,)
        self.num_turns = 0
        self.malformed = 0
        self.timings = PhaseTimings()
        self._rendered = render_text(tokenizer, messages, add_generation_prompt=True)
        """The chat template's render of the conversation up to the latest generation prompt (= token_ids)."""
        self._append_fixed(self._rendered)
        self.prompt_tokens = len(self.token_ids)
        # Room kept free for closing a turn: a possibly appended <|im_end|> and the final turn close.
        self.reserve = 1 + len(self._tokenize(self._close_text(self.messages + [_assistant("")])))

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _append_fixed(self, text: str) -> int:
        """Append text that the model did not sample (mask 0); returns how many tokens it took."""
        ids = self._tokenize(text)
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        return len(ids)

    def _cut(self, messages: Sequence[dict[str, Any]]) -> int:
        """Offset just past the last assistant turn's <|im_end|> in the render of messages."""
        closed = render_text(self.tokenizer, messages)
        return closed.rfind(IM_END) + len(IM_END)

    def _close_text(self, messages: Sequence[dict[str, Any]]) -> str:
        """What the template writes after the final assistant turn's <|im_end|> (the turn close)."""
        closed = render_text(self.tokenizer, messages)
        return closed[self._cut(messages) :]

    async def sample_turn(self) -> str:
        """Generate one assistant turn on the current ids, append it as sampled; returns its text."""
        if self.num_turns >= self.limits.max_turns:
            raise LimitsExceeded(EpisodeStatus.TURN_CAP, f"{self.num_turns} turns")
        budget = self.limits.max_trajectory_tokens - len(self.token_ids) - self.reserve
        if budget < 1:
            raise LimitsExceeded(EpisodeStatus.LENGTH_CAP, f"{len(self.token_ids)} tokens")
        max_new = min(self.limits.max_new_tokens_per_turn, budget)
        stops = sorted({*self.sampling.stop_token_ids, self.im_end_id})
        params = self.sampling.model_copy(update={"max_new_tokens": max_new, "stop_token_ids": stops})
        started = time.monotonic()
        response = await self.engine.generate(
            GenerateRequest(input_ids=list(self.token_ids), sampling_params=params, rid=self.rid)
        )
        self.timings.llm_s += time.monotonic() - started
        if response.finish_reason == "abort":
            raise InfraError("engine_http", "the engine aborted the generation")
        output = list(response.output_ids)
        if len(response.output_token_logprobs) != len(output):
            raise InfraError("engine_http", "the engine returned log-probs not aligned with its output ids")
        self.num_turns += 1
        self.token_ids += output
        self.loss_mask += [1] * len(output)
        self.logprobs += [min(0.0, float(lp)) for lp in response.output_token_logprobs]
        # Per-token versions when the engine reports them (a weight update can land mid-generation).
        per_token = response.output_token_weight_versions
        if per_token is not None and len(per_token) == len(output):
            self.versions += list(per_token)
        else:
            self.versions += [response.weight_version] * len(output)
        ended = bool(output) and output[-1] == self.im_end_id
        text = str(self.tokenizer.decode(output[:-1] if ended else output, skip_special_tokens=False))
        self.messages.append(_assistant(text))
        if not ended:
            self._append_fixed(IM_END)  # not sampled: mask 0 (see the module docstring)
            if max_new < self.limits.max_new_tokens_per_turn:  # the trajectory budget, not the turn's, ran out
                raise LimitsExceeded(EpisodeStatus.LENGTH_CAP, "generation cut at the trajectory token cap")
        return text

    def append_observation(self, observation: str) -> None:
        """Append the tool message and the next generation prompt (mask 0), if the token cap leaves room."""
        self.messages.append({"role": "tool", "content": observation})
        full = render_text(self.tokenizer, self.messages, add_generation_prompt=True)
        # The cut is just past the last assistant turn's <|im_end|>. When this render starts with the previous one,
        # the turn's text and <|im_end|> (a prefix-stable template rendering the turn verbatim), that is where it
        # is: one render per turn instead of two. Otherwise the turn's own render says (as render_messages cuts).
        head = self._rendered + self.messages[-2]["content"] + IM_END
        cut = len(head) if full.startswith(head) else self._cut(self.messages[:-1])
        ids = self._tokenize(full[cut:])
        if len(self.token_ids) + len(ids) + self.reserve + 1 > self.limits.max_trajectory_tokens:
            self.messages.pop()  # it never reached the model: keep messages and ids in step
            raise LimitsExceeded(EpisodeStatus.LENGTH_CAP, "no room for the next observation")
        self._rendered = full
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def close(self) -> None:
        """Append the final turn close, so the ids equal the chat template's render of the messages."""
        if self.messages[-1]["role"] == "assistant":
            self._append_fixed(self._close_text(self.messages))

    async def run(self, tools: Tools) -> None:
        """Turns until submit (raises Submitted) or a cap (raises LimitsExceeded)."""
        malformed_in_a_row = 0
        while True:
            text = await self.sample_turn()
            call = parse_tool_call(text, TOOL_SPECS)
            if isinstance(call, ToolCallError):
                self.malformed += 1
                malformed_in_a_row += 1
                if malformed_in_a_row >= self.limits.max_malformed_calls:
                    raise LimitsExceeded(EpisodeStatus.MALFORMED, f"{malformed_in_a_row} malformed calls in a row")
                self.append_observation(call.message)
                continue
            malformed_in_a_row = 0
            started = time.monotonic()
            try:
                result = await tools.run(call)
            finally:
                self.timings.tools_s += time.monotonic() - started
            self.append_observation(result.observation)


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


@dataclass(frozen=True)
class _Outcome:
    """How an episode ended: its status, and the grade (reward, patch) or the infrastructure error."""

    status: EpisodeStatus | None
    reward: float | None = None
    patch: str = ""
    infra: InfraError | None = None
    grade_status: str = ""
    dropped: tuple[str, ...] = ()
    tampered: tuple[str, ...] = ()


async def run_episode(
    task: TaskInstance,
    engine: Engine,
    sandbox_provider: SandboxProvider,
    tokenizer: PreTrainedTokenizerBase,
    limits: EpisodeLimits,
    sampling: SamplingParams,
    *,
    attempt: int = 0,
    group_id: str = "",
    rid: str | None = None,
    python: str = "python",
) -> Trajectory:
    """Run one episode of `task` with the policy behind `engine`; never raises for sandbox or engine failures."""
    started = time.monotonic()
    episode = _Episode(tokenizer, engine, limits, sampling, initial_messages(task), rid)
    outcome = await _sandboxed_episode(episode, task, sandbox_provider, limits, python, started)
    episode.close()
    episode.timings.total_s = time.monotonic() - started
    return _trajectory(task, episode, outcome, attempt, group_id)


def episode_timeout(task: TaskInstance, configured_s: float) -> float:
    """The agent's wall clock: the configured cap, or a Harbor task's own [agent] timeout_sec where lower."""
    if task.verifier is None:
        return configured_s
    own = harbor_task_of(task).agent_timeout_s
    return min(configured_s, own) if own else configured_s


async def _sandboxed_episode(
    episode: _Episode,
    task: TaskInstance,
    sandbox_provider: SandboxProvider,
    limits: EpisodeLimits,
    python: str,
    started: float,
) -> _Outcome:
    """Start the task's sandbox, run the agent's turns in it, grade it, close it; an InfraError is the outcome."""
    sandbox: Sandbox | None = None
    try:
        env_dir, setup_patch = await asyncio.to_thread(task_environment, task)
        timeout_s = await asyncio.to_thread(episode_timeout, task, limits.episode_timeout_s)
        sandbox_requested = time.monotonic()
        episode.timings.env_install_s = sandbox_requested - started
        sandbox = await sandbox_provider.start(env_dir, setup_patch)
        episode.timings.sandbox_start_s = time.monotonic() - sandbox_requested
        tools = Tools(
            sandbox,
            limits.command_timeout_s,
            limits.max_observation_chars,
            limits.max_command_bytes,
            limits.max_edit_bytes,
        )
        status = await _agent_turns(episode, tools, timeout_s)
        patch = await workspace_patch(sandbox)
        await sandbox.close()
        episode.timings.sandbox_s = time.monotonic() - sandbox_requested
        sandbox = None
        # Every ending but an infrastructure error is graded, caps included: the patch alone, in a fresh sandbox
        # of the task (the agent's own files and .git never reach the grader).
        tests_started = time.monotonic()
        graded = await grade_patch(sandbox_provider, task, patch or "", limits.test_timeout_s, python)
        episode.timings.tests_s = time.monotonic() - tests_started
        if status is None:
            status = EpisodeStatus.RESOLVED if graded.reward == 1.0 else EpisodeStatus.UNRESOLVED
        return _Outcome(
            status,
            graded.reward,
            graded.patch,
            grade_status=graded.status,
            dropped=graded.dropped,
            tampered=graded.tampered,
        )
    except InfraError as exc:
        return _Outcome(EpisodeStatus.INFRA_ERROR, infra=exc)
    finally:
        if sandbox is not None:
            await sandbox.close()
            episode.timings.sandbox_s = time.monotonic() - sandbox_requested


async def _agent_turns(episode: _Episode, tools: Tools, timeout_s: float) -> EpisodeStatus | None:
    """The agent's turns under the episode's wall clock; the status of the cap that ended them (None: submit)."""
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            await episode.run(tools)
    except Submitted:
        return None
    except LimitsExceeded as exc:
        return exc.status
    except TimeoutError:
        if not deadline.expired():  # raised inside the turns, not by the episode's wall clock
            raise
        return EpisodeStatus.TIMEOUT
    return None


def _trajectory(task: TaskInstance, episode: _Episode, outcome: _Outcome, attempt: int, group_id: str) -> Trajectory:
    infra = outcome.infra
    return Trajectory(
        task_id=task.instance_id,
        attempt=attempt,
        group_id=group_id,
        status=outcome.status,
        reward=outcome.reward,
        prompt_tokens=episode.prompt_tokens,
        token_ids=episode.token_ids,
        loss_mask=episode.loss_mask,
        behaviour_logprobs=episode.logprobs,
        token_weight_versions=episode.versions,
        num_turns=episode.num_turns,
        malformed_tool_calls=episode.malformed,
        timings=episode.timings,
        infra_cause=infra.cause if infra else None,
        infra_message=infra.message if infra else None,
        patch=outcome.patch,
        grade_status=outcome.grade_status,
        dropped_paths=list(outcome.dropped),
        tampered=list(outcome.tampered),
        messages=episode.messages,
    )
