"""CPU per local sandbox start + first command, against the raw bubblewrap floor measured in the same run.

    .venv/bin/python benchmarks/sandbox_cpu.py [--count 300] [--repeat 3] [--runtime auto]

A burst's p99 on a small machine is its total CPU over the cores, so this is what benchmarks/sandbox_start.py's
ratio comes down to, without the scheduling noise. Each round runs `--count` operations one after another: raw
(`bwrap --unshare-all ... /bin/true`, as sandbox_start.py's floor), then swerl (start + `true`), then close. CPU
is the whole machine's (/proc/stat: user, nice, system, irq, softirq), so kernel threads' work (namespace teardown,
RCU) counts too; run it on an otherwise idle machine. Under the supervisor, swerl's CPU is split into this process
(host), the zygote and the inits (/proc/PID/schedstat), and the rest (the commands, kernel threads).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sandbox_start import raw_bwrap_argv, run_process  # noqa: E402

from swerl.config.sandbox import SandboxLimits  # noqa: E402
from swerl.sandbox.local import LocalSandboxProvider  # noqa: E402
from swerl.sandbox.supervisor import SupervisedSandbox  # noqa: E402
from swerl.stages.common import sandbox_provider  # noqa: E402


def machine_ms() -> float:
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) * 1000 / os.sysconf("SC_CLK_TCK")


def own_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def task_ms(pid: int) -> float:
    """A process's CPU so far (schedstat: readable for a non-dumpable process, unlike /proc/PID/stat's times)."""
    with open(f"/proc/{pid}/schedstat") as schedstat:
        return int(schedstat.read().split()[0]) / 1e6


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="swerl-bench-") as tmp:
        env_dir = Path(tmp) / "env"
        (env_dir / "pkg").mkdir(parents=True)
        for i in range(8):  # a micro repository's size, as in sandbox_start.py
            (env_dir / "pkg" / f"mod{i}.py").write_text("def f(x):\n    return x + 1\n" * 20)
        limits = SandboxLimits(workspace_dir=str(Path(tmp) / "sandboxes"), max_processes=256, runtime=args.runtime)
        provider = sandbox_provider(limits)
        assert isinstance(provider, LocalSandboxProvider)
        await (await provider.start(env_dir)).close()  # the runtime decision and probe, as a running stage has
        zygote = provider._launcher._proc.pid if provider._launcher and provider._launcher._proc else None
        rows: dict[str, list[float]] = {}
        n = args.count
        raw = raw_bwrap_argv()
        for _ in range(args.repeat):
            m0 = machine_ms()
            for _ in range(n):
                await run_process(raw, 0.0)
            rows.setdefault("raw bwrap /bin/true", []).append((machine_ms() - m0) / n)
            m0, o0, z0 = machine_ms(), own_ms(), task_ms(zygote) if zygote else 0.0
            sandboxes = []
            for _ in range(n):
                sandbox = await provider.start(env_dir)
                result = await sandbox.exec("true", 60)
                assert result.exit_code == 0, result
                sandboxes.append(sandbox)
            total = (machine_ms() - m0) / n
            rows.setdefault("swerl start + true", []).append(total)
            if zygote:
                host = (own_ms() - o0) / n
                zyg = (task_ms(zygote) - z0) / n
                inits = sum(task_ms(s.init_pid) for s in sandboxes if isinstance(s, SupervisedSandbox)) / n
                rows.setdefault("  host process", []).append(host)
                rows.setdefault("  zygote", []).append(zyg)
                rows.setdefault("  inits", []).append(inits)
                rows.setdefault("  rest (commands, kernel)", []).append(total - host - zyg - inits)
            m0 = machine_ms()
            for sandbox in sandboxes:
                await sandbox.close()
            rows.setdefault("swerl close", []).append((machine_ms() - m0) / n)
        provider.close()
    runtime = "supervisor" if zygote else "bubblewrap"
    print(f"CPU per operation, ms (runtime {runtime}; {args.repeat} rounds of {n}; median, then each round)")
    for name, values in rows.items():
        print(f"  {name:28} {statistics.median(values):6.2f}   ({', '.join(f'{v:.2f}' for v in values)})")
    ratio = statistics.median(rows["swerl start + true"]) / statistics.median(rows["raw bwrap /bin/true"])
    print(f"ratio start + true / raw floor: {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=300, help="operations per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--runtime", default="auto", choices=["auto", "supervisor", "bubblewrap"])
    asyncio.run(main(parser.parse_args()))
