"""A chaos run of the asynchronous GRPO stage: faults injected on a seeded schedule, then the books are checked.

The GRPO stage runs for real in a subprocess (as tests/stages/test_grpo_async_crash.py does): a tiny Qwen3 served by the
real HTTP engine server (swerl.engine.server, engine kind http_local) behind a fault proxy (tests/doubles.py
FaultProxy), real local sandboxes
on clean micro repositories, real grading, an S3 store (a SeaweedFS server this script starts on 127.0.0.1 with
credentials it generates; --store file for a file:// one) and a sqlite MLflow. The proxy speaks the engine's API
and takes emulated_server's POST /fault bodies ({"status": 503}, {"drop": true}, {"delay_s": s}, "count").

Faults, drawn from a seeded RNG while the stage runs:
  stage_sigkill   SIGKILL of the stage process at a random moment (its process group is then reaped), then a rerun
  sandbox_kill    SIGKILL of a random process running under a sandbox uid beneath the stage
  engine_5xx      the next /generate answers HTTP 503
  engine_drop     the next /generate has its connection dropped
  engine_hang     the next /generate sleeps past engine.http.request_timeout_s (or a shorter stall)
  disk_full       a live sandbox's workspace filesystem filled to ENOSPC (a big file written into it)
  s3_restart      the S3 server (SeaweedFS on loopback, the store with --store s3, the default) stopped, left down
                  for a moment and started again on the same data; the store's retries (storage.max_attempts)
                  must carry the stage across it

Printed: faults by kind, trainer crashes (stage exits that were not an injected SIGKILL), trajectories lost or
trained twice (ledger vs journal), infra errors that reached a loss or a baseline (the attempts the trainer says
it scored, per step, in the ledger, looked up in the journal: status infra_error or reward None) and whether the
final model equals an undisturbed run's with the same seed.

    nice -n 19 .venv/bin/python benchmarks/chaos.py [--steps 6] [--faults 200] [--out results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SANDBOX_UIDS = (200_000, 1_200_000)  # swerl.sandbox.local.LocalSandboxProvider's default uid_range


def settings(args: dict[str, Any]) -> tuple[Any, Any, Any]:
    from swerl.config.agent import AgentConfig
    from swerl.config.engine import EngineConfig
    from swerl.config.grpo import GRPOConfig

    grpo = GRPOConfig.model_validate(
        {
            "mode": "async",
            "threads": 1,
            "schedule": {"steps": args["steps"], "tasks_per_step": args["b"], "checkpoint_every": 1},
            "rollout": {
                "attempts_per_task": args["n"],
                "max_in_flight": 4,
                "max_staleness": 1,
                "max_extra_groups_per_step": 4,
            },
            "algorithm": {"lr": 1e-3},
        }
    )
    agent = AgentConfig.model_validate(
        {
            "max_turns": 2,
            "max_trajectory_tokens": 512,
            "max_new_tokens_per_turn": 16,
            "max_malformed_calls": 1,
            "command_timeout_s": 20,
            "test_timeout_s": 30,
            "infra_retries": 3,
            "sandbox": {"runtime": args["runtime"]},
        }
    )
    engine = EngineConfig.model_validate(
        {
            "kind": "http_local",
            "max_batch_size": 4,
            "max_context_tokens": 512,
            "local": {"threads": 1},
            "http": {"request_timeout_s": args["request_timeout_s"], "retries": 2, "retry_backoff_s": 0.2},
            "router": {"health_interval_s": args["health_interval_s"]},
        }
    )
    return grpo, agent, engine


def stores(root: Path) -> tuple[Any, Any]:
    """The run's store (root/store.json says which: an S3 endpoint, credentials in the environment) and MLflow."""
    from swerl.storage import open_store
    from swerl.tracking import Tracker

    where = json.loads((root / "store.json").read_text()) if (root / "store.json").exists() else {}
    store = open_store(where.get("root", f"file://{root}/store"), s3_endpoint_url=where.get("endpoint"))
    return store, Tracker(f"sqlite:///{root}/mlflow.db", "grpo-chaos")


def start_s3(root: Path) -> Any:
    """A SeaweedFS S3 server for the run's store; its credentials go into this process's environment (which the
    stage's subprocesses inherit), never into a file or the results."""
    import secrets

    from swerl import services

    access, secret = "chaos-" + secrets.token_hex(4), secrets.token_urlsafe(24)
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = access, secret
    ports = services.SeaweedPorts.free()
    server = services.seaweedfs(root / "s3", ports, bucket="swerl", access_key=access, secret_key=secret)
    server.stop_timeout_s = 5.0
    server.start()
    endpoint = f"http://127.0.0.1:{ports.s3}"
    (root / "store.json").write_text(json.dumps({"root": "s3://swerl/chaos", "endpoint": endpoint}))
    return server


def make_inputs(root: Path, tasks: int) -> None:
    """curate (clean micro tasks) and sft (a tiny untrained model) manifests, written by literal stages."""
    from benchmarks.grpo_async import clean_micro_tasks, emulation_tokenizer
    from swerl.config.engine import EngineConfig
    from swerl.data.taskio import tasks_to_parquet
    from swerl.model.loading import save_model_and_tokenizer
    from swerl.stages.common import put_dir
    from swerl.stages.runner import StageContext, StageResult, run_stage
    from tests.tiny_models import SMALL, tiny_qwen3

    def curate(cfg: Any, ctx: StageContext) -> StageResult:
        ctx.write_artifact("train.parquet", tasks_to_parquet(clean_micro_tasks(tasks)))
        ctx.write_artifact("eval.parquet", tasks_to_parquet([]))
        return StageResult()

    def sft(cfg: Any, ctx: StageContext) -> StageResult:
        tokenizer = emulation_tokenizer(ctx.workdir / "tokenizer")
        model = tiny_qwen3(tokenizer, 512, shape=SMALL)  # as tests/stages/test_grpo_async_crash.py builds it
        put_dir(ctx, "model", save_model_and_tokenizer(model, tokenizer, ctx.workdir / "model"))
        return StageResult()

    store, tracker = stores(root)
    for name, fn in (("curate", curate), ("sft", sft)):
        manifest = run_stage(name, fn, EngineConfig(), store=store, tracker=tracker, parent=None).manifest
        (root / f"{name}.json").write_text(manifest.model_dump_json())


# ----------------------------------------------------------------------------------------------------------------
# The child: the GRPO stage, its engine behind a fault proxy


def install_fault_proxy(control_port: int) -> None:
    """Make the stage's engine the real http_local server behind a FaultProxy on `control_port` (the stage is
    swerl's; only the factory it imported is wrapped, in this process)."""
    import swerl.stages.grpo as grpo_stage
    from swerl.engine import factory
    from swerl.engine.launcher import EngineLauncher
    from tests.doubles import FaultProxy

    real_open_engine = factory.open_engine

    @contextlib.asynccontextmanager
    async def open_engine(cfg: Any, model_dir: Any, **kw: Any) -> AsyncIterator[Any]:
        from aiohttp import ClientSession, web

        spec = factory.server_spec(cfg, model_dir, kw.get("seed", 0), kw.get("weight_version", 0))
        launcher = EngineLauncher(
            spec,
            1,
            kw.get("log_dir") or Path("engines"),
            host="127.0.0.1",
            base_port=free_port(),
            startup_timeout_s=cfg.launch.startup_timeout_s,
        )
        [upstream] = await launcher.start()
        print(f"chaos: engine server pids {launcher.pids} at {upstream}", file=sys.stderr, flush=True)
        proxy = FaultProxy(upstream)
        app = web.Application()
        app.router.add_post("/fault", proxy.fault)
        app.router.add_route("*", "/{tail:.*}", proxy.forward)
        runner = web.AppRunner(app, access_log=None)
        try:
            async with ClientSession() as session:
                proxy.session = session
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", control_port).start()
                launch = cfg.launch.model_copy(update={"urls": [f"http://127.0.0.1:{control_port}"]})
                async with real_open_engine(cfg.model_copy(update={"launch": launch}), model_dir, **kw) as engine:
                    yield engine
        finally:
            await runner.cleanup()
            launcher.stop()

    grpo_stage.open_engine = open_engine  # type: ignore[attr-defined]


def child(root: Path, stage: str, control_port: int) -> None:
    from swerl.stages.grpo import GRPOStage, run_grpo
    from swerl.stages.runner import Manifest, run_stage

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    args = json.loads((root / "settings.json").read_text())
    grpo, agent, engine = settings(args)
    install_fault_proxy(control_port)
    store, tracker = stores(root)
    inputs = [Manifest.model_validate_json((root / f"{name}.json").read_text()) for name in ("curate", "sft")]
    run_stage(
        stage,
        run_grpo,
        GRPOStage(grpo=grpo, agent=agent, engine=engine),
        store=store,
        tracker=tracker,
        parent=None,
        inputs=inputs,
        seed=args["seed"],
    )


# ----------------------------------------------------------------------------------------------------------------
# The parent: spawn, inject, check


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(root: Path, stage: str, port: int) -> subprocess.Popen[bytes]:
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    env = os.environ | {"PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    log = open(root / f"{stage}.log", "ab")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(
        [sys.executable, __file__, "--child", str(root), stage, str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reap_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever the stage's session left (engine server, supervisors): the next run must start clean."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class Injector:
    """Non-SIGKILL faults on a seeded schedule while the stage runs."""

    WEIGHTS = {"engine_5xx": 3, "engine_drop": 2, "engine_hang": 1, "sandbox_kill": 3, "disk_full": 1, "s3_restart": 1}

    def __init__(self, root: Path, rng: random.Random, interval_s: float, hang_s: float, s3: Any = None) -> None:
        self.root, self.rng, self.interval_s, self.hang_s, self.s3 = root, rng, interval_s, hang_s, s3
        self.counts: Counter[str] = Counter()
        self.attempted: Counter[str] = Counter()
        self.pid: int | None = None
        self.port: int | None = None
        self.stop = threading.Event()
        self.filled: list[Path] = []

    def loop(self) -> None:
        kinds, weights = zip(*self.WEIGHTS.items(), strict=True)
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.interval_s):
            kind = self.rng.choices(kinds, weights)[0]
            self.attempted[kind] += 1
            with contextlib.suppress(Exception):
                if getattr(self, kind)():
                    self.counts[kind] += 1

    def _fault(self, body: dict[str, Any]) -> bool:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/fault",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=2) as answer:
            return bool(answer.status == 200)

    def engine_5xx(self) -> bool:
        return self._fault({"status": self.rng.choice([500, 502, 503])})

    def engine_drop(self) -> bool:
        return self._fault({"drop": True})

    def engine_hang(self) -> bool:  # past the request timeout half the time, a stall otherwise
        return self._fault({"delay_s": self.hang_s if self.rng.random() < 0.5 else 2.0})

    def sandbox_pids(self) -> list[int]:
        if self.pid is None:
            return []
        return [p for p in descendants(self.pid) if SANDBOX_UIDS[0] <= (uid_of(p) or 0) < SANDBOX_UIDS[1]]

    def sandbox_kill(self) -> bool:
        pids = self.sandbox_pids()
        if not pids:
            return False
        os.kill(self.rng.choice(pids), signal.SIGKILL)
        return True

    def s3_restart(self) -> bool:
        """Stop the S3 server (SIGTERM, SIGKILL after its stop timeout), leave it down 0.5-3 s, start it again."""
        if self.s3 is None or self.pid is None:
            return False
        self.s3.stop()
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.s3.start()
        return True

    def disk_full(self) -> bool:
        """Fill a live sandbox's workspace filesystem (its own tmpfs, or the tmp dir it lives in)."""
        tmp = str(self.root / "tmp")
        cwds = set()
        for pid in self.sandbox_pids():
            with contextlib.suppress(OSError):
                cwds.add(os.readlink(f"/proc/{pid}/root"))
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(tmp) and line.split()[2] == "tmpfs"
        ]
        mounts = [m for m in mounts if any(c.startswith(m) for c in cwds)] or mounts
        if not mounts:
            return False
        target = Path(self.rng.choice(mounts)) / f".chaos-fill-{self.rng.randrange(1 << 30)}"
        stat = os.statvfs(target.parent)
        if stat.f_blocks * stat.f_frsize > 8 << 30:
            return False  # not a size-capped filesystem: do not fill the machine's disk
        try:
            with open(target, "wb") as out:
                chunk = b"\0" * (1 << 20)
                while True:
                    out.write(chunk)
        except OSError:
            pass
        self.filled.append(target)
        threading.Timer(5.0, lambda: target.unlink(missing_ok=True)).start()  # removed after a while
        return True


def run_stage_to_end(
    root: Path,
    stage: str,
    injector: Injector | None,
    rng: random.Random,
    kill_every_s: float,
    fault_target: int,
    max_crashes: int = 20,
) -> dict[str, Any]:
    """Run (and rerun) the stage until it finishes; with an injector, SIGKILL it at random moments."""
    kills = crashes = starts = 0
    log = root / f"{stage}.log"
    thread = None
    if injector is not None:
        thread = threading.Thread(target=injector.loop, daemon=True)
        thread.start()
    started = time.monotonic()
    while True:
        port = free_port()
        process = spawn(root, stage, port)
        starts += 1
        if injector is not None:
            injector.pid, injector.port = process.pid, port
        total = (sum(injector.counts.values()) + kills) if injector else 0
        kill_at = (
            time.monotonic() + rng.uniform(0.3, 1.7) * kill_every_s
            if injector is not None and total < fault_target
            else None
        )
        while process.poll() is None:
            if kill_at is not None and time.monotonic() > kill_at:
                process.kill()
                process.wait()
                reap_group(process)
                kills += 1
                break
            time.sleep(0.1)
        else:
            reap_group(process)
            if process.returncode == 0:
                break
            crashes += 1
            print(
                f"  {stage}: CRASH rc={process.returncode} (not an injected kill); log tail:\n"
                + log.read_text(errors="replace")[-2000:],
                flush=True,
            )
            if crashes >= max_crashes:
                break
        if injector is not None and sum(injector.counts.values()) + kills >= fault_target:
            injector.stop.set()  # enough faults: let the rest run undisturbed
    if injector is not None:
        injector.stop.set()
        assert thread is not None
        thread.join()
    return {
        "kills": kills,
        "crashes": crashes,
        "starts": starts,
        "wall_s": time.monotonic() - started,
        "finished": process.returncode == 0,
    }


def books(root: Path, stage: str, steps: int, b: int, n: int) -> dict[str, Any]:
    """The ledger against the journal (tests/stages/test_grpo_async_crash.py's checks, counted instead of asserted)."""
    from swerl.rollout.journal import RolloutJournal
    from swerl.rollout.manager import parse_group_id

    store, _ = stores(root)
    keys = [rel.rsplit("/", 1)[-1] for rel in store.list(f"stages/{stage}")]
    manifests = [
        json.loads(store.read_bytes(f"stages/{stage}/{k}/manifest.json"))
        for k in keys
        if store.exists(f"stages/{stage}/{k}/manifest.json")
    ]
    if not manifests:
        return {"finished": False}
    [manifest], [key] = manifests, keys
    report = json.loads(store.read_bytes(store.rel_of(manifest["artifacts"]["grpo_report.json"]["uri"])))
    ledger = report["ledger"]
    seqs = [seq for seq, _, _ in ledger]
    trained_twice = len(seqs) - len(set(seqs))
    trained = Counter(step for _, step, reason in ledger if reason == "trained")
    bad_steps = {s: c for s, c in trained.items() if c != b} | {s: 0 for s in range(1, steps + 1) if s not in trained}
    journal: dict[int, dict[int, list[str]]] = {}
    for folder in store.list(f"stages/{stage}/{key}/rollouts"):
        seq = int(folder.rsplit("/g", 1)[1])
        for name in store.list(folder):
            generation = int(name.split("-a")[0].rsplit("/r", 1)[1])
            journal.setdefault(seq, {}).setdefault(generation, []).append(name)
    lost = 0
    trained_attempts = 0
    infra_consumed = 0  # infra_error attempts in groups a step consumed (the trainer leaves them out)
    statuses: Counter[str] = Counter()
    for seq, _, reason in ledger:
        complete = [g for g, names in journal.get(seq, {}).items() if len(names) == n]
        if not complete:
            lost += 1
            continue
        if reason != "trained":
            continue
        for name in journal[seq][max(complete)]:
            trajectory = json.loads(store.read_bytes(name))["trajectory"]
            trained_attempts += 1
            statuses[trajectory["status"]] += 1
            infra_consumed += trajectory["status"] == "infra_error" or trajectory.get("reward") is None
    # The trainer's own account of what it scored (in a baseline and the loss), per step, against the journal.
    entries = RolloutJournal(store, f"stages/{stage}/{key}/rollouts")
    infra_in_loss = scored_total = scored_unknown = 0
    for pairs in report.get("scored_attempts", {}).values():
        for group, attempt in pairs:
            scored_total += 1
            name = entries.entry_path(*parse_group_id(group), attempt)
            if not store.exists(name):
                scored_unknown += 1
                continue
            trajectory = json.loads(store.read_bytes(name))["trajectory"]
            infra_in_loss += trajectory["status"] == "infra_error" or trajectory.get("reward") is None
    beyond_position = sum(1 for seq in journal if seq >= report["data_position"])
    model = {
        name: info["uri"]
        for name, info in manifest["artifacts"].items()
        if name.startswith("model/") and name.endswith(".safetensors")
    }
    return {
        "finished": True,
        "steps": report["steps"],
        "ledger_entries": len(ledger),
        "ledger_reasons": dict(Counter(reason for _, _, reason in ledger)),
        "trained_twice": trained_twice,
        "steps_without_b_groups": bad_steps,
        "lost": lost,
        "journal_beyond_data_position": beyond_position,
        "trained_attempts": trained_attempts,
        "trained_statuses": dict(statuses),
        "infra_consumed_not_scored": infra_consumed,
        "scored_attempts": scored_total,
        "scored_not_in_journal": scored_unknown,
        "infra_in_loss": infra_in_loss,
        "resume": report.get("resume"),
        "infra_counts": report.get("infra_failures") or report.get("counts"),
        "consumed": sorted((seq, step) for seq, step, reason in ledger if reason == "trained"),
        "model": model,
    }


def same_model(root: Path, a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, int, int]:
    """(every tensor torch.equal, tensors compared, tensors differing)."""
    import torch
    from safetensors.torch import load

    store, _ = stores(root)
    equal, compared, differing = set(a["model"]) == set(b["model"]), 0, 0
    for name in a["model"]:
        if name not in b["model"]:
            continue
        ta = load(store.read_bytes(store.rel_of(a["model"][name])))
        tb = load(store.read_bytes(store.rel_of(b["model"][name])))
        for tensor in ta:
            compared += 1
            if tensor not in tb or not torch.equal(ta[tensor], tb[tensor]):
                differing += 1
                equal = False
    return equal, compared, differing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--b", type=int, default=2, help="tasks (groups) per step")
    parser.add_argument("--n", type=int, default=2, help="attempts per task")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", type=int, default=200, help="stop injecting once this many have landed")
    parser.add_argument("--interval-s", type=float, default=0.6, help="mean time between non-SIGKILL faults")
    parser.add_argument("--kill-every-s", type=float, default=25.0, help="mean time from a start to its SIGKILL")
    parser.add_argument("--request-timeout-s", type=float, default=6.0)
    parser.add_argument(
        "--health-interval-s",
        type=float,
        default=0.5,
        help="engine.router.health_interval_s: how soon an engine taken out of rotation is probed back",
    )
    parser.add_argument("--runtime", default="bubblewrap", choices=["auto", "supervisor", "bubblewrap"])
    parser.add_argument(
        "--store",
        default="s3",
        choices=["s3", "file"],
        help="s3: a SeaweedFS server on loopback (restarted as a fault); file: file://",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the undisturbed run")
    parser.add_argument("--root", type=Path, default=None, help="work here (kept) instead of a temp dir")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), args.child[1], int(args.child[2]))
        return 0
    root = args.root or Path(tempfile.mkdtemp(prefix="swerl-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SWERL_CACHE_DIR", str(root / "swerl-cache"))
    (root / "settings.json").write_text(
        json.dumps(
            {
                "steps": args.steps,
                "b": args.b,
                "n": args.n,
                "seed": args.seed,
                "runtime": args.runtime,
                "request_timeout_s": args.request_timeout_s,
                "health_interval_s": args.health_interval_s,
            }
        )
    )
    s3 = start_s3(root) if args.store == "s3" else None
    try:
        return run_all(args, root, s3)
    finally:
        if s3 is not None:
            s3.stop()


def run_all(args: argparse.Namespace, root: Path, s3: Any) -> int:
    make_inputs(root, args.tasks)
    rng = random.Random(args.seed)
    results: dict[str, Any] = {"settings": vars(args) | {"root": str(root), "child": None, "out": str(args.out)}}
    runs: dict[str, dict[str, Any]] = {}
    for label in ([] if args.no_baseline else ["undisturbed"]) + ["chaos"]:
        stage = f"grpo-{label}"
        injector = Injector(root, rng, args.interval_s, args.request_timeout_s + 3, s3) if label == "chaos" else None
        print(f"{label}: running {stage} ({args.steps} steps x {args.b} groups x {args.n} attempts)", flush=True)
        run = run_stage_to_end(
            root, stage, injector, rng, args.kill_every_s, args.faults, max_crashes=20 if injector else 1
        )
        if injector is not None:
            run["faults"] = dict(injector.counts) | {"stage_sigkill": run["kills"]}
            run["faults_total"] = sum(run["faults"].values())
            run["fault_draws_without_target"] = {
                k: injector.attempted[k] - injector.counts[k] for k in injector.attempted
            }
        check = books(root, stage, args.steps, args.b, args.n)
        run["books"] = check
        runs[label] = run
        print(f"{label}: {json.dumps({k: v for k, v in run.items() if k != 'books'}, default=str)}", flush=True)
        print(
            f"{label} books: "
            f"{json.dumps({k: v for k, v in check.items() if k not in ('consumed', 'model')}, default=str)}",
            flush=True,
        )
    results["runs"] = runs
    chaos = runs["chaos"]
    summary = {
        "faults_by_kind": chaos.get("faults"),
        "faults_total": chaos.get("faults_total"),
        "trainer_crashes": chaos["crashes"],
        "finished": chaos["books"].get("finished", False),
        "trajectories_lost": chaos["books"].get("lost"),
        "groups_trained_twice": chaos["books"].get("trained_twice"),
        "infra_errors_in_loss": chaos["books"].get("infra_in_loss"),
        "scored_attempts": chaos["books"].get("scored_attempts"),
        "scored_not_in_journal": chaos["books"].get("scored_not_in_journal"),
        "steps_without_b_groups": chaos["books"].get("steps_without_b_groups"),
    }
    if "undisturbed" in runs and runs["undisturbed"]["books"].get("finished") and summary["finished"]:
        base = runs["undisturbed"]["books"]
        equal, compared, differing = same_model(root, base, chaos["books"])
        summary |= {
            "final_model_equal": equal,
            "tensors_compared": compared,
            "tensors_differing": differing,
            "same_consumed_groups": base["consumed"] == chaos["books"]["consumed"],
        }
        undisturbed_again = same_model(root, base, base)[0]
        summary["undisturbed_self_check"] = undisturbed_again
    results["summary"] = summary
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
