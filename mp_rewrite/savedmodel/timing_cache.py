"""The cache of what a conversion timed to choose its model's shape -- `--split auto`'s races (split_timing) and the
batch dispatch's (batch_dispatch) -- one JSON file per (kind, graph, races, serving setting, machine), under the
cost tables' cache directory (analysis.op_costs.cache_dir), beside the measured costs (analysis.profile_cache).

These choices read wall times, and wall times move with whatever else the machine runs: three conversions of one
model beside a catalog sweep wrote three different models (docs/batch_split.md). So the times of a timing that
could judge are kept, and the same graph converted again on this machine reads them: the same verdict, the same
bytes, whatever the machine is doing then. What could not judge -- a split whose branches got no second core
(split_timing.busy_timing), a setting left untimed -- is not kept, so a later conversion on a quiet machine
decides. `rm -r ~/.cache/mp_rewrite/splits ~/.cache/mp_rewrite/dispatch` times everything again.
"""

from __future__ import annotations

import json

from ..analysis.op_costs import machine_facts
from ..analysis.profile_cache import cache_file, profile_key, write_atomically

FORMAT = "mp_rewrite-timings/1"


def timing_key(kind: str, *parts) -> str:
    """The cache key of a timing of `kind` ("splits", "dispatch": its folder): `parts` (the graphs' bytes,
    profile_cache.graph_bytes; the races; this process's serving setting) and the machine."""
    return profile_key(FORMAT, kind, *parts, machine_facts())


def path(kind: str, key: str) -> str:
    return cache_file(kind, key)


def read_note(path: str) -> str:
    """What a line says after times read from the cache file `path`."""
    return f"; times measured by an earlier conversion on this machine, read from {path} (delete it to time again)"


def load(kind: str, key: str):
    """What `save` kept under `key` (JSON's values), or None."""
    try:
        with open(path(kind, key), encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT or found.get("kind") != kind:
        return None
    return found.get("times")


def save(kind: str, key: str, times) -> None:
    """Keep `times` (anything JSON writes) under `key` (atomically; a cache that cannot be written is skipped: no
    failure of the conversion)."""
    write_atomically(path(kind, key), json.dumps({"format": FORMAT, "kind": kind, "times": times}))
