"""The rows every report renders: one per node of the rewritten graph (and of each rewritten function body), with
its Decisions, its class, its inputs in the original graph and its FLOPs. Built once per report."""

from __future__ import annotations

import dataclasses

from ..core.graph_view import parse_input
from .palette import node_class, primary_decision


@dataclasses.dataclass(frozen=True)
class NodeRow:
    """One node of a rewritten graph.

    Attributes:
        graph: "" for the main graph, else the function's name.
        name, op, device: as in the rewritten GraphDef.
        category: the op's list ("allow", "infer", "deny", "clear") or None.
        node_class: the picture class (palette.CLASSES).
        decisions: the node's Decisions, one per type attribute (empty for inserted Casts).
        inputs: data inputs as (node, port) in the original graph (inserted Casts resolved to what they cast).
        drawn_inputs: data inputs as (node, port) in the rewritten graph (through the inserted Casts).
        control_inputs: names of control inputs.
        flops: matmul/conv FLOPs where known, else None.
        cast: the CastRecord for an inserted Cast, else None.
    """

    graph: str
    name: str
    op: str
    device: str
    category: str | None
    node_class: str
    decisions: tuple
    inputs: tuple
    drawn_inputs: tuple
    control_inputs: tuple
    flops: int | None = None
    cast: object = None

    @property
    def decision(self):
        """The Decision that stands for the node (palette.primary_decision), or None."""
        return primary_decision(self.decisions)


@dataclasses.dataclass
class GraphTable:
    """The rows of one graph in graph order, with its RewriteResult.

    Attributes:
        name: "" for the main graph, else the function's name.
        result: the RewriteResult of this graph (a function's own result for a function).
        rows: node name -> NodeRow, in the rewritten graph's order.
    """

    name: str
    result: object
    rows: dict

    @property
    def label(self) -> str:
        """"main graph" or "function NAME"."""
        return "main graph" if not self.name else f"function {self.name}"


def _row(graph: str, node, result, casts: dict, flops: dict) -> NodeRow:
    data, control = [], []
    for text in node.input:
        (control.append(text[1:]) if text.startswith("^") else data.append(parse_input(text)))
    original = tuple((casts[s].src, casts[s].src_port) if s in casts else (s, p) for s, p in data)
    cast = casts.get(node.name)
    if cast is not None:
        return NodeRow(graph, node.name, node.op, node.device, None, "cast", (), original, tuple(data),
                       tuple(control), None, cast)
    decisions = tuple(result.coloring.for_node(node.name))
    category = decisions[0].category if decisions else result.lists.category(node.op)
    return NodeRow(graph, node.name, node.op, node.device, category, node_class(decisions, category), decisions,
                   original, tuple(data), tuple(control), flops.get(node.name))


def graph_table(name: str, result, flops: dict | None = None) -> GraphTable:
    """Rows for one rewritten graph (`result.graph_def`); `flops` maps node -> FLOPs (flops.flops_by_node)."""
    casts = {c.name: c for c in result.casts}
    rows = {}
    for node in result.graph_def.node:
        rows[node.name] = _row(name, node, result, casts, flops or {})
    return GraphTable(name, result, rows)


def build_tables(result, function: str | None = None, with_flops: bool = True) -> list[GraphTable]:
    """Tables for the main graph and every rewritten function (or only `function`), main graph first.

    Args:
        result: a RewriteResult.
        function: only this function's table ("" for the main graph only).
        with_flops: estimate FLOPs from shapes (mp_rewrite.analysis.flops; seconds on big graphs).

    Raises:
        OptionError: `function` is not a rewritten function of the result.
    """
    from ..analysis import flops as flops_module
    graphs = {"": result, **result.functions}
    if function is not None:
        if function not in graphs:
            raise unknown_function(result, function)
        graphs = {function: graphs[function]}
    per_graph = flops_module.result_flops(result) if with_flops else {}
    return [graph_table(name, sub, per_graph.get(name)) for name, sub in graphs.items()]


def unknown_function(result, function: str):
    """The OptionError for a function name the result did not rewrite (with the closest names)."""
    import difflib
    from ..errors import OptionError
    names = list(result.functions)
    close = difflib.get_close_matches(function, names, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else (
        f"; the rewritten functions are {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" if names
        else "; this model has no rewritten functions")
    return OptionError(f"no rewritten function named '{function}'{hint}")
