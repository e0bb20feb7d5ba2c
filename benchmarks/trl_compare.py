"""swerl's torch backend against TRL, side by side in one process: SFT tokens/s and GRPO seconds/step, with ratios.

    .venv/bin/python benchmarks/trl_compare.py [--threads 2] [--rounds 2] [--sft-steps 4] [--grpo-steps 3]

The two trainers alternate step by step: TRL's Trainer runs its own loop, and a callback at the end of each of
its optimizer steps runs one step of swerl's trainer, so that load from other processes hits both sides alike.
A TRL step is timed from the end of that callback to its next step end (its data loading, forward, backward,
clipping, optimizer step and bookkeeping), a swerl step around its call; the first step of each side is a warm-up
and is not timed. Every step is timed in wall-clock seconds and in process CPU seconds (time.process_time, all
threads of the process), which other processes on a shared machine disturb less. Each round builds both models
afresh with the same initial weights. Figures are medians over all timed steps of all rounds; a ratio is the
median of the step-by-step ratios swerl / TRL (above 1: swerl makes more tokens/s in SFT, or takes more seconds
per GRPO step); the GRPO speed-up is the median of the step-by-step ratios TRL / swerl (above 1: swerl is faster).

Fairness rules (what both sides share):
- Model: the tiny Qwen3 of the other benchmarks (hidden 256, 4 layers, 4 heads / 2 KV heads, FFN 768, vocab 4096
  from a byte-level BPE trained here on the local standard library), float32 on CPU, same initial weights, same
  torch thread count (checked inside TRL's loop), sdpa attention, no gradient checkpointing, no torch.compile.
  Nothing is downloaded: tokenizer and model are built locally (swerl.model).
- Data: the same synthetic agent conversations in swerl's format (system prompt and tool-call text of
  swerl.agent.tools, tool observations numbered like `cat -n`, source lines of the standard library), rendered
  with swerl's chat template. swerl trains on render_messages (assistant-only loss mask); TRL gets the messages
  with `assistant_only_loss=True` and a copy of the same template with `{% generation %}` markers around each
  assistant turn's content and its <|im_end|>. The benchmark checks that TRL's tokenized, packed dataset holds
  exactly swerl's token ids and targets before timing anything.
- SFT step: `--rows` x `--seq-len` token slots per optimizer step on both sides, one micro-batch, no gradient
  accumulation. swerl's side is the body of train_sft's loop (next_micro_batches, then train_step: the same
  swerl.train.sft calls in the same order, without its per-step metrics), one call per TRL step. Both train
  padding-free rows with restarting position ids and no attention mask. swerl packs next-fit into rows and
  computes a micro-batch as one row of its examples' real tokens, attention once per example (sdpa, no mask: its
  swerl.train.packing) and the LM head at the targets only; TRL: `packing=True`, strategy "bfd", which turns on its
  padding-free collator (the rows of a batch concatenated into one sequence), for which transformers builds a
  dense block-diagonal causal mask over the whole row. tokens/s counts real tokens; "empty slots" is the share of
  rows x seq-len packing left unfilled (neither side computes them).
- GRPO step: `--prompts` groups x `--generations` attempts; each attempt is the prompt (system + user + generation
  prompt) followed by `--completion` sampled tokens, all trained. swerl's GRPOTrainer.train_step gets these as
  pre-made Trajectory objects; TRL's GRPOTrainer gets the very same token ids from its `rollout_func` hook (its
  supported replacement for generation), so both steps are the training update alone on identical tokens:
  rewards -> group advantages -> one forward/backward over all prompts x generations sequences -> clip -> AdamW. One
  optimizer update per step on both (TRL: gradient_accumulation_steps = num_iterations = 1, so the old log-probs are the
  detached current ones, as in swerl), no KL term, no reward scaling by std, clip range [0.8, 1.28], token-level loss
  normalisation (TRL loss_type "dapo"). A third run has TRL generate itself (transformers generate, exactly
  `--completion` new tokens via min_new_tokens, same prompts, rewards from the same table) and reports its
  generation time (`_generate`) separately; it runs in the first round only, is not interleaved and gives no
  ratio.
- Optimizer: torch.optim.AdamW in its default (non-fused) implementation on both sides (TRL `optim="adamw_torch"`),
  same lr, betas, eps, weight decay (on matrices only: both exclude norms and biases), grad-norm clipping at 1.0,
  constant learning rate.
- Nothing else in the timed region: no evaluation, no checkpoints, TRL logging off (`logging_strategy="no"`,
  `report_to="none"`, no progress bar). What each trainer computes inside its own step (TRL's entropy and token
  accuracy metrics, swerl's entropy and importance-weight statistics) is part of its step.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL

import datasets
import torch
import transformers
import trl
from common import demo_model, stdlib_texts
from datasets import Dataset
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from swerl.agent.tools import number_lines, system_prompt
from swerl.config.grpo import GRPOAlgorithmConfig
from swerl.model.chat import CHAT_TEMPLATE, render_messages, render_text
from swerl.model.tokenizer import train_tokenizer
from swerl.model.toolcall import format_tool_call
from swerl.stages.grpo import update_settings
from swerl.train.grpo_trainer import GRPOTrainer as SwerlGRPOTrainer
from swerl.train.sft import (
    IGNORE_INDEX,
    DataPosition,
    build_optimizer,
    next_micro_batches,
    prepare_examples,
    seed_everything,
    train_step,
)
from swerl.trajectory import EpisodeStatus, Trajectory

# ----------------------------------------------------------------------------------------------------------------
# Model, tokenizer, template


def new_model(tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The tiny Qwen3, same initial weights on every call (seed 0), float32."""
    return demo_model(tokenizer)


def generation_marked_template() -> str:
    """swerl's chat template with `{% generation %}` around each assistant turn's content and its <|im_end|>.

    The marked span is exactly what render_messages puts in the loss mask: not the `<|im_start|>assistant\\n`
    header, not the newline after <|im_end|>.
    """
    replacements = [
        (
            "{{- '<|im_start|>assistant\\n' + content }}",
            "{{- '<|im_start|>assistant\\n' }}{%- generation %}{{- content }}",
        ),
        (
            "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == 'tool' %}",
            "        {{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n    {%- elif message.role == 'tool' %}",
        ),
    ]
    template = CHAT_TEMPLATE
    for old, new in replacements:
        if template.count(old) != 1:
            raise RuntimeError(f"swerl's chat template changed: {old!r} is not found exactly once")
        template = template.replace(old, new)
    return template


def trl_tokenizer(path: Path, chat_template: str) -> PreTrainedTokenizerBase:
    """A fresh copy of the saved tokenizer for one TRL trainer (TRL sets pad/eos on the object it gets)."""
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.chat_template = chat_template
    return tokenizer


# ----------------------------------------------------------------------------------------------------------------
# Synthetic data in swerl's format


class SyntheticAgent:
    """Agent conversations in swerl's format, made of standard-library source lines and identifiers."""

    def __init__(self, texts: Sequence[str], seed: int) -> None:
        self.files = [text.splitlines() for text in texts if text.count("\n") > 40]
        self.words = sorted({word for text in texts for word in re.findall(r"[a-z_]{4,12}", text)})
        self.rng = random.Random(seed)

    def sentence(self, low: int, high: int) -> str:
        words = self.rng.choices(self.words, k=self.rng.randint(low, high))
        return " ".join(words).capitalize() + "."

    def snippet(self, max_lines: int) -> tuple[str, int, int]:
        lines = self.rng.choice(self.files)
        count = self.rng.randint(3, max_lines)
        start = self.rng.randint(1, len(lines) - count)
        return "\n".join(lines), start, start + count - 1

    def prompt(self, task: int) -> list[dict[str, str]]:
        module = self.rng.choice(self.words)
        user = (
            f"Task {task}: {self.sentence(6, 16)} The failing test is tests/test_{module}.py::"
            f"test_{self.rng.choice(self.words)}."
        )
        return [{"role": "system", "content": system_prompt()}, {"role": "user", "content": user}]

    def conversation(self, task: int, max_turns: int) -> list[dict[str, str]]:
        messages = self.prompt(task)
        for _ in range(self.rng.randint(1, max_turns)):
            text, start, end = self.snippet(6)
            path = f"src/{self.rng.choice(self.words)}/{self.rng.choice(self.words)}.py"
            if self.rng.random() < 0.5:
                call = format_tool_call("view_file", {"path": path, "start_line": start, "end_line": end})
                observation = number_lines(text, start, end)
            else:
                word = self.rng.choice(self.words)
                call = format_tool_call("bash", {"command": f"grep -n {word} {path} | head"})
                observation = "\n".join(
                    f"{n}:{line}" for n, line in enumerate(text.splitlines()[start - 1 : end], start)
                )
            messages.append({"role": "assistant", "content": f"{self.sentence(4, 14)}\n{call}"})
            messages.append({"role": "tool", "content": observation})
        messages.append({"role": "assistant", "content": f"{self.sentence(4, 14)}\n{format_tool_call('submit', {})}"})
        return messages


@dataclass(frozen=True)
class SFTData:
    conversations: list[list[dict[str, str]]]
    examples: list[tuple[list[int], list[int]]]  # swerl's (input_ids, loss_mask) of each conversation


def sft_data(tokenizer: PreTrainedTokenizerBase, agent: SyntheticAgent, count: int, max_len: int) -> SFTData:
    """count conversations of 1-4 tool calls whose rendering fits max_len tokens."""
    conversations: list[list[dict[str, str]]] = []
    examples: list[tuple[list[int], list[int]]] = []
    while len(conversations) < count:
        messages = agent.conversation(len(conversations), max_turns=4)
        ids, mask = render_messages(tokenizer, messages)
        if len(ids) <= max_len:
            conversations.append(messages)
            examples.append((ids, mask))
    return SFTData(conversations, examples)


@dataclass(frozen=True)
class GRPOData:
    prompts: list[list[dict[str, str]]]  # one per group
    prompt_ids: list[list[int]]
    completions: list[list[list[int]]]  # [group][attempt] token ids
    logprobs: list[list[list[float]]]  # [group][attempt] behaviour log-probs
    rewards: list[list[float]]  # [group][attempt]
    groups: list[list[Trajectory]]  # the same, as swerl's trajectories


def grpo_data(
    tokenizer: PreTrainedTokenizerBase, agent: SyntheticAgent, prompts: int, attempts: int, completion: int
) -> GRPOData:
    """Groups of single-turn attempts: a prompt and `completion` sampled tokens each, rewards 0/1 with signal."""
    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    data: dict[str, list[Any]] = {key: [] for key in ("prompts", "ids", "comp", "lps", "rewards", "groups")}
    for task in range(prompts):
        messages = agent.prompt(task)
        text = render_text(tokenizer, messages, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        comps = [torch.randint(7, vocab, (completion,), generator=generator).tolist() for _ in range(attempts)]
        lps = [
            (-torch.rand(completion, generator=generator) * 2 - 7.0).tolist() for _ in range(attempts)
        ]  # about log(1/4096)
        rewards = [float((task + attempt) % 2) for attempt in range(attempts)]  # every group has signal
        group = [
            Trajectory(
                task_id=f"task{task}",
                attempt=attempt,
                group_id=str(task),
                status=EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED,
                reward=reward,
                prompt_tokens=len(ids),
                token_ids=ids + comp,
                loss_mask=[0] * len(ids) + [1] * completion,
                behaviour_logprobs=[0.0] * len(ids) + lp,
                token_weight_versions=[-1] * len(ids) + [0] * completion,
                num_turns=1,
            )
            for attempt, (comp, lp, reward) in enumerate(zip(comps, lps, rewards, strict=True))
        ]
        for key, value in zip(data, (messages, ids, comps, lps, rewards, group), strict=True):
            data[key].append(value)
    return GRPOData(data["prompts"], data["ids"], data["comp"], data["lps"], data["rewards"], data["groups"])


# ----------------------------------------------------------------------------------------------------------------
# Step-by-step interleaving


@dataclass
class Steps:
    """Per-step wall time and process CPU time (s) and tokens of one side of a run, the warm-up step left out."""

    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # all threads of the process
    tokens: list[int] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        return [tokens / seconds for tokens, seconds in zip(self.tokens, self.seconds, strict=True)]

    @property
    def cpu_rates(self) -> list[float]:
        return [tokens / seconds for tokens, seconds in zip(self.tokens, self.cpu_seconds, strict=True)]


def clocks() -> tuple[float, float]:
    """(wall, process CPU) seconds now."""
    return time.perf_counter(), time.process_time()


class Interleave(TrainerCallback):
    """Runs one swerl step after every TRL optimizer step, so that the two trainers alternate step by step.

    A TRL step is timed from the end of the previous callback to its on_step_end (its data loading, forward,
    backward, clipping, optimizer and bookkeeping); the swerl step is timed around its call. TRL's first step has no
    start and swerl's first step is dropped: both are warm-ups. Checks the torch thread count at every step.
    """

    def __init__(self, threads: int, swerl_step: Callable[[], int] | None) -> None:
        self.threads = threads
        self.swerl_step = swerl_step
        self.trl = Steps()
        self.swerl = Steps()
        self._resumed: tuple[float, float] | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        wall, cpu = clocks()
        if torch.get_num_threads() != self.threads:
            raise RuntimeError(f"TRL runs with {torch.get_num_threads()} threads, not {self.threads}")
        if self._resumed is not None:
            self.trl.seconds.append(wall - self._resumed[0])
            self.trl.cpu_seconds.append(cpu - self._resumed[1])
        if self.swerl_step is not None:
            wall, cpu = clocks()
            tokens = self.swerl_step()
            if state.global_step > 1:
                end_wall, end_cpu = clocks()
                self.swerl.seconds.append(end_wall - wall)
                self.swerl.cpu_seconds.append(end_cpu - cpu)
                self.swerl.tokens.append(tokens)
        self._resumed = clocks()


def common_trl_args(out_dir: str, steps: int, lr: float, betas: tuple[float, float], weight_decay: float) -> dict:
    return dict(
        output_dir=out_dir,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_epsilon=1e-8,
        weight_decay=weight_decay,
        max_grad_norm=1.0,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=0,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def quiet_train(trainer: Any) -> None:
    with contextlib.redirect_stdout(io.StringIO()):  # the summary Trainer prints after the last step
        trainer.train()


# ----------------------------------------------------------------------------------------------------------------
# SFT

SFT_LR, SFT_BETAS, SFT_WEIGHT_DECAY, SFT_EPS = 3e-4, (0.9, 0.95), 0.1, 1e-8  # swerl's train_sft defaults


class SwerlSFTStepper:
    """swerl's SFT, one optimizer step per call: the body of train_sft's loop (the same sft.py calls in the same
    order: next_micro_batches, then train_step), without its per-step metrics and checkpoints."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, data: SFTData, args: argparse.Namespace) -> None:
        self.model = new_model(tokenizer).train()
        self.data = prepare_examples(data.examples, args.seq_len, self.model.config.vocab_size)
        seed_everything(0)
        self.optimizer = build_optimizer(self.model, SFT_LR, SFT_WEIGHT_DECAY, SFT_BETAS, SFT_EPS)
        self.position = DataPosition(0, 0)
        self.seq_len, self.rows = args.seq_len, args.rows

    def __call__(self) -> int:
        micro_batches, self.position = next_micro_batches(self.data, self.position, 0, self.seq_len, self.rows, 1)
        train_step(self.model, self.optimizer, micro_batches, SFT_LR, max_grad_norm=1.0, bf16=False)
        return sum(batch.num_tokens for batch in micro_batches)


class _TokenCountingSFTTrainer(SFTTrainer):
    """SFTTrainer that records the real tokens of every micro-batch it trains on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bench_tokens: list[int] = []

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if "attention_mask" in inputs:
            self.bench_tokens.append(int(inputs["attention_mask"].sum()))
        else:  # padding-free: one concatenated sequence, no padding
            self.bench_tokens.append(int(inputs["input_ids"].numel()))
        return super().training_step(model, inputs, *args, **kwargs)


def check_trl_sft_examples(trainer: SFTTrainer, data: SFTData) -> None:
    """TRL's packed dataset must hold exactly swerl's examples: same ids, same targets (labels unshifted)."""
    theirs = []
    dataset: Any = trainer.train_dataset  # a datasets.Dataset of packed rows
    for row in dataset:
        start = 0
        for length in row["seq_lengths"]:
            theirs.append(
                (
                    tuple(row["input_ids"][start : start + length]),
                    tuple(row["labels"][start : start + length]),
                )
            )
            start += length
    ours = [
        (tuple(ids), tuple(token if keep else IGNORE_INDEX for token, keep in zip(ids, mask, strict=True)))
        for ids, mask in data.examples
    ]
    if Counter(theirs) != Counter(ours):
        raise RuntimeError(
            f"TRL's SFT examples differ from swerl's ({len(theirs)} vs {len(ours)} examples): not the same data"
        )


def sft_round(
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_dir: Path,
    data: SFTData,
    args: argparse.Namespace,
    check: bool,
) -> tuple[Steps, Steps]:
    """One TRL SFTTrainer run with a swerl SFT step after each of its steps; (swerl, TRL) timed steps."""
    trl_tok = trl_tokenizer(tokenizer_dir, generation_marked_template())
    interleave = Interleave(args.threads, SwerlSFTStepper(tokenizer, data, args))
    with tempfile.TemporaryDirectory() as out_dir:
        config = SFTConfig(
            **common_trl_args(out_dir, args.sft_steps + 1, SFT_LR, SFT_BETAS, SFT_WEIGHT_DECAY),
            per_device_train_batch_size=args.rows,
            max_length=args.seq_len,
            packing=True,
            packing_strategy="bfd",  # implies padding_free
            assistant_only_loss=True,
        )
        trainer = _TokenCountingSFTTrainer(
            model=new_model(trl_tok),
            args=config,
            train_dataset=Dataset.from_list([{"messages": messages} for messages in data.conversations]),
            processing_class=trl_tok,
            callbacks=[interleave],
        )
        if check:
            check_trl_sft_examples(trainer, data)
        quiet_train(trainer)
    interleave.trl.tokens = trainer.bench_tokens[1:]
    return interleave.swerl, interleave.trl


# ----------------------------------------------------------------------------------------------------------------
# GRPO

GRPO_LR, GRPO_BETAS, GRPO_EPS = 1e-6, (0.9, 0.999), 1e-8  # swerl's GRPOTrainer defaults


class _TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that records the time of its generation phase (`_generate`) at every step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bench_generation: list[float] = []

    def _generate(self, prompts: list) -> Any:
        started = time.perf_counter()
        try:
            return super()._generate(prompts)
        finally:
            self.bench_generation.append(time.perf_counter() - started)


def _attempt_numbers(tasks: Sequence[int]) -> list[int]:
    """The k-th occurrence of a task in a batch is its attempt k."""
    seen: Counter[int] = Counter()
    numbers = []
    for task in tasks:
        numbers.append(seen[task])
        seen[task] += 1
    return numbers


def swerl_grpo_stepper(tokenizer: PreTrainedTokenizerBase, data: GRPOData, args: argparse.Namespace) -> Callable:
    """swerl's GRPOTrainer.train_step on the pre-made groups, one call per step; returns the tokens trained."""
    longest = max(len(t.token_ids) for group in data.groups for t in group)
    algorithm = GRPOAlgorithmConfig(
        lr=GRPO_LR,
        weight_decay=0.0,
        grad_clip=1.0,
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        kl_coef=0.0,
        scale_adv_by_std=False,
        micro_batch_tokens=longest * args.prompts * args.generations,  # one micro-batch, like TRL's
    )
    trainer = SwerlGRPOTrainer(new_model(tokenizer), update_settings(algorithm), betas=GRPO_BETAS, adam_eps=GRPO_EPS)
    tokens = sum(len(t.token_ids) for group in data.groups for t in group)

    def step() -> int:
        stats = trainer.train_step(data.groups)
        if stats["optimizer_updates"] != 1 or stats["micro_batches"] != 1:
            raise RuntimeError(f"swerl's step is not one update on one micro-batch: {stats}")
        return tokens

    return step


def grpo_round(
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_dir: Path,
    data: GRPOData,
    args: argparse.Namespace,
    generate: bool,
    check: bool,
) -> tuple[Steps, Steps, list[float]]:
    """One TRL GRPOTrainer run, with a swerl GRPO step after each of its steps unless TRL generates.

    Returns the timed steps of swerl and TRL and TRL's generation seconds per timed step.
    """
    trl_tok = trl_tokenizer(tokenizer_dir, CHAT_TEMPLATE)
    task_of_prompt = {json.dumps(prompt): task for task, prompt in enumerate(data.prompts)}

    def reward(prompts: list, completions: list, task: list[int], **kwargs: Any) -> list[float]:
        return [data.rewards[t][a] for t, a in zip(task, _attempt_numbers(task), strict=True)]

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        """The pre-made attempts of each prompt, in attempt order: the tokens swerl trains on."""
        tasks = [task_of_prompt[json.dumps(prompt)] for prompt in prompts]
        attempts = _attempt_numbers(tasks)
        return {
            "prompt_ids": [data.prompt_ids[t] for t in tasks],
            "completion_ids": [data.completions[t][a] for t, a in zip(tasks, attempts, strict=True)],
            "logprobs": [data.logprobs[t][a] for t, a in zip(tasks, attempts, strict=True)],
        }

    steps = (args.generate_steps if generate else args.grpo_steps) + 1
    interleave = Interleave(args.threads, None if generate else swerl_grpo_stepper(tokenizer, data, args))
    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            **common_trl_args(out_dir, steps, GRPO_LR, GRPO_BETAS, 0.0),
            per_device_train_batch_size=args.prompts * args.generations,  # the whole generation batch: one update
            num_generations=args.generations,
            num_iterations=1,
            shuffle_dataset=False,  # every step takes the dataset's next `prompts` rows: tasks 0..prompts-1
            max_completion_length=args.completion,
            generation_kwargs={"min_new_tokens": args.completion},  # used only when TRL generates
            temperature=1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",
            scale_rewards="none",
            log_completions=False,
        )
        rows = [{"prompt": prompt, "task": task} for task, prompt in enumerate(data.prompts)] * steps
        trainer = _TimedGRPOTrainer(
            model=new_model(trl_tok),
            reward_funcs=[reward],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=trl_tok,
            callbacks=[interleave],
            rollout_func=None if generate else rollout,
        )
        if check and generate:  # TRL's own prompt rendering must give swerl's prompt ids
            rendered: Any = trl_tok.apply_chat_template(
                data.prompts, add_generation_prompt=True, tokenize=True, return_dict=True
            )
            if [list(ids) for ids in rendered["input_ids"]] != data.prompt_ids:
                raise RuntimeError("TRL renders the GRPO prompts to other token ids than swerl")
        quiet_train(trainer)
    tokens = sum(len(ids) + args.completion for ids in data.prompt_ids) * args.generations
    interleave.trl.tokens = [tokens] * len(interleave.trl.seconds)
    return interleave.swerl, interleave.trl, trainer.bench_generation[1:]


# ----------------------------------------------------------------------------------------------------------------
# Main


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=2, help="runs of each comparison (fresh models each)")
    parser.add_argument("--only", choices=["sft", "grpo"], help="run one comparison only")
    parser.add_argument("--seq-len", type=int, default=2048, help="SFT: tokens per packed row")
    parser.add_argument("--rows", type=int, default=1, help="SFT: packed rows per optimizer step")
    parser.add_argument("--sft-steps", type=int, default=4, help="SFT: timed steps per round (after a warm-up)")
    parser.add_argument("--sft-examples", type=int, default=200, help="SFT: conversations in the dataset")
    parser.add_argument("--prompts", type=int, default=4, help="GRPO: groups (prompts) per step")
    parser.add_argument("--generations", type=int, default=4, help="GRPO: attempts per prompt")
    parser.add_argument("--completion", type=int, default=64, help="GRPO: sampled tokens per attempt")
    parser.add_argument("--grpo-steps", type=int, default=3, help="GRPO: timed steps per round (after a warm-up)")
    parser.add_argument(
        "--generate-steps",
        type=int,
        default=1,
        help="GRPO, TRL with its own generation: timed steps (first round only)",
    )
    parser.add_argument("--no-trl-generate", action="store_true", help="skip the run of TRL with its generation")
    parser.add_argument("--corpus-bytes", type=int, default=3_000_000, help="tokenizer training text")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames, raised inside TRL

    with tempfile.TemporaryDirectory() as scratch:
        texts = stdlib_texts(args.corpus_bytes)
        tokenizer = train_tokenizer(texts, vocab_size=4096, out_dir=scratch)
        tokenizer_dir = Path(scratch)
        agent = SyntheticAgent(texts, seed=0)
        sft = sft_data(tokenizer, agent, args.sft_examples, args.seq_len)
        grpo = grpo_data(tokenizer, agent, args.prompts, args.generations, args.completion)
        lengths = [len(ids) for ids, _ in sft.examples]
        prompt_lengths = [len(ids) for ids in grpo.prompt_ids]
        print(
            f"TRL {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}; "
            f"tiny Qwen3 (hidden 256, 4 layers, FFN 768, vocab {len(tokenizer)}), fp32, {args.threads} threads"
        )
        print(
            f"SFT: {len(sft.examples)} conversations of {min(lengths)}-{max(lengths)} tokens "
            f"({sum(sum(mask) for _, mask in sft.examples) / sum(lengths):.0%} assistant), "
            f"{args.rows} x {args.seq_len} tokens per step, {args.rounds} rounds x {args.sft_steps} timed steps"
        )
        print(
            f"GRPO: {args.prompts} prompts x {args.generations} attempts of {min(prompt_lengths)}-"
            f"{max(prompt_lengths)} prompt + {args.completion} completion tokens, {args.rounds} rounds x "
            f"{args.grpo_steps} timed steps"
        )
        sft_pairs: list[tuple[Steps, Steps]] = []
        grpo_pairs: list[tuple[Steps, Steps]] = []
        generate_runs: list[tuple[Steps, list[float]]] = []
        for round_index in range(args.rounds):
            first = round_index == 0
            if args.only != "grpo":
                sft_pairs.append(sft_round(tokenizer, tokenizer_dir, sft, args, check=first))
                ours, theirs = sft_pairs[-1]
                print(
                    f"  round {round_index + 1} SFT   swerl {statistics.median(ours.rates):6.0f} tokens/s, "
                    f"TRL {statistics.median(theirs.rates):6.0f} tokens/s",
                    flush=True,
                )
            if args.only != "sft":
                ours, theirs, _ = grpo_round(tokenizer, tokenizer_dir, grpo, args, generate=False, check=first)
                grpo_pairs.append((ours, theirs))
                print(
                    f"  round {round_index + 1} GRPO  swerl {statistics.median(ours.seconds):6.2f} s/step, "
                    f"TRL {statistics.median(theirs.seconds):6.2f} s/step",
                    flush=True,
                )
                if not args.no_trl_generate and first:
                    _, theirs, generation = grpo_round(tokenizer, tokenizer_dir, grpo, args, generate=True, check=first)
                    generate_runs.append((theirs, generation))
                    print(
                        f"  round {round_index + 1} GRPO  TRL with generation {statistics.median(theirs.seconds):6.2f}"
                        f" s/step, of which generation {statistics.median(generation):6.2f} s",
                        flush=True,
                    )
    return report(sft_pairs, grpo_pairs, generate_runs, args)


def merged(runs: Sequence[Steps]) -> Steps:
    """The timed steps of several runs as one."""
    return Steps(
        [s for run in runs for s in run.seconds],
        [s for run in runs for s in run.cpu_seconds],
        [t for run in runs for t in run.tokens],
    )


def _median_ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def report(
    sft_pairs: list[tuple[Steps, Steps]],
    grpo_pairs: list[tuple[Steps, Steps]],
    generate_runs: list[tuple[Steps, list[float]]],
    args: argparse.Namespace,
) -> dict[str, float]:
    """Medians over all timed steps of all rounds, and the medians of the step-by-step ratios; returns them."""
    results: dict[str, float] = {}
    if sft_pairs:
        swerl, trl_ = merged([pair[0] for pair in sft_pairs]), merged([pair[1] for pair in sft_pairs])
        slots = args.rows * args.seq_len
        print(f"{'SFT':<22}{'tokens/s':>10}{'tokens/CPU-s':>14}{'empty slots':>13}   (medians over steps)")
        for name, label, steps in (("swerl", "swerl train_sft", swerl), ("trl", "TRL SFTTrainer", trl_)):
            results[f"sft_{name}_tokens_per_s"] = statistics.median(steps.rates)
            results[f"sft_{name}_tokens_per_cpu_s"] = statistics.median(steps.cpu_rates)
            empty = 1 - statistics.mean(steps.tokens) / slots
            print(
                f"{label:<22}{results[f'sft_{name}_tokens_per_s']:>10.0f}"
                f"{results[f'sft_{name}_tokens_per_cpu_s']:>14.0f}{empty:>13.0%}"
            )
        results["sft_ratio"] = _median_ratio(swerl.rates, trl_.rates)
        results["sft_ratio_cpu"] = _median_ratio(swerl.cpu_rates, trl_.cpu_rates)
    if grpo_pairs:
        swerl, trl_ = merged([pair[0] for pair in grpo_pairs]), merged([pair[1] for pair in grpo_pairs])
        print(f"{'GRPO':<22}{'s/step':>10}{'CPU-s/step':>14}   (medians over steps)")
        for name, label, steps in (("swerl", "swerl train_step", swerl), ("trl", "TRL GRPOTrainer", trl_)):
            results[f"grpo_{name}_s_per_step"] = statistics.median(steps.seconds)
            results[f"grpo_{name}_cpu_s_per_step"] = statistics.median(steps.cpu_seconds)
            print(
                f"{label:<22}{results[f'grpo_{name}_s_per_step']:>10.2f}{results[f'grpo_{name}_cpu_s_per_step']:>14.2f}"
            )
        results["grpo_ratio"] = _median_ratio(swerl.seconds, trl_.seconds)
        results["grpo_ratio_cpu"] = _median_ratio(swerl.cpu_seconds, trl_.cpu_seconds)
        results["grpo_speedup"] = _median_ratio(trl_.seconds, swerl.seconds)
        results["grpo_speedup_cpu"] = _median_ratio(trl_.cpu_seconds, swerl.cpu_seconds)
        if generate_runs:
            results["grpo_trl_generate_s_per_step"] = statistics.median(
                s for run in generate_runs for s in run[0].seconds
            )
            results["grpo_trl_generate_cpu_s_per_step"] = statistics.median(
                s for run in generate_runs for s in run[0].cpu_seconds
            )
            results["grpo_trl_generation_s"] = statistics.median(s for run in generate_runs for s in run[1])
            print(
                f"{'TRL, own generation':<22}{results['grpo_trl_generate_s_per_step']:>10.2f}"
                f"{results['grpo_trl_generate_cpu_s_per_step']:>14.2f}"
                f"   (generation: {results['grpo_trl_generation_s']:.2f} s of the step)"
            )
    if "sft_ratio" in results:
        print(
            f"SFT tokens/s   swerl / TRL = {results['sft_ratio']:.2f}x wall, {results['sft_ratio_cpu']:.2f}x CPU "
            "(medians of step-by-step ratios)"
        )
    if "grpo_ratio" in results:
        print(
            f"GRPO s/step    swerl / TRL = {results['grpo_ratio']:.2f}x wall, {results['grpo_ratio_cpu']:.2f}x CPU "
            "(medians of step-by-step ratios)"
        )
        print(
            f"GRPO speed-up  TRL / swerl = {results['grpo_speedup']:.2f}x wall, "
            f"{results['grpo_speedup_cpu']:.2f}x CPU (medians of step-by-step ratios)"
        )
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
