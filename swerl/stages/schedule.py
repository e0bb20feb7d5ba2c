"""Which checkpoints in the store await evaluation (the scheduled evaluation flow evaluates each of them).

A checkpoint is a published manifest of a checkpoint-producing stage: `stages/sft/KEY/manifest.json` (base and
SFT models), `stages/grpo/KEY/manifest.json` (the GRPO model) or `stages/grpo-NAME/KEY/manifest.json` (the model
at the end of GRPO phase NAME), each evaluated on its own. It has been evaluated when some evaluate manifest
lists it among its inputs with the same fingerprint (a forced rerun that republished the stage under the same key
changes the fingerprint, so the new model is evaluated again). Its held-out tasks come from the curate manifest it
was trained from (its `curate` input), so a checkpoint is always evaluated on the held-out split of its own run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from swerl.stages.runner import Manifest, read_manifest
from swerl.storage import CorruptStoreFile, Store

log = logging.getLogger("swerl.schedule")

CHECKPOINT_STAGES = ("sft", "grpo")
"""Stages whose manifests hold checkpoints; `grpo` also stands for each GRPO phase's stage (grpo-NAME)."""


def checkpoint_stages(store: Store) -> list[str]:
    """The checkpoint stages present in the store: sft, grpo and every GRPO phase's grpo-NAME (sorted)."""
    present = {rel.rsplit("/", 1)[-1] for rel in store.list("stages")}
    phases = sorted(s for s in present if s.startswith("grpo-"))
    return [s for s in CHECKPOINT_STAGES if s in present] + phases


def _pipeline_rank(stage: str) -> int:
    return CHECKPOINT_STAGES.index("grpo" if stage.startswith("grpo-") else stage)


@dataclass(frozen=True)
class PendingCheckpoint:
    checkpoint: Manifest
    curate: Manifest

    @property
    def label(self) -> str:
        return f"{self.checkpoint.stage}/{self.checkpoint.key}"


def _manifests(store: Store, stage: str) -> list[Manifest]:
    out = []
    for key_dir in store.list(f"stages/{stage}"):
        rel = f"{key_dir}/manifest.json"
        if not store.exists(rel):
            continue
        try:
            out.append(read_manifest(store, rel))  # URIs resolved against this store (manifests are relative)
        except CorruptStoreFile as exc:
            log.warning("%s; that stage counts as not done", exc)
    return out


def evaluated_inputs(store: Store) -> set[tuple[str, str]]:
    """(uri, fingerprint) of every manifest some evaluation has taken as input."""
    return {(ref.uri, ref.fingerprint) for m in _manifests(store, "evaluate") for ref in m.inputs}


def pending_evaluations(store: Store) -> tuple[list[PendingCheckpoint], list[str]]:
    """Checkpoints not evaluated yet (oldest first), and why others cannot be evaluated (for the report)."""
    done = evaluated_inputs(store)
    pending: list[PendingCheckpoint] = []
    problems: list[str] = []
    for stage in checkpoint_stages(store):
        for manifest in _manifests(store, stage):
            if (manifest.uri, manifest.fingerprint) in done:
                continue
            ref = next((r for r in manifest.inputs if r.stage == "curate"), None)
            if ref is None:
                problems.append(f"{manifest.uri}: no curate input, so no held-out tasks to evaluate it on")
                continue
            rel = store.rel_of(ref.uri)
            if not store.exists(rel):
                problems.append(f"{manifest.uri}: its curate manifest {ref.uri} is gone")
                continue
            try:
                curate = read_manifest(store, rel)
            except CorruptStoreFile as exc:
                problems.append(f"{manifest.uri}: {exc}")
                continue
            if curate.fingerprint != ref.fingerprint:
                problems.append(f"{manifest.uri}: its curate manifest {ref.uri} was rerun since (other tasks)")
                continue
            pending.append(PendingCheckpoint(manifest, curate))
    # oldest first; within one timestamp (a fast pipeline), in pipeline order (sft before grpo, a GRPO phase after
    # the phase it started from)
    by_uri = {p.checkpoint.uri: p.checkpoint for p in pending}

    def depth(m: Manifest) -> int:
        earlier = [by_uri[ref.uri] for ref in m.inputs if ref.uri in by_uri and ref.stage.startswith("grpo")]
        return 1 + max(map(depth, earlier)) if earlier else 0

    pending.sort(
        key=lambda p: (
            p.checkpoint.finished_at,
            _pipeline_rank(p.checkpoint.stage),
            depth(p.checkpoint),
            p.checkpoint.uri,
        )
    )
    return pending, problems


def schedule_report(evaluated: list[tuple[PendingCheckpoint, str]], problems: list[str], store_uri: str) -> str:
    """Markdown summary of one scheduled evaluation run: what was evaluated, with what result, what was not."""
    lines = ["# Scheduled evaluation", "", f"Store: `{store_uri}`", ""]
    if not evaluated and not problems:
        lines.append("No checkpoint awaits evaluation.")
    if evaluated:
        lines += ["| checkpoint | manifest | result |", "| --- | --- | --- |"]
        lines += [f"| {p.label} | `{p.checkpoint.uri}` | {result} |" for p, result in evaluated]
    if problems:
        lines += ["", "Not evaluated:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"
