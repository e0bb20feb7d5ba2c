"""`swerl doctor`: what this machine allows, against what the config asks, before a run hits a cap silently.

It reads the machine (open files, processes and threads, memory, disk, Docker engine and networks, bubblewrap and
user namespaces) and derives from the config the peak number of sandboxes, processes, file descriptors and
memory any stage needs (stages run one after another, so the peak is the largest stage). Each check is a line
with both numbers; a failing check makes `swerl doctor` exit non-zero. Every pipeline run logs this report at
start (and to MLflow as params; nothing secret is read, only whether E2B_API_KEY is set).

Given a task set (`swerl doctor CONFIG --tasks FILE`: the curate stage's train/eval.parquet, or a SWE-smith or
SWE-bench dataset file), it also reports the task images the configured backend needs: which the Docker engine
has (and their size), which are missing, how long the pull budget takes to fetch those (docker.allow_pull,
docker.pulls_per_hour); it never pulls. Missing images that cannot be pulled are a failed check.

It also lists `swerl plan`'s checks (swerl.plan: engines and trainer ranks placed on the cluster's GPUs, memory per
GPU and per node's host, ports) as plan.NAME; a plan that cannot be made (no architecture) is the failed check plan.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.config import PipelineConfig
from swerl.config.grpo import GRPOConfig
from swerl.config.sandbox import SandboxLimits
from swerl.data.environments import image_environment, is_image_reference
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.plan import make_plan
from swerl.plan.architecture import PlanError
from swerl.sandbox.supervisor import helper_binary
from swerl.sandbox.tmpfs import can_hold_tmpfs

FDS_PER_SANDBOX = {"local": 6, "docker": 2, "e2b": 4}
"""Host file descriptors one sandbox holds while a command runs (local: stdout, stdin and status pipes of the
bwrap child plus their transport; docker: one API connection; e2b: its HTTP/2 connections)."""
FDS_BASE = 512
"""Descriptors swerl itself holds without any sandbox (Python, torch, MLflow's sqlite, Prefect, logs)."""
PROCESSES_BASE = 512
"""Processes and threads the pipeline itself runs (engine and torch threads, services)."""
NETWORKS_WARN = 28
"""Docker's default address pools give ~31 bridge networks; swerl never makes one, but others on the host might."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class DoctorReport:
    machine: dict[str, Any]
    demand: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    images: dict[str, Any] = field(default_factory=dict)
    """The task set's images (only when a task set with image tasks was given): present, missing, pulls, disk."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def text(self) -> str:
        lines = ["machine:"] + [f"  {k}: {v}" for k, v in self.machine.items()]
        lines += ["config demand (peak over stages):"] + [f"  {k}: {v}" for k, v in self.demand.items()]
        if self.images:
            lines += ["task images:"] + [f"  {k}: {v}" for k, v in self.images.items()]
        lines += ["checks:"] + [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        failed = [c.name for c in self.checks if not c.ok]
        lines.append(f"doctor: {'refused: ' + ', '.join(failed) if failed else 'ok'}")
        return "\n".join(lines)

    def params(self) -> dict[str, Any]:
        """Flat params for MLflow (limits only: no paths of secrets, no environment values)."""
        flat = {f"doctor.machine.{k}": v for k, v in self.machine.items()}
        flat |= {f"doctor.demand.{k}": v for k, v in self.demand.items()}
        flat |= {f"doctor.images.{k}": v for k, v in self.images.items() if not isinstance(v, list | str)}
        flat |= {f"doctor.check.{c.name}": "ok" if c.ok else "FAIL" for c in self.checks}
        return flat


# ----------------------------------------------------------------------------------------------------------------
# What the machine allows


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _meminfo_mb() -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, rest = line.split(":", 1)
            values[key] = int(rest.split()[0]) // 1024
    except (OSError, ValueError):
        pass
    return values


def _tasks_running() -> int:
    """Threads alive on the machine now (they count against pid_max and threads-max)."""
    return sum(
        len(os.listdir(f"/proc/{pid}/task"))
        for pid in os.listdir("/proc")
        if pid.isdigit()
        if os.path.isdir(f"/proc/{pid}/task")
    )


def _limit(value: int) -> int | str:
    return "unlimited" if value == resource.RLIM_INFINITY else value


def _bwrap_works() -> tuple[bool, str]:
    path = shutil.which("bwrap")
    if path is None:
        return False, "bwrap not found (apt-get install bubblewrap)"
    probe = [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap probe failed: {exc}"
    if done.returncode != 0:
        return False, f"bwrap cannot create namespaces: {done.stderr.strip()[:200]}"
    return True, f"{path} runs with user, pid, mount and network namespaces"


def _docker_state() -> tuple[bool, int | None, str]:
    """(dockerd reachable, networks count, detail)."""
    try:
        import docker
    except ImportError:
        return False, None, "docker SDK not installed"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        networks = len(client.networks.list())
        client.close()
        return True, networks, "dockerd answers"
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"; the reason is reported
        return False, None, f"dockerd not reachable: {str(exc)[:160]}"


def _free_mb(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free // (1024 * 1024)


def read_machine(cfg: PipelineConfig) -> dict[str, Any]:
    nofile_soft, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc_soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    mem = _meminfo_mb()
    machine: dict[str, Any] = {
        "cpus": os.cpu_count() or 1,
        "is_root": os.geteuid() == 0,
        "nofile_soft": _limit(nofile_soft),
        "nofile_hard": _limit(nofile_hard),
        "nproc_soft": _limit(nproc_soft),
        "pid_max": _read_int("/proc/sys/kernel/pid_max"),
        "threads_max": _read_int("/proc/sys/kernel/threads-max"),
        "threads_running": _tasks_running(),
        "max_user_namespaces": _read_int("/proc/sys/user/max_user_namespaces"),
        "mem_total_mb": mem.get("MemTotal"),
        "mem_available_mb": mem.get("MemAvailable"),
    }
    for name, path in _disk_paths(cfg).items():
        machine[f"disk_free_mb.{name}"] = _free_mb(path)
    backends = _backends(cfg)
    if "local" in backends:
        machine["bwrap_ok"], machine["bwrap"] = _bwrap_works()
        scratch = Path(cfg.agent.sandbox.workspace_dir or tempfile.gettempdir())
        machine["tmpfs_mount_ok"], machine["tmpfs_mount"] = can_hold_tmpfs(scratch)
        machine["supervisor_ok"], machine["supervisor"] = _supervisor_builds()
    reachable, networks, detail = _docker_state()
    machine["dockerd_reachable"], machine["docker_networks"], machine["docker"] = reachable, networks, detail
    if "e2b" in backends:
        machine["e2b_api_key_set"] = bool(os.environ.get("E2B_API_KEY"))
    return machine


def _supervisor_builds() -> tuple[bool, str]:
    """Whether the local supervisor (swerl/sandbox/nsinit.c) is built, or can be: it builds it if needed."""
    try:
        return True, str(helper_binary())
    except InfraError as exc:
        return False, exc.message


def _disk_paths(cfg: PipelineConfig) -> dict[str, Path]:
    paths = {"sandbox_tmp": Path(tempfile.gettempdir()), "runs": Path("runs").resolve()}
    root = cfg.storage.root
    if root.startswith("file://") or "://" not in root:
        paths["store"] = Path(root.removeprefix("file://")).resolve()
    return paths


# ----------------------------------------------------------------------------------------------------------------
# What the config asks


def _backends(cfg: PipelineConfig) -> set[str]:
    return {cfg.curate.sandbox.backend, cfg.agent.sandbox.backend}


def stage_concurrency(cfg: PipelineConfig) -> dict[str, tuple[int, SandboxLimits]]:
    """Sandboxes each stage wants at once, with the limits its sandboxes get."""
    g = cfg.grpo
    return {
        "curate.validation_workers": (cfg.curate.validation_workers, cfg.curate.sandbox),
        "traces.workers": (cfg.traces.workers, cfg.agent.sandbox),
        "grpo." + _grpo_concurrency_name(g): (
            g.rollout.max_in_flight + g.rollout.prewarm_groups * g.rollout.attempts_per_task
            if g.mode == "async"
            else g.rollout.concurrency,
            cfg.agent.sandbox,
        ),
        "evaluate.concurrency": (cfg.evaluate.concurrency, cfg.agent.sandbox),
    }


def _grpo_concurrency_name(g: GRPOConfig) -> str:
    if g.mode == "sync":
        return "rollout.concurrency"
    return "rollout.max_in_flight" + ("+prewarm_groups*attempts_per_task" if g.rollout.prewarm_groups else "")


def _sandboxes(concurrency: int, limits: SandboxLimits, pooled: bool) -> int:
    """Sandboxes alive at once: capped by the pool, plus its warm ones."""
    if not pooled:
        return concurrency
    return min(concurrency, limits.pool.max_concurrent) + limits.pool.warm_size


def _local_cgroups(limits: SandboxLimits) -> bool:
    """Whether local sandboxes of these limits get a cgroup each (the supervisor where cgroups can be made)."""
    if limits.runtime == "bubblewrap" or limits.workspace_quota == "none":
        return False
    return cgroups_state()[0]


@functools.cache
def cgroups_state() -> tuple[bool, str]:
    """Whether per-sandbox memory and pids cgroups can be made here, and why not."""
    from swerl.sandbox.supervisor import Cgroups

    cgroups, why = Cgroups.detect()
    return cgroups is not None, why or "per-sandbox memory and pids cgroups"


def demand(cfg: PipelineConfig) -> dict[str, Any]:
    peak = {"sandboxes": 0, "memory_mb": 0, "processes": 0, "fds": 0, "disk_mb": 0}
    for name, (concurrency, limits) in stage_concurrency(cfg).items():
        sandboxes = _sandboxes(concurrency, limits, pooled=not name.startswith("curate"))
        # tmpfs /tmp pages are RAM on the local backend, and so is a size-capped workspace; a plain-directory
        # workspace uses disk instead (file_size_mb stands for it, as before)
        local_tmpfs = limits.tmp_size_mb + (limits.workspace_mb if limits.workspace_quota != "none" else 0)
        # What one sandbox can really take: docker, its container's limit (tmpfs pages count in it); local with
        # per-sandbox cgroups (supervisor runtime as root), memory_mb for the whole sandbox, tmpfs pages included;
        # local without them, memory_mb is per process: max_processes of them at worst, plus the tmpfs.
        if limits.backend != "local" or _local_cgroups(limits):
            per_sandbox_mb = limits.memory_mb
        else:
            per_sandbox_mb = limits.memory_mb * limits.max_processes + local_tmpfs
        per_sandbox_mb = 0 if limits.backend == "e2b" else per_sandbox_mb  # e2b VMs use no host memory
        stage = {
            "sandboxes": sandboxes,
            "memory_mb": sandboxes * per_sandbox_mb,
            "processes": sandboxes * (limits.max_processes if limits.backend == "local" else 3),
            "fds": sandboxes * FDS_PER_SANDBOX[limits.backend],
            "disk_mb": sandboxes * limits.file_size_mb if limits.backend == "local" else 0,
        }
        peak = {k: max(peak[k], stage[k]) for k in peak}
    e = cfg.engine
    episodes = max(c for c, _ in stage_concurrency(cfg).values())
    connections = (
        0
        if e.kind == "local"
        else e.launch.num_engines * ((e.http.max_connections or episodes) + e.http.control_connections)
    )
    peak["fds"] += connections + cfg.storage.max_pool_connections + FDS_BASE
    peak["processes"] += PROCESSES_BASE
    return {**peak, "engine_connections": connections, "episodes": episodes}


# ----------------------------------------------------------------------------------------------------------------
# Checks


def checks(cfg: PipelineConfig, machine: dict[str, Any], need: dict[str, Any]) -> list[Check]:
    """Every check of a config against the machine: sandbox pools, machine resources, then each backend's needs."""
    backends = _backends(cfg)
    out = _pool_checks(cfg) + _resource_checks(cfg, machine, need)
    if "local" in backends:
        out += _local_checks(cfg, machine, need)
    return out + _remote_backend_checks(backends, machine)


def _pool_checks(cfg: PipelineConfig) -> list[Check]:
    out: list[Check] = []
    for name, (concurrency, limits) in stage_concurrency(cfg).items():
        if name.startswith("curate"):
            continue
        pool = limits.pool.max_concurrent
        out.append(
            Check(
                f"pool.{name}",
                concurrency <= pool,
                f"{name} {concurrency} vs agent.sandbox.pool.max_concurrent {pool}"
                + ("" if concurrency <= pool else f": {concurrency - pool} episodes would wait for a sandbox"),
            )
        )
    return out


def _resource_checks(cfg: PipelineConfig, machine: dict[str, Any], need: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    e = cfg.engine
    if e.kind != "local" and e.http.max_connections is not None:
        out.append(
            Check(
                "engine.http.max_connections",
                e.http.max_connections >= need["episodes"],
                f"{e.http.max_connections} connections per engine vs {need['episodes']} episodes at once",
            )
        )
    available = machine.get("mem_available_mb")
    if available is not None:
        out.append(
            Check(
                "memory",
                need["memory_mb"] <= available,
                f"{need['sandboxes']} sandboxes x what each can take (memory_mb with a per-sandbox "
                f"cgroup, else memory_mb x max_processes + tmpfs) = {need['memory_mb']} MB "
                f"vs {available} MB available",
            )
        )
    soft = machine["nofile_soft"]
    if soft != "unlimited":
        out.append(
            Check(
                "open_files",
                need["fds"] <= soft,
                f"~{need['fds']} descriptors needed vs RLIMIT_NOFILE soft {soft} (hard "
                f"{machine['nofile_hard']}; raise with ulimit -n)",
            )
        )
    caps = [v for v in (machine.get("pid_max"), machine.get("threads_max")) if v]
    if caps:
        room = min(caps) - machine["threads_running"]
        out.append(
            Check(
                "processes",
                need["processes"] <= room,
                f"{need['processes']} processes/threads at worst (sandboxes x max_processes + "
                f"{PROCESSES_BASE}) vs {room} left under min(pid_max, threads-max) {min(caps)}",
            )
        )
    nproc = machine["nproc_soft"]
    if not machine["is_root"] and nproc != "unlimited":
        own = need["sandboxes"] * 3 + PROCESSES_BASE
        out.append(Check("nproc", own <= nproc, f"~{own} processes of this user vs RLIMIT_NPROC {nproc}"))
    for key, free in machine.items():
        if key.startswith("disk_free_mb."):
            want = need["disk_mb"] + 1024
            out.append(
                Check(
                    f"disk.{key.removeprefix('disk_free_mb.')}",
                    free >= want,
                    f"{free} MB free vs {want} MB (sandboxes x file_size_mb + 1 GB)",
                )
            )
    return out


def _runtime_checks(local_limits: list[SandboxLimits], machine: dict[str, Any]) -> tuple[list[Check], bool]:
    """Which runtime runs each local stage's sandboxes; and whether any of them needs bubblewrap."""
    out: list[Check] = []
    mountable = bool(machine.get("tmpfs_mount_ok", True))
    builds = bool(machine.get("supervisor_ok", True))
    needs_bwrap = False
    for runtime, quota in sorted({(limits.runtime, limits.workspace_quota) for limits in local_limits}):
        supervised = runtime != "bubblewrap" and quota != "none" and mountable and builds
        needs_bwrap |= not supervised
        why = "workspace_quota none" if quota == "none" else str(machine.get("tmpfs_mount"))
        if mountable and quota != "none" and not builds:
            why = str(machine.get("supervisor"))
        if supervised:
            detail = f"runtime {runtime}: the supervisor ({machine.get('supervisor')})"
        elif runtime == "supervisor" and not builds and mountable:
            detail = f"runtime supervisor cannot be built: {why}"
        elif runtime == "supervisor":
            detail = f"runtime supervisor needs root (CAP_SYS_ADMIN) and a workspace quota: {why}"
        else:
            detail = f"runtime {runtime}: bubblewrap per command" + ("" if runtime == "bubblewrap" else f" ({why})")
        out.append(Check(f"local_runtime.{runtime}", supervised or runtime != "supervisor", detail))
    return out, needs_bwrap


def _no_cgroup_why(limits: SandboxLimits, why: str) -> str:
    if limits.runtime == "bubblewrap":
        return "runtime bubblewrap: it runs unprivileged, the cgroups are the root supervisor's"
    if limits.workspace_quota == "none":
        return "workspace_quota none: no cgroup is made"
    return why


def _cgroups_line(limits: SandboxLimits) -> str:
    """What memory_mb and max_processes cap for sandboxes of these limits: the whole sandbox, or each process."""
    ok, why = cgroups_state()
    if ok and _local_cgroups(limits):
        return "memory_mb and max_processes cap each whole sandbox (cgroups)"
    return (
        f"NO per-sandbox cgroup ({_no_cgroup_why(limits, why)}): memory_mb caps each process's address space "
        f"(RLIMIT_AS), not the sandbox: a sandbox of N processes may hold up to N x {limits.memory_mb} MB "
        f"(max_processes {limits.max_processes}, per uid)"
    )


def _local_checks(cfg: PipelineConfig, machine: dict[str, Any], need: dict[str, Any]) -> list[Check]:
    """The local backend: which runtime runs sandboxes, bubblewrap where it is needed, workspace quotas."""
    local_limits = [limits for _, limits in stage_concurrency(cfg).values() if limits.backend == "local"]
    modes = {limits.workspace_quota for limits in local_limits}
    mountable = bool(machine.get("tmpfs_mount_ok", True))
    out, needs_bwrap = _runtime_checks(local_limits, machine)
    # curate's sandboxes and the agent's have limits of their own: one line each where they differ (a runtime, a cap)
    sections = {"": cfg.curate.sandbox, ".agent": cfg.agent.sandbox}
    seen: list[str] = []
    for suffix, limits in sections.items():
        line = _cgroups_line(limits)
        if limits.backend == "local" and line not in seen:
            seen.append(line)
            out.append(Check("sandbox_cgroups" + suffix, True, line))
    bwrap_ok = bool(machine.get("bwrap_ok"))
    out.append(
        Check(
            "bubblewrap",
            bwrap_ok or not needs_bwrap,
            str(machine.get("bwrap")) + ("" if needs_bwrap else " (not needed: the supervisor runs sandboxes)"),
        )
    )
    for mode in sorted(modes):
        capped = mode != "none" and mountable
        detail = (
            f"local workspaces capped by a tmpfs of workspace_mb each (workspace_quota: {mode})"
            if capped
            else f"local workspaces NOT size-capped (workspace_quota: {mode}"
            + ("" if mode == "none" else f"; {machine.get('tmpfs_mount')}")
            + ")"
        )
        out.append(Check(f"workspace_quota.{mode}", capped or mode != "tmpfs", detail))
    userns = machine.get("max_user_namespaces")
    if not machine["is_root"] and userns is not None:
        out.append(
            Check(
                "user_namespaces",
                userns >= need["sandboxes"],
                f"max_user_namespaces {userns} vs {need['sandboxes']} sandboxes",
            )
        )
    return out


def _remote_backend_checks(backends: set[str], machine: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    if "docker" in backends:
        out.append(Check("dockerd", bool(machine["dockerd_reachable"]), str(machine["docker"])))
        networks = machine.get("docker_networks")
        if networks is not None:
            out.append(
                Check(
                    "docker_networks",
                    networks < NETWORKS_WARN,
                    f"{networks} networks (containers use network none; ~31 is the bridge-pool cap)",
                )
            )
    if "e2b" in backends:
        out.append(
            Check(
                "e2b_api_key",
                bool(machine.get("e2b_api_key_set")),
                "E2B_API_KEY set in the environment" if machine.get("e2b_api_key_set") else "E2B_API_KEY is not set",
            )
        )
    return out


def diagnose(
    cfg: PipelineConfig, machine: dict[str, Any] | None = None, tasks: list[TaskInstance] | None = None
) -> DoctorReport:
    """The doctor's report for a config (machine read now unless given, e.g. by a test), and for the images of a
    task set when one is given (image_checks)."""
    machine = read_machine(cfg) if machine is None else machine
    need = demand(cfg)
    report = DoctorReport(machine=machine, demand=need, checks=checks(cfg, machine, need) + plan_checks(cfg))
    if tasks is not None:
        report.images, image_check = image_checks(cfg, tasks)
        report.checks += image_check
    return report


def plan_checks(cfg: PipelineConfig) -> list[Check]:
    """`swerl plan`'s checks as the doctor's (plan.NAME): the same plan `swerl run` refuses on."""
    try:
        plan = make_plan(cfg)
    except PlanError as exc:
        return [Check("plan", False, str(exc))]
    return [Check(f"plan.{c.name}", c.ok, c.detail) for c in plan.checks]


# ----------------------------------------------------------------------------------------------------------------
# A task set's images

SHOWN = 5
"""Image names listed per category (the rest counted)."""


def load_task_file(path: str | Path) -> list[TaskInstance]:
    """The tasks of a file: the curate stage's train/eval.parquet (TaskInstance columns), or rows of a SWE-smith
    or SWE-bench dataset (parquet, jsonl, json; the schema read from each row's columns). A ValueError names the
    file and the first row that is neither."""
    from swerl.data.loaders import RowError, read_rows, row_to_task, task_schema_of
    from swerl.data.taskio import TASK_SCHEMA, tasks_from_parquet

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--tasks {path}: no such file")
    if file.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        if set(TASK_SCHEMA.names) <= set(pq.read_schema(file).names):  # swerl's own task file
            return tasks_from_parquet(file.read_bytes())
    tasks = []
    for index, row in enumerate(read_rows(str(file))):
        schema = task_schema_of(row)
        if schema is None:
            raise ValueError(f"--tasks {path}: row {index} is neither a SWE-smith nor a SWE-bench task row")
        try:
            tasks.append(row_to_task(row, schema, str(file), None, index))
        except RowError as exc:
            raise ValueError(f"--tasks {path}: {exc}") from exc
    return tasks


def _engine_images(names: list[str]) -> tuple[dict[str, int], list[str], str | None]:
    """(size in bytes of each image the engine has, the missing ones, why the engine could not be asked).
    Inspects only: nothing is pulled."""
    try:
        import docker
        import docker.errors

        client = docker.from_env(timeout=30)
    except Exception as exc:  # noqa: BLE001 - no SDK or no engine: the images cannot be told apart
        return {}, [], f"cannot ask the Docker engine: {str(exc)[:160]}"
    present: dict[str, int] = {}
    missing: list[str] = []
    try:
        for name in names:
            try:
                present[name] = int(client.images.get(name).attrs.get("Size") or 0)
            except docker.errors.ImageNotFound:
                missing.append(name)
    except Exception as exc:  # noqa: BLE001 - the engine stopped answering: say so, the check fails
        return {}, [], f"cannot ask the Docker engine: {str(exc)[:160]}"
    finally:
        client.close()
    return present, missing, None


def _listed(names: list[str]) -> str:
    more = f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _pull_hours(count: int, per_hour: int) -> int:
    """Hours the sliding pull window makes `count` pulls take beyond the pulls themselves: per_hour at once, the
    next per_hour an hour later, and so on."""
    return max(0, math.ceil(count / per_hour) - 1)


def _image_names(refs: list[str]) -> tuple[list[str], list[str]]:
    """The distinct images the task references name, in order; and the references that cannot be read."""
    names: list[str] = []
    bad: list[str] = []
    for ref in dict.fromkeys(refs):
        try:
            names.append(image_environment(ref).image)
        except ValueError:
            bad.append(ref)
    return list(dict.fromkeys(names)), bad


def _e2b_image_check(templates: Mapping[str, str], names: list[str], info: dict[str, Any]) -> Check:
    """On e2b an image runs through its template: every image needs one (counted into `info`)."""
    unmapped = [name for name in names if name not in templates]
    info["without_template"] = len(unmapped)
    return Check(
        "task_images.e2b",
        not unmapped,
        f"{len(names) - len(unmapped)} of {len(names)} images "
        "have an e2b template (agent.sandbox.e2b.image_templates)"
        + (f"; none for {_listed(unmapped)}" if unmapped else ""),
    )


def image_checks(cfg: PipelineConfig, tasks: list[TaskInstance]) -> tuple[dict[str, Any], list[Check]]:
    """The images the tasks name, as the agent stages' backend sees them (`agent.sandbox.backend`): present on
    the Docker engine (with their size), missing, and to be pulled within docker.pulls_per_hour. A check fails
    for missing images that the backend will not pull (docker without allow_pull; local, which never pulls).
    Directory tasks (local://, micro://) add nothing."""
    refs = [t.image for t in tasks if is_image_reference(t.image)]
    if not refs:
        return {}, []
    names, bad = _image_names(refs)
    limits = cfg.agent.sandbox
    backend = limits.backend
    info: dict[str, Any] = {"image_tasks": len(refs), "of_tasks": len(tasks), "images": len(names), "backend": backend}
    out: list[Check] = []
    if bad:
        out.append(
            Check("task_images.references", False, f"{len(bad)} image references cannot be read: {_listed(bad)}")
        )
    if backend == "e2b":
        out.append(_e2b_image_check(limits.e2b.image_templates, names, info))
        return info, out
    present, missing, error = _engine_images(names)
    if error is not None:
        info["engine"] = error
        out.append(Check("task_images", False, f"{len(names)} task images, but {error}"))
        return info, out
    docker_cfg = limits.docker
    pulls = backend == "docker" and docker_cfg.allow_pull
    size_mb = sum(present.values()) / 1e6
    info |= {"present": len(present), "present_mb": round(size_mb, 1), "missing": len(missing)}
    if present:
        info["present_names"] = _listed(list(present))
    if missing:
        info["missing_names"] = _listed(missing)
        info["missing_mb"] = "unknown (the registry is not asked)"
    if pulls and missing:
        hours = _pull_hours(len(missing), docker_cfg.pulls_per_hour)
        info["to_pull"] = len(missing)
        info["pull_time"] = f"{len(missing)} pulls at docker.pulls_per_hour {docker_cfg.pulls_per_hour}: " + (
            f"~{hours} h of waiting for the budget, plus the pulls" if hours else "within one hour's budget, no waiting"
        )
    disk = f"{size_mb:.0f} MB of present images (layers they share counted in each: at most)" + (
        f" + {len(missing)} missing of unknown size" if missing else ""
    )
    if not missing:
        detail = f"all {len(names)} images on the engine ({disk})"
    elif pulls:
        detail = f"{len(missing)} of {len(names)} images missing, to be pulled ({info['pull_time']}); {disk}"
    else:
        why = "agent.sandbox.docker.allow_pull is off" if backend == "docker" else f"the {backend} backend never pulls"
        detail = (
            f"{len(missing)} of {len(names)} images missing and {why}: {_listed(missing)}; build or load them first"
        )
    out.append(Check("task_images", not missing or pulls, detail))
    return info, out
