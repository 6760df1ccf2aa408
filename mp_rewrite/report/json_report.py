"""The JSON report: every node, color, reason and cast, in the versioned schema of docs/json_schema.md."""

from __future__ import annotations

import json

from .palette import dtype_label
from .stats import op_rows, summarize
from .wording import reason_text

SCHEMA_VERSION = 1


def reason_dict(reason) -> dict:
    """A Reason as JSON: its fields and the phrase reports print."""
    return {"stage": reason.stage, "rule": reason.rule, "source": reason.source, "via": reason.via,
            "detail": reason.detail, "text": reason_text(reason)}


def _attr_dict(decision) -> dict:
    return {"attr": decision.attr, "color": decision.color, "dtype_before": decision.dtype_before,
            "dtype_after": decision.dtype_after, "converted": decision.converted,
            "reason": reason_dict(decision.reason)}


def node_dict(row) -> dict:
    """One NodeRow as JSON (an inserted Cast has "cast": true and no attrs)."""
    decision = row.decision
    return {"name": row.name, "op": row.op, "device": row.device, "category": row.category,
            "class": row.node_class, "dtype": dtype_label(decision.dtype_after) if decision else None,
            "flops": row.flops, "cast": row.cast is not None,
            "inputs": [f"{n}:{p}" for n, p in row.inputs],
            "attrs": [_attr_dict(d) for d in row.decisions]}


def cast_dict(cast) -> dict:
    """One CastRecord as JSON."""
    return {"name": cast.name, "src": cast.src, "src_port": cast.src_port, "from": cast.from_dtype,
            "to": cast.to_dtype, "consumers": [[n, p] for n, p in cast.consumers]}


def _summary_dict(summary) -> dict:
    share = summary.flops
    return {"nodes_by_class": dict(summary.by_class),
            "nodes_by_op": {op: dict(counts) for op, counts in op_rows(summary)},
            "attrs_float32": summary.attrs_float32, "attrs_converted": summary.attrs_converted,
            "casts": summary.casts, "casts_to_low": summary.casts_to_low,
            "flops": {"low": share.low, "total": share.total, "share": share.share, "unknown_nodes": share.unknown,
                      "nodes": share.nodes},
            "kept_compute": [{"rule": g.rule, "text": g.text, "nodes": g.nodes, "flops": g.flops,
                              "example": {"graph": g.example[0], "node": g.example[1], "reason": g.example_reason}}
                             for g in summary.kept],
            "grappler_line": summary.grappler_line}


def to_dict(result, function: str | None = None, tables=None, with_flops: bool = True,
            model: str | None = None) -> dict:
    """The JSON report of a RewriteResult as a dict (schema: docs/json_schema.md).

    Args:
        result: a RewriteResult.
        function: only this rewritten function ("" for the main graph only); None for all graphs.
        tables: build_tables(result, function), if already built.
        with_flops: estimate FLOPs (set False for speed: "flops" fields are then null / 0).
        model: the model path to record, if any.

    Raises:
        OptionError: an unknown function.
    """
    from .. import __version__
    from .node_table import build_tables
    tables = build_tables(result, function, with_flops) if tables is None else tables
    summary = summarize(tables, result)
    graphs = []
    for table in tables:
        sub = table.result
        graphs.append({"name": table.name, "kind": "function" if table.name else "main",
                       "num_nodes": sub.num_nodes, "grappler_line": sub.grappler_line(),
                       "nodes": [node_dict(r) for r in table.rows.values()],
                       "casts": [cast_dict(c) for c in sub.casts]})
    return {"schema_version": SCHEMA_VERSION, "tool": "mp_rewrite", "tool_version": __version__, "model": model,
            "precision": result.precision, "device": result.device, "summary": _summary_dict(summary),
            "graphs": graphs}


def to_json(result, function: str | None = None, indent: int | None = 1, **kwargs) -> str:
    """The JSON report of a RewriteResult as a string (see to_dict)."""
    return json.dumps(to_dict(result, function, **kwargs), indent=indent)
