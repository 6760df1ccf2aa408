"""How much of this process's CPUs the rest of the machine used while something was timed.

A timing judges a split (or any race) only if nothing else ran on the cores it timed on. This process's own CPU
time over the wall time says how many cores it got, but not why it got fewer: with TF's default threads a whole
call may leave a core idle by itself. Linux counts every CPU's busy time in /proc/stat -- user, nice, system, irq,
softirq and steal, the time the hypervisor gave the CPU to another guest --; on the CPUs this process may run on,
that less this process's CPU time over the same wall time is what everything else took.

/proc/stat counts in clock ticks (10 ms here), so a reading over a 0.25 s block is exact to about 0.1 core: read it
as a median over rounds, and not at all over a span shorter than SHORTEST. Where there is no /proc/stat (not
Linux), nothing is known: None.
"""

from __future__ import annotations

import os
import time

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle and iowait, 3 and 4, are not)
SHORTEST = 10 / TICKS  # seconds: over a shorter span, a tick more or less on one CPU would read as 0.1 core or more


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


class Span:
    """A span of this process's work, measured: `with Span() as span: ...`, then span.overlap -- this process's CPU
    time over the span's wall time: the cores it got -- and span.others -- the cores the rest of the machine used
    meanwhile (None where unknown, or the span is shorter than SHORTEST)."""

    overlap: float = 0.0
    others: float | None = None

    def __enter__(self):
        self._busy, self._wall, self._cpu = busy_seconds(), time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        wall, mine = max(time.perf_counter() - self._wall, 1e-9), time.process_time() - self._cpu
        busy = busy_seconds()
        self.overlap = mine / wall
        if self._busy is not None and busy is not None and wall >= SHORTEST:
            self.others = max(0.0, (busy - self._busy - mine) / wall)
