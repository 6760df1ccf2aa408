"""The cache of what `--split auto` timed: one JSON file per (graph, races, serving setting, machine), under the cost
tables' cache directory (analysis.op_costs.cache_dir), beside the measured costs (analysis.profile_cache).

The split's verdict reads wall times, and wall times move with whatever else the machine runs: three conversions
of one model beside a catalog sweep wrote three different models (docs/batch_split.md). So the times of a timing
that could judge the split -- both serving settings timed, and the branches given their cores (split_timing's
busy_timing) -- are kept, and the same graph converted again on this machine reads them: the same verdict, the
same bytes, whatever the machine is doing then. A timing that could not judge is not kept, so a later conversion
on a quiet machine decides. `rm -r ~/.cache/mp_rewrite/splits` times everything again.
"""

from __future__ import annotations

import json

from ..analysis.op_costs import machine_facts
from ..analysis.profile_cache import cache_file, profile_key, write_atomically

FORMAT = "mp_rewrite-split-times"


def split_key(graph: bytes, races: list, setting: str) -> str:
    """The cache key of a split timing: the graph's bytes (profile_cache.graph_bytes, with the signature it serves),
    the races [(batch, calls, [keys])], this process's serving setting, the machine."""
    return profile_key(FORMAT, graph, [[b, c, [str(k) for k in keys]] for b, c, keys in races], setting,
                       machine_facts())


def path(key: str) -> str:
    return cache_file("splits", key)


def load(key: str) -> dict | None:
    """{setting: {(batch, key): ms}} kept under `key` (keys as the races gave them: ints stay ints), or None."""
    try:
        with open(path(key), encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return None
    times = {}
    for setting, batch, name, ms in found.get("times", []):
        times.setdefault(setting, {})[batch, name] = ms
    return times or None


def save(key: str, times: dict) -> None:
    """Keep `times` ({setting: {(batch, key): ms}}) under `key` (atomically; a cache that cannot be written is
    skipped: no failure of the conversion)."""
    rows = [[setting, batch, name, ms] for setting, timed in times.items() for (batch, name), ms in timed.items()]
    write_atomically(path(key), json.dumps({"format": FORMAT, "times": rows}))
