"""Dumps on demand: every rewrite's graphs before and after, and its decisions, written to a directory when
MP_REWRITE_DUMP_DIR is set (like Grappler's TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH) or a directory is
given. `dump_on_demand` is registered as a rewrite observer of the core (mp_rewrite/__init__.py does it), so every
rewrite is dumped: library calls, SavedModel conversion, rewrites inside training.

Each rewrite writes three files named `<time ms>-<pid>-<sequence>-<label>`:
`...-before.pb` (the input GraphDef), `...-after.pb` (the rewritten GraphDef) and `...-decisions.json` (the JSON
report of docs/json_schema.md, without FLOP estimates, which cost seconds on big graphs).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time

ENV_VAR = "MP_REWRITE_DUMP_DIR"
_SEQUENCE = itertools.count()
_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def dump_directory(directory: str | None = None) -> str | None:
    """The directory to dump to: `directory`, else $MP_REWRITE_DUMP_DIR, else None (no dumps)."""
    return directory or os.environ.get(ENV_VAR) or None


def _stem(label: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label or "graph").strip("_")[:80] or "graph"
    with _LOCK:
        number = next(_SEQUENCE)
    return f"{int(time.time() * 1000)}-{os.getpid()}-{number:04d}-{safe}"


def dump_on_demand(result, input_graph_def, label: str) -> None:
    """The core's rewrite observer: dump the rewrite when $MP_REWRITE_DUMP_DIR is set, else do nothing."""
    if dump_directory() is not None:
        dump_rewrite(result, input_graph_def, label)


def dump_rewrite(result, input_graph_def, label: str, directory: str | None = None) -> list[str] | None:
    """Write a rewrite's input graph, output graph and decisions, if dumping is on.

    Dumping never breaks a rewrite: a directory that cannot be written is logged as a warning.

    Args:
        result: the RewriteResult.
        input_graph_def: the GraphDef the rewrite read.
        label: what was rewritten (a graph or function name); it becomes part of the file names.
        directory: where to write; None reads $MP_REWRITE_DUMP_DIR; with neither, nothing is written.

    Returns:
        The three paths written, or None when dumping is off or failed.
    """
    target = dump_directory(directory)
    if target is None:
        return None
    from .json_report import to_json
    stem = os.path.join(target, _stem(label))
    paths = [f"{stem}-before.pb", f"{stem}-after.pb", f"{stem}-decisions.json"]
    try:
        os.makedirs(target, exist_ok=True)
        with open(paths[0], "wb") as f:
            f.write(input_graph_def.SerializeToString(deterministic=True))
        with open(paths[1], "wb") as f:
            f.write(result.graph_def.SerializeToString(deterministic=True))
        with open(paths[2], "w") as f:
            f.write(to_json(result, with_flops=False, model=label))
    except OSError as e:
        log.warning("mp_rewrite: cannot dump the rewrite of '%s' to '%s': %s", label, target, e.strerror or e)
        return None
    return paths
