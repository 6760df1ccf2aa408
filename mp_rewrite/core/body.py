"""Rewriting one graph (a main graph or a function body), stage by stage in Grappler's order, without looking
into the functions it calls: `rewrite_body` and its `RewriteResult` (the options are core/options.py's)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc

from tensorflow.core.framework import graph_pb2

from . import dtypes, stages, tensor_lists
from .angles import position_angles
from .assignment import CostTable, assign_by_cost
from .apply import Applied, apply_coloring
from .emulation import apply_emulated
from .coloring import ALLOW, Coloring, Paint, Reason
from ..errors import GraphError, OptionError
from .graph_view import GraphView, device_kind, parse_input
from .observers import notify_rewrite
from .oplists import OpLists
from .options import Options
from .op_support import Signatures
from .pass_context import FUNCTIONAL_CONTROL_FLOW_OPS, PassContext

# Grappler's order (AutoMixedPrecisionImpl::Optimize); the TensorList steps run around these.
STAGES_BEFORE_LISTS = (stages.seed_allowlist, stages.propagate_deny_forward)
STAGES_AFTER_LISTS = (stages.add_between_allow, stages.add_infer_after_allow, stages.propagate_allow_through_clear,
                      stages.remove_unsupported)
FINAL_STAGES = (stages.match_recurrent_edges, stages.make_casts_allow)


@dataclasses.dataclass
class RewriteResult:
    """The outcome of one rewrite.

    Attributes:
        graph_def: the new GraphDef (the input is never modified).
        coloring: (node, type attr) -> Decision for every type attribute, with its Reason.
        casts: every inserted Cast (CastRecord).
        retyped: the (node, type attr) pairs changed to the low-precision dtype (none when emulating).
        emulated: with `emulate`, the (node, type attr) pairs kept float32 between float16 round-trip Casts.
        precision, device: the options used.
        lists: the effective OpLists.
        num_nodes: node count of the input graph.
        functions: function name -> RewriteResult of its body, for every library function rewritten.
        skipped: function name -> why it was reached but not rewritten (parametrised, tf.data).
        meta_graph_def: for a MetaGraph rewrite (rewrite_meta_graph_def), the new MetaGraphDef.
        rules: for a frozen graph or a function body canonicalized in place, the rules/ Records of the rewrites made
            before the pass (fusions enabled, and those declined with why).
    """

    graph_def: graph_pb2.GraphDef
    coloring: Coloring
    casts: list
    retyped: list
    precision: str
    device: str
    lists: OpLists
    num_nodes: int
    functions: dict = dataclasses.field(default_factory=dict)
    emulated: list = dataclasses.field(default_factory=list)
    skipped: dict = dataclasses.field(default_factory=dict)
    meta_graph_def: object = None
    rules: list = dataclasses.field(default_factory=list)
    assignment: object = None  # with assign="cost": the core.assignment.Assignment of this graph

    @property
    def converted_nodes(self) -> list[str]:
        """Names of the nodes with at least one type attribute now in low precision, in graph order."""
        return list(dict.fromkeys(node for node, _ in self.retyped))

    def grappler_line(self) -> str:
        """Grappler's own log line (X counts type attributes, as Grappler does)."""
        to_low = sum(1 for c in self.casts if c.to_low)
        return (f"Converted {len(self.retyped)}/{self.num_nodes} nodes to {self.precision} precision using "
                f"{to_low} cast(s) to {self.precision}")

    def summary(self, top: int = 10) -> str:
        """Return "converted X/Y nodes to float16 with Z casts" and a short per-op-type table."""
        converted = set(self.converted_nodes)
        to_low = sum(1 for c in self.casts if c.to_low)
        lines = [f"converted {len(converted)}/{self.num_nodes} nodes to {self.precision} with {len(self.casts)} "
                 f"casts ({to_low} to {self.precision}, {len(self.casts) - to_low} to float32)"]
        per_op = collections.Counter()
        total = collections.Counter()
        for d in self.coloring.values():
            if d.dtype_before == "float":
                total[d.op] += 1
                per_op[d.op] += d.color == ALLOW
        if self.emulated:
            lines.append(f"  emulated: {len(self.emulated)} float32 attrs compute in float32 between round trips "
                         f"through {self.precision} (TF's CPU emulation; no attr is retyped)")
        rows = sorted(total, key=lambda op: (-per_op[op], -total[op], op))[:top]
        if rows:
            lines.append(f"  {'op':<28}{'float32 attrs':>14}{'emulated' if self.emulated else 'converted':>11}")
            lines += [f"  {op:<28}{total[op]:>14}{per_op[op]:>11}" for op in rows]
        return "\n".join(lines)


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector while the pass runs (re-entrant).

    The pass allocates millions of small objects that are never cyclic garbage; each allocation burst made the
    collector rescan every live object (TensorFlow alone has ~300k), which was half of the run time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def rewrite_body(graph_def: graph_pb2.GraphDef, opts: Options, fetches=(), preserve=(),
                 signatures: Signatures | None = None, preserve_stateful: bool = False,
                 label: str = "graph") -> RewriteResult:
    """Rewrite one graph (a main graph or a function body) without looking into the functions it calls.

    Every front end ends here, so this is where the rewrite observers (mp_rewrite.core.observers) hear of every
    rewrite: the dump on demand ($MP_REWRITE_DUMP_DIR) is one of them.

    Args:
        fetches: node or tensor names the graph returns; their nodes are preserved.
        preserve: node names to preserve, or a dict node name -> why (the reason `explain` shows).
        preserve_stateful: preserve stateful and dataset ops too (Grappler does so inside function bodies).
        label: what is rewritten (a function name), passed on to the observers.
    """
    with gc_paused():
        result = _rewrite_body(graph_def, opts, fetches, preserve, signatures, preserve_stateful, label)
    notify_rewrite(result, graph_def, label)
    return result


def _names(value, option: str) -> tuple:
    """Node or tensor names as a tuple: one string is one name (not its characters)."""
    names = (value,) if isinstance(value, str) else tuple(value or ())
    for name in names:
        if not isinstance(name, str) or not name.lstrip("^"):
            raise OptionError(f"{option}: {name!r} is not a node or tensor name (\"node\" or \"node:0\")")
    return names


def _check_fetch_ports(view: GraphView, fetches: tuple) -> None:
    for fetch in fetches:
        name, port = parse_input(fetch.lstrip("^"))
        outputs = len(view.layouts[view.node_index[name]].outputs)
        if name != fetch.lstrip("^") and port >= outputs:  # a bare node name fetches the node, not an output
            ports = {0: "", 1: f" or '{name}:0'"}.get(outputs, f" or '{name}:0' to '{name}:{outputs - 1}'")
            raise GraphError(f"fetch '{fetch}' names output {port} of node '{name}', which has {outputs} "
                             f"output{'' if outputs == 1 else 's'}; fetch '{name}'{ports}")


def _rewrite_body(graph_def, opts, fetches, preserve, signatures, preserve_stateful, label) -> RewriteResult:
    why_preserved = dict(preserve) if isinstance(preserve, dict) else {}
    fetches, preserve = _names(fetches, "fetches"), _names(tuple(preserve), "preserve")
    preserved = {parse_input(f.lstrip("^"))[0]: "fetched (graph outputs keep their dtypes)" for f in fetches}
    preserved.update({name: why_preserved.get(name, "preserved by the caller") for name in preserve})

    def upgrade(name, node_device):
        kind = device_kind(node_device) or opts.device
        return name not in preserved and (opts.device == "any" or kind == opts.device)
    view = GraphView(graph_def, upgrade_batch_norm=upgrade, signatures=signatures)
    missing = [name for name in preserved if name not in view.node_index]
    if missing:
        raise GraphError(f"fetch or preserved node '{missing[0]}' is not in the graph; check the name "
                         f"(the graph has {view.num_nodes} nodes)")
    _check_fetch_ports(view, fetches)
    if preserve_stateful:
        for i, sig in enumerate(view.sigs):
            if sig.is_stateful or "Dataset" in view.ops[i]:
                preserved.setdefault(view.names[i], "stateful op in a function body (Grappler preserves it)")
    ctx = PassContext(view, opts.lists, opts.target, opts.device, preserved, opts.keep_fp32, opts.force_low,
                      opts.force_all, position_angles(graph_def) if opts.float32_angles else None)
    assigned, costs = [], opts.costs
    if costs is not None and not isinstance(costs, CostTable):  # a machine table: this body's costs, measured
        costs, label = costs.for_graph(graph_def, opts.precision, fetches=fetches), "graph"
    paint = run_stages(ctx, costs, label, assigned.append)
    applied = (apply_emulated if opts.emulate else apply_coloring)(graph_def, ctx, paint)
    # The result keeps the view for its Decisions, which need no edges. Freeing them now is cheaper than the
    # garbage collector's scan of a list per vertex; freeing them before apply was slower still: apply then
    # page-faults fresh memory in where the lists were given back.
    view.release_edges()
    result = _result(applied, ctx, paint, opts)
    result.assignment = assigned[0] if assigned else None
    return result


def run_stages(ctx: PassContext, costs: CostTable | None = None, label: str = "graph", on_assignment=None) -> Paint:
    """Run every coloring stage in Grappler's order and return the final Paint.

    With a cost table, the minimum-cut assignment (core.assignment) runs after Grappler's stages and before the
    final ones; `on_assignment` (if given) receives its Assignment summary.
    """
    paint = Paint()
    clusters = tensor_lists.find_clusters(ctx, paint)
    for cluster in clusters:
        ctx.view.add_edges(tensor_lists.implicit_edges(ctx, cluster))
    for stage in STAGES_BEFORE_LISTS:
        stage(ctx, paint)
    if not paint.allow:
        return paint  # Grappler: "No allowlist ops found, nothing to do"
    tensor_lists.match_cluster_colors(ctx, paint, clusters)
    for stage in STAGES_AFTER_LISTS:
        stage(ctx, paint)
    tensor_lists.match_cluster_colors(ctx, paint, clusters)
    if costs is not None:
        assignment = assign_by_cost(ctx, paint, clusters, costs, label)
        if on_assignment is not None:
            on_assignment(assignment)
    for stage in FINAL_STAGES:
        stage(ctx, paint)
    return paint


def _result(applied: Applied, ctx: PassContext, paint: Paint, opts: Options) -> RewriteResult:
    coloring = Coloring(ctx.view, opts.lists, paint, ctx.target, lambda v: why_kept(ctx, v))
    return RewriteResult(applied.graph_def, coloring, applied.casts, applied.retyped, opts.precision, opts.device,
                         opts.lists, ctx.view.num_nodes, emulated=applied.emulated)


def why_kept(ctx: PassContext, v: int) -> Reason:
    """The Reason for a vertex no stage painted: the first of Grappler's conditions it fails."""
    view = ctx.view
    node = view.v_node[v]
    op, category = view.ops[node], ctx.category[node]
    if not ctx.processed[node]:
        return Reason("select_nodes", "not_processed", detail=ctx.skip_reason[node])
    if not ctx.is_float32(v):
        return Reason("select_nodes", "not_float32", detail=f"its dtype is {dtypes.name(view.v_dtype[v])}")
    if op in FUNCTIONAL_CONTROL_FLOW_OPS:
        return Reason("select_nodes", "function_boundary",
                      detail=f"{op} calls functions that are rewritten on their own and keep float32 arguments, so "
                             "its types stay as they are")
    if category is None:
        return Reason("select_nodes", "not_in_lists", detail=f"{op} is in no op list, so it keeps its dtype")
    if category in ("clear", "infer") and not ctx.supports_dtype(v):
        return Reason("select_nodes", "dtype_not_allowed",
                      detail=f"the OpDef of {op} does not allow {dtypes.name(ctx.target)} for {view.v_key[v]}")
    if category in ("clear", "infer") and not ctx.has_kernel(v):
        where = ctx.kernels.source(op, ctx.kinds[node])
        return Reason("select_nodes", "no_low_precision_kernel",
                      detail=f"no {dtypes.name(ctx.target)} kernel for {op} on {ctx.kinds[node].upper()} ({where})")
    if category == "clear":
        return Reason("propagate_allow_through_clear", "no_allow_neighbour",
                      detail="clear op not connected to a low-precision node through clear ops")
    return Reason("add_between_allow", "not_between_allow",
                  detail="infer op neither on a path between allow nodes nor directly after one")
