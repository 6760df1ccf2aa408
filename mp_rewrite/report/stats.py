"""The numbers of an inspection report, counted from the node tables (text, JSON and HTML all show these)."""

from __future__ import annotations

import collections
import dataclasses

from ..analysis.flops import COUNTED_DTYPES, FLOP_RULES, LOW_DTYPES, FlopShare
from .palette import CLASS_NAMES
from .wording import reason_text


@dataclasses.dataclass(frozen=True)
class KeptGroup:
    """Compute-heavy nodes kept in float32 for one reason.

    Attributes:
        rule: the Reason's rule key.
        text: the reason in words (the same for every node of the group).
        nodes: how many nodes.
        flops: their FLOPs where known (0 if none known).
        example: (graph, node) of the example node (the one with the most FLOPs).
        example_reason: the example's own reason in words.
    """

    rule: str
    text: str
    nodes: int
    flops: int
    example: tuple
    example_reason: str


@dataclasses.dataclass
class Summary:
    """What an inspection reports over the chosen graphs.

    Attributes:
        graphs: per graph ("" for main): (nodes in the input graph, Grappler's log line).
        by_class: node class -> count (the inserted Casts counted as "cast").
        by_op: op -> Counter(node class), original nodes only.
        attrs_float32, attrs_converted: float32 type attributes, and how many became low precision.
        casts, casts_to_low: inserted Casts, and how many cast into low precision.
        flops: the FlopShare of matmul/conv FLOPs in low precision.
        kept: KeptGroups, most FLOPs first.
        grappler_line: "Converted X/Y nodes to float16 precision using Z cast(s) to float16" over all graphs.
    """

    precision: str
    device: str
    graphs: dict
    by_class: collections.Counter
    by_op: dict
    attrs_float32: int
    attrs_converted: int
    casts: int
    casts_to_low: int
    flops: FlopShare
    kept: list
    grappler_line: str


def _flop_share(tables) -> FlopShare:
    low = total = unknown = nodes = 0
    for table in tables:
        for row in table.rows.values():
            decision = row.decision
            if row.op not in FLOP_RULES or decision is None or decision.dtype_after not in COUNTED_DTYPES:
                continue
            nodes += 1
            if row.flops is None:
                unknown += 1
            else:
                total += row.flops
                low += row.flops if decision.dtype_after in LOW_DTYPES else 0
    return FlopShare(low, total, unknown, nodes)


def is_compute_heavy(row) -> bool:
    """A matmul/conv op (one counted by mp_rewrite.analysis.flops) or any allow-list op."""
    return row.op in FLOP_RULES or row.category == "allow"


def _group_key(row, table) -> tuple:
    reason = row.decision.reason
    if reason.rule == "deny_propagated" and reason.source in table.rows:
        source_op = table.rows[reason.source].op
        return reason.rule, f"deny propagated from a {source_op} node (deny list)"
    if reason.rule in ("between_allow", "follows_allow", "allow_through_clear"):
        return reason.rule, reason.rule.replace("_", " ")
    return reason.rule, reason_text(reason)


def kept_groups(tables) -> list[KeptGroup]:
    """Group the compute-heavy nodes that still compute in float32 by their reason; most FLOPs first."""
    groups = collections.defaultdict(list)
    for table in tables:
        for row in table.rows.values():
            decision = row.decision
            if row.cast is None and is_compute_heavy(row) and decision is not None and decision.dtype_after == "float":
                groups[_group_key(row, table)].append(row)
    result = []
    for (rule, text), rows in groups.items():
        example = max(rows, key=lambda r: (r.flops or 0))
        result.append(KeptGroup(rule, text, len(rows), sum(r.flops or 0 for r in rows), (example.graph, example.name),
                                reason_text(example.decision.reason)))
    return sorted(result, key=lambda g: (-g.flops, -g.nodes, g.text))


def _grappler_line(tables, precision: str) -> str:
    attrs = sum(len(t.result.retyped) for t in tables)
    nodes = sum(t.result.num_nodes for t in tables)
    to_low = sum(1 for t in tables for c in t.result.casts if c.to_low)
    return f"Converted {attrs}/{nodes} nodes to {precision} precision using {to_low} cast(s) to {precision}"


def summarize(tables, result) -> Summary:
    """Count everything a report shows over `tables` (build_tables), for the RewriteResult `result`."""
    by_class, by_op = collections.Counter(), collections.defaultdict(collections.Counter)
    attrs_float32 = 0
    for table in tables:
        for row in table.rows.values():
            by_class[row.node_class] += 1
            if row.cast is None:
                by_op[row.op][row.node_class] += 1
                attrs_float32 += sum(1 for d in row.decisions if d.dtype_before == "float")
    casts = [c for t in tables for c in t.result.casts]
    return Summary(
        result.precision, result.device,
        {t.name: (t.result.num_nodes, t.result.grappler_line()) for t in tables},
        collections.Counter({k: by_class[k] for k in CLASS_NAMES if by_class[k]}), dict(by_op), attrs_float32,
        sum(len(t.result.retyped) for t in tables), len(casts), sum(1 for c in casts if c.to_low),
        _flop_share(tables), kept_groups(tables), _grappler_line(tables, result.precision))


def op_rows(summary: Summary, top: int | None = None) -> list[tuple]:
    """(op, Counter of classes) for the ops with a node in any class but "untouched", most nodes first."""
    ops = [(op, counts) for op, counts in summary.by_op.items() if set(counts) - {"untouched"}]
    ops.sort(key=lambda item: (-sum(item[1].values()), item[0]))
    return ops if top is None else ops[:top]


def percent(part: int, whole: int) -> str:
    """"42.0%" (or "n/a" for an empty whole)."""
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"
