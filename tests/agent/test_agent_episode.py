"""The oracle and the episode loop on real tasks in real bubblewrap sandboxes.

The only fake is at the engine edge: ScriptedEngine (swerl.engine.scripted) is a deterministic model double that
returns pre-scripted token ids (e.g. the tokenized turns of an oracle trace). Tasks, sandboxes, tools, the
tokenizer and grading are all real: tasks are built from the shipped `intervals` repository's bug candidates,
with FAIL_TO_PASS / PASS_TO_PASS read from a real run of its suite with the bug applied.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from swerl.agent.episode import EpisodeLimits, run_episode
from swerl.agent.oracle import TEST_COMMAND, OracleTrace, generate_oracle_traces, solve_task
from swerl.agent.tools import system_prompt
from swerl.agent.traces import load_trace_rows, oracle_rows, trace_to_example, write_traces
from swerl.data.bugs import BugCandidate, candidates
from swerl.data.repos import builtin_repo, tree_hash
from swerl.data.schema import TaskInstance
from swerl.data.testrun import passing, run_pytest
from swerl.engine.base import SamplingParams
from swerl.engine.scripted import ScriptedEngine
from swerl.model.chat import render_messages
from swerl.model.toolcall import format_tool_call
from swerl.sandbox import LocalSandboxProvider
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.sandbox_helpers import local_provider
from tests.tiny_models import TinyModels

REPO = builtin_repo("intervals")
BASE_LIMITS = EpisodeLimits(
    max_turns=30,
    max_trajectory_tokens=8192,
    max_new_tokens_per_turn=512,
    command_timeout_s=30.0,
    max_observation_chars=4000,
    test_timeout_s=120.0,
    episode_timeout_s=1800.0,
    max_malformed_calls=1_000_000,
)
"""The caps these tests were written against (EpisodeLimits' defaults before AgentConfig became their one home);
each test replaces the ones it is about."""
LIMITS = replace(BASE_LIMITS, max_turns=8, max_trajectory_tokens=6000, command_timeout_s=20, test_timeout_s=60)
ORACLE = dict(context_lines=3, view_whole_file_lines=0, view_function_lines=0, test_command=None)
"""The oracle's views these tests were written against (solve_task's defaults before TracesConfig held them)."""
SAMPLING = SamplingParams(max_new_tokens=256, temperature=1.0)


@pytest.fixture(scope="module")
def provider() -> LocalSandboxProvider:
    return local_provider(git_baseline=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_models: TinyModels) -> PreTrainedTokenizerBase:
    source = "\n".join(p.read_text() for p in sorted(REPO.path.rglob("*.py")))
    calls = [format_tool_call("bash", {"command": TEST_COMMAND}), format_tool_call("submit", {})]
    corpus = [system_prompt(), source, *calls, "sed -i '12s/ <= / < /' a.py\n1 failed, 22 passed in 0.05s\n"]
    return AutoTokenizer.from_pretrained(tiny_models.tokenizer_dir(corpus * 5, 700), local_files_only=True)


async def _task_from_candidate(provider: LocalSandboxProvider, candidate: BugCandidate) -> TaskInstance | None:
    """A task from one bug: FAIL_TO_PASS are the tests its bugged suite fails (the clean suite passes)."""
    sandbox = await provider.start(REPO.path, candidate.bug_patch)
    try:
        _, outcomes = await run_pytest(sandbox, 60)
    finally:
        await sandbox.close()
    ok = passing(outcomes)
    failing = sorted(t for t in outcomes if t not in ok)
    if not failing:
        return None
    return TaskInstance(
        instance_id=f"intervals.{candidate.modifier}.{candidate.site}",
        repo=REPO.repo,
        base_commit=tree_hash(REPO.path),
        problem_statement=f"Tests fail: {', '.join(failing[:3])}. Fix the library code.",
        patch=candidate.bug_patch,
        patch_kind="bug",
        FAIL_TO_PASS=failing,
        PASS_TO_PASS=sorted(ok),
        image=REPO.image,
        source="test",
        modifier=candidate.modifier,
    )


@pytest.fixture(scope="module")
def tasks(provider: LocalSandboxProvider) -> dict[str, TaskInstance]:
    """One task fixed by a one-line sed (flip_comparison) and one needing an inserted line (drop_condition)."""
    found: dict[str, TaskInstance] = {}
    for modifier, rel in (("flip_comparison", "intervals/core.py"), ("drop_condition", "intervals/ops.py")):
        for candidate in candidates(modifier, rel, (REPO.path / rel).read_text())[:4]:
            task = asyncio.run(_task_from_candidate(provider, candidate))
            if task is not None:
                found[modifier] = task
                break
    assert set(found) == {"flip_comparison", "drop_condition"}
    return found


@pytest.fixture(scope="module")
def oracle_traces(tasks: dict[str, TaskInstance], provider: LocalSandboxProvider) -> dict[str, OracleTrace]:
    traces, report = asyncio.run(
        generate_oracle_traces(list(tasks.values()), provider, LIMITS, recovery_prob=0.0, workers=2, **ORACLE)
    )
    assert report.traced == 2 and not report.skipped, report.to_dict()
    return {trace.modifier or "": trace for trace in traces}


def test_oracle_uses_the_given_test_command(tasks: dict[str, TaskInstance], provider: LocalSandboxProvider) -> None:
    command = "python -m pytest -q -x --tb=line -p no:cacheprovider 2>&1 | tail -n 8"
    traces, report = asyncio.run(
        generate_oracle_traces(
            [tasks["flip_comparison"]],
            provider,
            LIMITS,
            recovery_prob=0.0,
            workers=1,
            **(ORACLE | {"test_command": command}),
        )
    )
    assert report.traced == 1, report.to_dict()
    first_turn = next(m["content"] for m in traces[0].messages if m["role"] == "assistant")
    assert command in first_turn


def _assistant_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


def test_oracle_resolves_real_tasks_with_short_edits(oracle_traces: dict[str, OracleTrace]) -> None:
    sed_trace, insert_trace = oracle_traces["flip_comparison"], oracle_traces["drop_condition"]
    assert (sed_trace.edit_kind, insert_trace.edit_kind) == ("sed", "str_replace")
    turns = _assistant_texts(sed_trace.messages)
    assert len(turns) == 5 and TEST_COMMAND in turns[0] and "cat -n intervals/core.py | sed -n" in turns[1]
    assert "sed -i '" in turns[2] and TEST_COMMAND in turns[3] and '"submit"' in turns[4]
    observations = [m["content"] for m in sed_trace.messages if m["role"] == "tool"]
    assert "failed" in observations[0] and "passed" in observations[-1] and "failed" not in observations[-1]
    assert all(re.match(r"^ +\d+\t", line) for line in observations[1].splitlines())  # `cat -n` numbering


def test_oracle_recovery_trace_shows_a_failing_wrong_edit_undone(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider
) -> None:
    trace = asyncio.run(
        solve_task(tasks["flip_comparison"], provider, LIMITS, random.Random(0), recovery=True, **ORACLE)
    )
    assert trace.recovery
    turns = _assistant_texts(trace.messages)
    assert len(turns) == 8  # test, view, wrong sed, retest (fails), undo sed, fix, retest (passes), submit
    observations = [m["content"] for m in trace.messages if m["role"] == "tool"]
    assert "failed" in observations[3] and "failed" not in observations[6]


def test_oracle_traces_round_trip_through_the_loader(
    oracle_traces: dict[str, OracleTrace], tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    rows = oracle_rows(oracle_traces.values())
    for suffix in ("jsonl", "parquet"):
        loaded = load_trace_rows(write_traces(rows, tmp_path / f"traces.{suffix}"))
        assert [r["messages"] for r in loaded] == [r["messages"] for r in rows]
        assert {r["model"] for r in loaded} == {"oracle"} and all(r["resolved"] for r in loaded)
        ids, mask = trace_to_example(tokenizer, loaded[0])
        assert (ids, mask) == render_messages(tokenizer, rows[0]["messages"]) and 0 < sum(mask) < len(mask)


def _check_token_contract(trajectory: Trajectory, engine: ScriptedEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    """Token in, token out: every request was a prefix of the final ids, and only sampled tokens are masked 1."""
    for request in engine.requests:
        assert trajectory.token_ids[: len(request.input_ids)] == request.input_ids
    sampled = [i for i, m in enumerate(trajectory.loss_mask) if m]
    assert all(trajectory.behaviour_logprobs[i] == engine.logprob for i in sampled)
    assert all(trajectory.token_weight_versions[i] == engine.weight_version for i in sampled)
    assert trajectory.token_ids[: trajectory.prompt_tokens] == engine.requests[0].input_ids


def test_replayed_oracle_episode_is_resolved_and_token_exact(
    oracle_traces: dict[str, OracleTrace],
    tasks: dict[str, TaskInstance],
    provider: LocalSandboxProvider,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    trace = oracle_traces["drop_condition"]
    engine = ScriptedEngine.from_texts(tokenizer, _assistant_texts(trace.messages), weight_version=3)
    task = tasks["drop_condition"]
    trajectory = asyncio.run(run_episode(task, engine, provider, tokenizer, LIMITS, SAMPLING, group_id="g0"))
    assert trajectory.status is EpisodeStatus.RESOLVED and trajectory.reward == 1.0
    assert trajectory.num_turns == 5 and trajectory.malformed_tool_calls == 0
    assert "intervals/ops.py" in trajectory.patch and "tests/" not in trajectory.patch
    assert _assistant_texts(trajectory.messages) == _assistant_texts(trace.messages)
    ids, mask = render_messages(tokenizer, trajectory.messages)
    assert trajectory.token_ids == ids and trajectory.loss_mask == mask
    assert sum(trajectory.loss_mask) == sum(len(output) for output in engine.outputs)
    _check_token_contract(trajectory, engine, tokenizer)
    timings = trajectory.timings
    assert timings.sandbox_start_s > 0 and timings.tools_s > 0 and timings.tests_s > 0
    assert timings.total_s >= timings.sandbox_start_s + timings.tools_s + timings.tests_s


def test_malformed_calls_are_counted_and_a_command_timeout_is_an_observation(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider, tokenizer: PreTrainedTokenizerBase
) -> None:
    texts = [
        "I will run the tests.",  # no tool call
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',  # invalid JSON
        format_tool_call("rm_rf", {}),  # unknown tool
        format_tool_call("bash", {"command": "sleep 30"}),
        format_tool_call("submit", {}),
    ]
    engine = ScriptedEngine.from_texts(tokenizer, texts)
    limits = replace(BASE_LIMITS, max_turns=8, command_timeout_s=0.5, test_timeout_s=60)
    trajectory = asyncio.run(run_episode(tasks["flip_comparison"], engine, provider, tokenizer, limits, SAMPLING))
    assert trajectory.malformed_tool_calls == 3 and trajectory.num_turns == 5
    assert trajectory.status is EpisodeStatus.UNRESOLVED and trajectory.reward == 0.0
    observations = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert "No tool call found" in observations[0] and "Unknown tool" in observations[2]
    assert "timed out after 0.5 s" in observations[3]
    assert trajectory.token_ids == render_messages(tokenizer, trajectory.messages)[0]


def test_turn_cap_is_graded(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = ScriptedEngine.from_texts(tokenizer, [format_tool_call("bash", {"command": "true"})], cycle=True)
    limits = replace(BASE_LIMITS, max_turns=2, test_timeout_s=60)
    trajectory = asyncio.run(run_episode(tasks["flip_comparison"], engine, provider, tokenizer, limits, SAMPLING))
    assert trajectory.status is EpisodeStatus.TURN_CAP and trajectory.reward == 0.0 and trajectory.num_turns == 2
    assert trajectory.messages[-1] == {"role": "tool", "content": "[no output]"}


def test_length_caps_per_turn_and_per_trajectory(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider, tokenizer: PreTrainedTokenizerBase
) -> None:
    call = format_tool_call("bash", {"command": "cat intervals/core.py"})
    engine = ScriptedEngine.from_texts(tokenizer, [call], cycle=True)
    # The first turn is cut at 5 tokens (not the trajectory's fault): <|im_end|> is appended unsampled and the
    # cut call is a malformed one; the next turns then run into the trajectory cap.
    cut = asyncio.run(
        run_episode(
            tasks["flip_comparison"],
            ScriptedEngine(engine.outputs),
            provider,
            tokenizer,
            replace(BASE_LIMITS, max_new_tokens_per_turn=5, max_turns=1, test_timeout_s=60),
            SAMPLING,
        )
    )
    assert cut.status is EpisodeStatus.TURN_CAP and cut.malformed_tool_calls == 1
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled_end = cut.prompt_tokens + 5
    assert cut.loss_mask[cut.prompt_tokens : sampled_end] == [1] * 5
    assert cut.token_ids[sampled_end] == im_end and cut.loss_mask[sampled_end] == 0
    cap = cut.prompt_tokens + 2 * len(engine.outputs[0]) + 20
    capped = asyncio.run(
        run_episode(
            tasks["flip_comparison"],
            engine,
            provider,
            tokenizer,
            replace(BASE_LIMITS, max_trajectory_tokens=cap, test_timeout_s=60),
            SAMPLING,
        )
    )
    assert capped.status is EpisodeStatus.LENGTH_CAP and capped.reward == 0.0
    assert len(capped.token_ids) <= cap and capped.num_turns >= 1
    _check_token_contract(capped, engine, tokenizer)


def test_tests_are_restored_before_grading(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider, tokenizer: PreTrainedTokenizerBase
) -> None:
    """An agent that rewrites the failing tests (and adds a conftest skipping everything) gains nothing."""
    task = tasks["flip_comparison"]
    test_file = task.FAIL_TO_PASS[0].split("::")[0]
    hack = (
        f"printf 'def test_x():\\n    pass\\n' > {test_file} && "
        "echo 'collect_ignore_glob = [\"*\"]' > tests/conftest.py"
    )
    engine = ScriptedEngine.from_texts(
        tokenizer, [format_tool_call("bash", {"command": hack}), format_tool_call("submit", {})]
    )
    trajectory = asyncio.run(run_episode(task, engine, provider, tokenizer, LIMITS, SAMPLING))
    assert trajectory.status is EpisodeStatus.UNRESOLVED and trajectory.reward == 0.0
    assert test_file in trajectory.patch and "tests/conftest.py" in trajectory.patch


def test_infra_errors_are_not_scored(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = ScriptedEngine.from_texts(tokenizer, [format_tool_call("submit", {})])
    slow_start = local_provider(git_baseline=True, start_timeout_s=0.001)
    trajectory = asyncio.run(run_episode(tasks["flip_comparison"], engine, slow_start, tokenizer, LIMITS, SAMPLING))
    assert trajectory.status is EpisodeStatus.INFRA_ERROR and trajectory.reward is None
    assert trajectory.infra_cause == "start_timeout" and trajectory.num_turns == 0
    # An engine that fails mid-episode (the script runs out): infra_error, sandbox closed, no grading.
    engine = ScriptedEngine.from_texts(tokenizer, [format_tool_call("bash", {"command": "true"})])
    trajectory = asyncio.run(run_episode(tasks["flip_comparison"], engine, provider, tokenizer, LIMITS, SAMPLING))
    assert trajectory.status is EpisodeStatus.INFRA_ERROR and trajectory.infra_cause == "engine_http"
    assert trajectory.reward is None and trajectory.timings.tests_s == 0.0 and trajectory.num_turns == 1


def test_consecutive_malformed_calls_end_the_episode_and_it_is_still_graded(
    tasks: dict[str, TaskInstance], provider: LocalSandboxProvider, tokenizer: PreTrainedTokenizerBase
) -> None:
    """A well-formed call resets the count: 2 malformed, a command, then 3 in a row hit max_malformed_calls=3."""
    malformed = "I will run the tests."
    texts = [
        malformed,
        malformed,
        format_tool_call("bash", {"command": "true"}),
        malformed,
        malformed,
        malformed,
    ]
    engine = ScriptedEngine.from_texts(tokenizer, [*texts, format_tool_call("submit", {})])
    limits = replace(BASE_LIMITS, max_turns=10, max_malformed_calls=3, test_timeout_s=60)
    trajectory = asyncio.run(run_episode(tasks["flip_comparison"], engine, provider, tokenizer, limits, SAMPLING))
    assert trajectory.status is EpisodeStatus.MALFORMED and trajectory.num_turns == 6
    assert trajectory.malformed_tool_calls == 5 and len(engine.requests) == 6  # submit never sampled
    assert trajectory.reward == 0.0 and trajectory.timings.tests_s > 0  # graded on the unfixed bug
    assert trajectory.messages[-1] == {"role": "assistant", "content": malformed}  # no observation after it
    assert trajectory.token_ids == render_messages(tokenizer, trajectory.messages)[0]

    # Exactly N in a row from the start: malformed_tool_calls == N.
    engine = ScriptedEngine.from_texts(tokenizer, [malformed], cycle=True)
    limits = replace(BASE_LIMITS, max_turns=10, max_malformed_calls=2, test_timeout_s=60)
    trajectory = asyncio.run(run_episode(tasks["flip_comparison"], engine, provider, tokenizer, limits, SAMPLING))
    assert trajectory.status is EpisodeStatus.MALFORMED and trajectory.reward == 0.0
    assert trajectory.malformed_tool_calls == 2 == trajectory.num_turns


@pytest.mark.parametrize("template", ["swerl", "trimming"])
def test_one_render_per_turn_cuts_where_two_renders_did(tokenizer: PreTrainedTokenizerBase, template: str) -> None:
    """append_observation cuts the new segment from one render per turn (the previous render + the turn's text +
    <|im_end|> as a prefix) and falls back to rendering the turn alone when the template renders the turn
    otherwise (here a template that trims assistant text). Each segment must equal the cut of the two-render
    method, including turns and observations that spell <|im_end|> as plain text."""
    import copy

    from swerl.agent.episode import _Episode
    from swerl.model.chat import CHAT_TEMPLATE, IM_END, render_text

    tok = copy.deepcopy(tokenizer)
    if template == "trimming":
        tok.chat_template = CHAT_TEMPLATE.replace(
            "'<|im_start|>assistant\\n' + content", "'<|im_start|>assistant\\n' + (content | trim)"
        )
        assert tok.chat_template != CHAT_TEMPLATE
    messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": "2 tests fail."}]
    episode = _Episode(tok, None, LIMITS, SAMPLING, messages, rid=None)  # type: ignore[arg-type]
    turns = [
        (format_tool_call("bash", {"command": "ls"}), "a.py\nb.py"),
        ("  " + format_tool_call("bash", {"command": "cat a.py"}) + "\n\n", f"x = 1  # {IM_END} in a file"),
        (f"I will print {IM_END} now", "No tool call found"),
        ("\n" + format_tool_call("submit", {}), ""),
    ]
    for text, observation in turns:
        episode.token_ids += episode._tokenize(text + IM_END)  # what sample_turn appends (as sampled)
        episode.messages.append({"role": "assistant", "content": text})
        cut = episode._cut(episode.messages)  # the two-render method
        two_renders = render_text(tok, [*episode.messages, {"role": "tool", "content": observation}], None, True)
        before = len(episode.token_ids)
        episode.append_observation(observation)
        assert episode.token_ids[before:] == episode._tokenize(two_renders[cut:]), text
        assert episode._rendered == two_renders
