"""The launcher and the engine factory: SGLang commands built from the config (sglang cannot run here: GPU only,
so only its command line is checked and sglang is never imported), local engine processes started, checked and
stopped by pid, a start failure reported with the engine's log, and the done-when: GRPO against two local engine
processes over HTTP through the router, reward rising."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swerl.config import load_config
from swerl.config.engine import EngineConfig
from swerl.engine.base import Engine, GenerateRequest, SamplingParams
from swerl.engine.factory import open_engine, server_spec
from swerl.engine.launcher import EngineLauncher, LocalServerSpec, SGLangSpec, sglang_available
from swerl.engine.router import Router
from swerl.model.loading import save_model_and_tokenizer
from swerl.rollout.groups import rollout_groups
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.engine_helpers import LAUNCHER_ARGS, greedy, process_gone, prompt_of
from tests.tiny_models import TinyModels, tiny_qwen3
from tests.trainer_helpers import grpo_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_sglang_commands_come_from_the_config(tmp_path: Path) -> None:
    cfg = EngineConfig.model_validate(
        {
            "kind": "sglang",
            "max_context_tokens": 65536,
            "max_batch_size": 16,
            "launch": {"num_engines": 2, "base_port": 30000},
            "sglang": {
                "tp_size": 2,
                "mem_fraction_static": 0.8,
                "sglang_args": ["--attention-backend", "fa3"],
            },
        }
    )
    spec = server_spec(cfg, "/models/qwen3", seed=7, weight_version=3)
    assert isinstance(spec, SGLangSpec)
    launcher = EngineLauncher(
        spec, cfg.launch.num_engines, tmp_path, **(LAUNCHER_ARGS | {"base_port": cfg.launch.base_port})
    )
    (port0, argv0, env0), (port1, argv1, env1) = launcher.commands()
    assert (port0, port1) == (30000, 30001)
    assert argv0[:3] == [sys.executable, "-m", "sglang.launch_server"]
    flags = {flag: value for flag, value in zip(argv0, argv0[1:], strict=False) if flag.startswith("--")}
    assert flags["--model-path"] == "/models/qwen3" and flags["--host"] == "127.0.0.1"
    assert flags["--port"] == "30000" and flags["--tp-size"] == "2" and flags["--context-length"] == "65536"
    assert flags["--mem-fraction-static"] == "0.8" and flags["--max-running-requests"] == "16"
    assert flags["--weight-version"] == "3" and argv0[-2:] == ["--attention-backend", "fa3"]
    assert "--skip-server-warmup" in argv0
    assert (env0["CUDA_VISIBLE_DEVICES"], env1["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")
    assert "--random-seed" in argv1 and argv1[argv1.index("--random-seed") + 1] == "8"


@pytest.mark.slow  # a fresh interpreter importing the stages (torch, transformers): ~70 s on a loaded machine
def test_sglang_is_never_imported_on_cpu(tmp_path: Path) -> None:
    code = "import sys, swerl.engine.factory, swerl.stages.grpo; print('sglang' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    if sglang_available():
        pytest.skip("sglang is installed here")
    spec = server_spec(EngineConfig(kind="sglang"), "/models/x", seed=0, weight_version=0)
    with pytest.raises(RuntimeError, match="gpu"):
        asyncio.run(EngineLauncher(spec, 1, tmp_path, **LAUNCHER_ARGS).start())


def test_every_config_file_engine_section_builds_a_spec() -> None:
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml")):
        cfg = load_config(path).engine
        assert cfg.pool_size(100) >= 100  # never below the stage's concurrency
        if cfg.kind != "local":
            server_spec(cfg, "/m", seed=0, weight_version=0)


@pytest.mark.slow
def test_a_failed_start_reports_the_log_and_leaves_nothing_running(tmp_path: Path) -> None:
    spec = LocalServerSpec(str(tmp_path / "no-model"), 1, 64, 1, 0)
    launcher = EngineLauncher(
        spec, 2, tmp_path / "logs", **(LAUNCHER_ARGS | {"startup_timeout_s": 240}), stop_timeout_s=5
    )
    with pytest.raises(RuntimeError, match="exited with"):
        asyncio.run(launcher.start())
    assert all(service.proc is not None and service.proc.poll() is not None for service in launcher.services)
    assert all(path.endswith(".log") and Path(path).read_text() for path in launcher.logs().values())


CORPUS = [
    "task 0: name a letter\n",
    "the quick brown fox jumps over the lazy dog\n",
    "abcdefghijklmnopqrstuvwxyz\n",
]


@pytest.mark.slow
def test_grpo_runs_over_http_through_the_router_on_two_engine_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_models: TinyModels
) -> None:
    """The done-when: GRPO with the engines as two local server processes behind the router (through
    open_engine, as the stages get them): both serve, every token is from the latest weights, reward rises, and
    the engines stop by pid at the end."""
    started = time.perf_counter()
    steps, num_tasks, attempts = 12, 8, 8
    tokenizer = tiny_models.tokenizer(CORPUS * 20, vocab_size=300)
    model = tiny_qwen3(tokenizer, 128)
    model_dir = save_model_and_tokenizer(model, tokenizer, tmp_path / "init")
    letters = frozenset(tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in "abcdefghijklmnopqrstuvwxyz")
    tasks = [tokenizer(f"task {i}: name a letter\n", add_special_tokens=False)["input_ids"] for i in range(num_tasks)]
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0)
    trainer = grpo_trainer(model, lr=1e-2, betas=(0.9, 0.99), tokenizer=tokenizer, seed=0)
    cfg = EngineConfig.model_validate(
        {
            "kind": "http_local",
            "max_batch_size": 64,
            "max_context_tokens": 128,
            "launch": {"num_engines": 2, "startup_timeout_s": 240},
            "router": {"health_interval_s": 1.0},
        }
    )

    async def episode(engine: Engine, task: list[int], *, attempt: int, group_id: str) -> Trajectory:
        response = await engine.generate(
            GenerateRequest(input_ids=task, sampling_params=sampling, rid=f"{group_id}/{attempt}")
        )
        reward = float(response.output_ids[0] in letters)
        return Trajectory(
            task_id=group_id,
            attempt=attempt,
            group_id=group_id,
            reward=reward,
            prompt_tokens=len(task),
            status=EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED,
            token_ids=task + response.output_ids,
            loss_mask=[0] * len(task) + [1] * len(response.output_ids),
            behaviour_logprobs=[0.0] * len(task) + response.output_token_logprobs,
            token_weight_versions=[-1] * len(task) + (response.output_token_weight_versions or []),
            num_turns=1,
        )

    launched_pids: list[int | None] = []
    original_start = EngineLauncher.start

    async def recording_start(self: EngineLauncher) -> list[str]:
        urls = await original_start(self)
        launched_pids.extend(self.pids)
        return urls

    monkeypatch.setattr(EngineLauncher, "start", recording_start)  # to check the processes are gone afterwards

    async def train() -> tuple[list[dict[str, float]], list[int]]:
        history = []
        async with open_engine(cfg, model_dir, concurrency=64, log_dir=tmp_path / "engines") as engine:
            assert isinstance(engine, Router) and len(engine.slots) == 2
            for step in range(steps):
                groups = await rollout_groups(engine, tasks, attempts, episode, 64, f"step{step}/")
                versions = {v for g in groups for t in g for v in t.token_weight_versions if v >= 0}
                assert versions == {step}  # synchronous: every token from the latest weights
                history.append(trainer.train_step(groups))
                await engine.update_weights_from_disk(str(trainer.export_weights(tmp_path / "exports")), step + 1)
            check = await engine.generate(greedy(prompt_of(3), 2))
            assert check.weight_version == steps
            served = [slot.requests for slot in engine.slots]
        return history, served

    history, served = asyncio.run(train())
    rewards = [stats["reward_mean"] for stats in history]
    print(
        "reward curve over HTTP:",
        " ".join(f"{reward:.2f}" for reward in rewards),
        f"({time.perf_counter() - started:.0f} s)",
    )
    assert min(served) > steps * num_tasks * attempts / 4, served  # both engines took a real share
    assert sum(rewards[:3]) / 3 < sum(rewards[-3:]) / 3 - 0.3, rewards
    assert all(stats["logprob_diff_mean"] < 1e-4 for stats in history)  # exact log-probs over HTTP
    assert len(launched_pids) == 2 and all(pid is not None and process_gone(pid) for pid in launched_pids)


@pytest.mark.slow
def test_agent_episodes_run_over_http_through_the_router(tmp_path: Path, tiny_models: TinyModels) -> None:
    """Real agent episodes (bubblewrap sandboxes, tools, grading) against two local engine processes behind the
    router: token in, token out over HTTP; every sampled token tagged with the served version; both engines used."""
    from swerl.agent.episode import EpisodeLimits, run_episode
    from swerl.agent.tools import system_prompt
    from swerl.data.bugs import candidates
    from swerl.data.repos import builtin_repo, tree_hash
    from swerl.data.schema import TaskInstance
    from tests.sandbox_helpers import local_provider

    repo = builtin_repo("intervals")
    source = (repo.path / "intervals/core.py").read_text()
    candidate = candidates("flip_comparison", "intervals/core.py", source)[0]
    task = TaskInstance(
        instance_id="intervals.http",
        repo=repo.repo,
        base_commit=tree_hash(repo.path),
        problem_statement="Fix it.",
        patch=candidate.bug_patch,
        patch_kind="bug",
        FAIL_TO_PASS=["tests/test_core.py::test_never_exists"],
        PASS_TO_PASS=[],
        image=repo.image,
        source="test",
        modifier=candidate.modifier,
    )
    tokenizer = tiny_models.tokenizer([system_prompt(), source] * 5, vocab_size=400)
    model = tiny_qwen3(tokenizer, 2048)
    model_dir = save_model_and_tokenizer(model, tokenizer, tmp_path / "policy")
    cfg = EngineConfig.model_validate(
        {
            "kind": "http_local",
            "max_context_tokens": 2048,
            "launch": {"num_engines": 2, "startup_timeout_s": 240},
        }
    )
    limits = EpisodeLimits(
        max_turns=2,
        max_trajectory_tokens=2048,
        max_new_tokens_per_turn=24,
        test_timeout_s=60,
        # EpisodeLimits' former defaults, which this test was written against
        command_timeout_s=30.0,
        max_observation_chars=4000,
        episode_timeout_s=1800.0,
        max_malformed_calls=1_000_000,
    )
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0)
    provider = local_provider(git_baseline=True)

    async def episodes() -> tuple[list[Trajectory], list[int]]:
        async with open_engine(cfg, model_dir, concurrency=4, log_dir=tmp_path / "engines") as engine:
            assert isinstance(engine, Router)
            await engine.update_weights_from_disk(str(model_dir), 5)
            runs = [
                run_episode(task, engine, provider, tokenizer, limits, sampling, attempt=a, group_id="g", rid=f"g/{a}")
                for a in range(4)
            ]
            return list(await asyncio.gather(*runs)), [slot.requests for slot in engine.slots]

    trajectories, served = asyncio.run(episodes())
    assert all(t.status != EpisodeStatus.INFRA_ERROR for t in trajectories), [t.infra_cause for t in trajectories]
    assert all(t.reward is not None and t.num_turns >= 1 for t in trajectories)
    for t in trajectories:
        sampled = [v for v, m in zip(t.token_weight_versions, t.loss_mask, strict=True) if m]
        assert sampled and set(sampled) == {5}
    assert min(served) >= 2  # each engine served whole trajectories (sticky by rid)
