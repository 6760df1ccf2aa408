"""The cache of the costs measured in a model (analysis.graph_profile): one JSON file per (graph, its lists
rewrite, fed shapes, machine), under the cost tables' cache directory (analysis.op_costs.cache_dir).

Measuring runs the model, and timings vary from run to run: without the cache, converting the same model twice
could keep a different op or two in float32. With it, a model converted again on the same machine gets the same
costs (so the same bytes), in the time of a file read. A model whose graph, lists, options or inputs changed has
another key; `rm -r ~/.cache/mp_rewrite/profiles` measures everything again.
"""

from __future__ import annotations

import hashlib
import json
import os

from ..core.assignment import CostTable
from .op_costs import cache_dir
from .run_times import RunTimes

FORMAT = "mp_rewrite-profile"
VERSION = 6  # 6: costs pooled by op type, nodes of one op type together


def profile_key(*parts) -> str:
    """A digest of what the measured costs depend on (bytes, or anything JSON can write)."""
    from ..version import __version__
    digest = hashlib.sha1(f"{FORMAT} {VERSION} {__version__}".encode())  # a new release measures again
    for part in parts:
        digest.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def graph_bytes(graph_def) -> bytes:
    """A graph's bytes without its nodes' debug info (which names the functions TF traced them in, with a counter
    that differs every time a model is loaded), and without attrs that hold no value or their op's default one:
    TensorFlow's import_graph_def writes the defaults into the very GraphDef it is given, and reading an absent
    attr of a NodeDef (`node.attr["transpose_a"].b`) adds an empty one, so one graph would read differently once
    something has run it (a conversion that measured the graph, and one that read the measurement)."""
    from tensorflow.python.framework import op_def_registry
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in [*copy.node, *(n for f in copy.library.function for n in f.node_def)]:
        node.ClearField("experimental_debug_info")
        op_def = op_def_registry.get(node.op)
        defaults = {a.name: a.default_value for a in (op_def.attr if op_def is not None else ())
                    if a.HasField("default_value")}
        for name in [n for n, value in node.attr.items()
                     if value.WhichOneof("value") is None or defaults.get(n) == value]:
            del node.attr[name]
    return copy.SerializeToString(deterministic=True)


def cache_file(folder: str, key: str) -> str:
    """Where a cache keeps the file of `key`: `folder` ("profiles", "splits") under the cost tables' directory."""
    return os.path.join(cache_dir(), folder, f"{key}.json")


def load(key: str):
    """(CostTable, float32 ms, lists ms, path) cached under `key`, or None (also for an unreadable file). A file an
    earlier version wrote has no "runs" (run_times.RunTimes): its table's runs are None."""
    path = cache_file("profiles", key)
    try:
        with open(path, encoding="utf-8") as f:
            found = from_text(f.read())
    except OSError:
        return None
    return None if found is None else (*found, path)


def from_text(text: str):
    """(CostTable, float32 ms, lists ms) from what `as_text` wrote, or None for text of another format or version
    (or not JSON)."""
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            return None
        table = CostTable(data["precision"],
                          {label: {name: tuple(ms) for name, ms in nodes.items()}
                           for label, nodes in data["nodes"].items()},
                          {label: {(name, port): (to_low, to_fp32) for name, port, to_low, to_fp32 in casts}
                           for label, casts in data["casts"].items()},
                          {label: {(a, b): ms for a, b, ms in fusions} for label, fusions in data["fusions"].items()},
                          data["low_units"], data["note"], data["keep"],
                          RunTimes.from_data(data["runs"]) if data.get("runs") else None,
                          data.get("decision", ""), data.get("together", {}))
        return table, data["fp32_ms"], data["lists_ms"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def save(key: str, table: CostTable, fp32_ms: float, lists_ms: float) -> None:
    """Write the measured costs under `key` (atomically; a cache that cannot be written is skipped)."""
    write_atomically(cache_file("profiles", key), as_text(table, fp32_ms, lists_ms))


def write_atomically(path: str, text: str) -> None:
    """Write a cache file whole or not at all (a cache that cannot be written is skipped, not an error)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


def as_text(table: CostTable, fp32_ms: float, lists_ms: float) -> str:
    """The measured costs as the cache file holds them (JSON; `from_text` reads it back)."""
    data = {"format": FORMAT, "version": VERSION, "precision": table.precision, "low_units": table.low_units,
            "note": table.note, "keep": table.keep, "decision": table.decision, "fp32_ms": fp32_ms,
            "lists_ms": lists_ms,
            "nodes": {label: {name: list(ms) for name, ms in nodes.items()} for label, nodes in table.nodes.items()},
            "casts": {label: [[name, port, *ms] for (name, port), ms in casts.items()]
                      for label, casts in table.casts.items()},
            "fusions": {label: [[a, b, ms] for (a, b), ms in fusions.items()]
                        for label, fusions in table.fusions.items()},
            "runs": None if table.runs is None else table.runs.as_data(), "together": table.together}
    return json.dumps(data)
