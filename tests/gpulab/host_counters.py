"""What the host did during one timed pass: the figures that may explain its speed.

The lab's passes spread by a standard deviation of 3 to 4% a pass between identical servers,
white from pass to pass, and an 8 s pass spreads almost as much as a 1.3 s one (runs 19 and
20), so the spread is set per pass, not averaged away inside it. The 8B step is host-bound (run
19: the GPU busy 5.3 ms of a 10 ms step), and the GPU machine is a virtual machine. So each pass
records, from the kernel's own counters (psutil reads them): the share of CPU time the
hypervisor stole from the machine, how many CPUs were busy, and the server's busiest process
(its scheduler): its CPU share and how often it was preempted. tables.noise_table asks how much
of the spread they explain.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

# psutil's machine-wide CPU times that count toward the total (guest time is inside user).
_TOTAL_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class ProcessTimes:
    """One process's counters: its name (SGLang's setproctitle, e.g. sglang::scheduler), CPU
    seconds and preemptions (involuntary context switches) since it started."""

    name: str
    cpu_s: float
    preempted: int


@dataclass(frozen=True)
class HostSample:
    """The machine's CPU times and the watched processes' counters at one moment."""

    at: float  # time.monotonic()
    cpu: dict[str, float]  # _TOTAL_FIELDS -> seconds, summed over the machine's CPUs
    processes: dict[int, ProcessTimes]


def sample(pids: Iterable[int]) -> HostSample:
    """The counters now, for the processes of `pids` still alive."""
    processes = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                times = proc.cpu_times()
                processes[pid] = ProcessTimes(
                    proc.name(), times.user + times.system, proc.num_ctx_switches().involuntary
                )
        except psutil.NoSuchProcess:
            continue  # gone meanwhile (a server's child that exited)
    machine = psutil.cpu_times()
    cpu = {f: float(getattr(machine, f, 0.0)) for f in _TOTAL_FIELDS}
    return HostSample(time.monotonic(), cpu, processes)


def pass_counters(before: HostSample, after: HostSample) -> dict[str, float | str | None]:
    """What happened between two samples: `steal_pct`, the share of all CPU time the hypervisor
    took; `cpus_busy`, CPUs' worth of work the machine did; and of the watched process that used
    the most CPU (present in both samples), its name, `hot_cpu_pct` (100: one CPU all the time)
    and `hot_preempted_per_s`."""
    wall = after.at - before.at
    if wall <= 0:
        raise ValueError("the second sample must be taken after the first")
    spent = {f: after.cpu[f] - before.cpu[f] for f in _TOTAL_FIELDS}
    total = sum(spent.values())
    busy = total - spent["idle"] - spent["iowait"] - spent["steal"]

    def used(pid: int) -> float:
        return after.processes[pid].cpu_s - before.processes[pid].cpu_s

    hot = max((pid for pid in after.processes if pid in before.processes), key=used, default=None)
    figures: dict[str, float | str | None] = {
        "steal_pct": round(100 * spent["steal"] / total, 2) if total > 0 else None,
        "cpus_busy": round(busy / wall, 2),
        "hot_process": None,
        "hot_cpu_pct": None,
        "hot_preempted_per_s": None,
    }
    if hot is not None:
        preempted = after.processes[hot].preempted - before.processes[hot].preempted
        figures["hot_process"] = after.processes[hot].name
        figures["hot_cpu_pct"] = round(100 * used(hot) / wall, 1)
        figures["hot_preempted_per_s"] = round(preempted / wall, 1)
    return figures
