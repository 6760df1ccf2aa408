"""How much of this process's CPUs the rest of the machine used while something was timed.

A timing judges a split (or any race) only if nothing else ran on the cores it timed on. This process's own CPU
time over the wall time says how many cores it got, but not why it got fewer: with TF's default threads a whole
call may leave a core idle by itself. Linux counts every CPU's busy time in /proc/stat -- user, nice, system, irq,
softirq and steal, the time the hypervisor gave the CPU to another guest --; on the CPUs this process may run on,
that less this process's CPU time over the same wall time is what everything else took.

/proc/stat counts in clock ticks (10 ms here), so a reading over a 0.25 s block is exact to about 0.1 core; read it
as a median over rounds. Where there is no /proc/stat (not Linux), nothing is known: None.
"""

from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle and iowait, 3 and 4, are not)


def busy_seconds() -> float | None:
    """The busy CPU seconds since boot of the CPUs this process may run on (its affinity; every CPU where there is
    none), steal included; None where /proc/stat cannot be read."""
    mine = getattr(os, "sched_getaffinity", lambda _: None)(0)
    try:
        with open("/proc/stat") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    ticks = 0
    for fields in lines:
        if mine is None or int(fields[0][3:]) in mine:
            values = [int(v) for v in fields[1:9]] + [0] * (9 - len(fields))
            ticks += sum(values[i] for i in _BUSY)
    return ticks / TICKS if lines else None


class Others:
    """The cores the rest of the machine used over a span: `start()` before it, `used(cpu_seconds, wall)` after,
    with this process's CPU seconds and the wall seconds of the span; None where nothing is known."""

    def __init__(self):
        self._start = None

    def start(self) -> None:
        self._start = busy_seconds()

    def used(self, cpu_seconds: float, wall: float) -> float | None:
        end = busy_seconds()
        if self._start is None or end is None:
            return None
        return max(0.0, (end - self._start - cpu_seconds) / max(wall, 1e-9))
