"""Grappler's coloring passes, one function per stage, in Grappler's order (see `STAGES` in rewrite.py).

Each stage reads the PassContext and updates the Paint (allow/deny sets + reasons). None touches a proto.
Every traversal is Grappler's DfsTypeTraversal: the set of vertices reachable from a root through vertices that
satisfy the stage's predicate (the root always enters).
"""

from __future__ import annotations

from .coloring import Paint, Reason
from .errors import StageError
from .pass_context import PassContext

INPUTS, OUTPUTS, BOTH = "inputs", "outputs", "both"


def traverse(ctx: PassContext, root: int, direction: str, enter, visit) -> None:
    """Depth-first from `root`; a non-root vertex is entered when `enter(v)`; `visit(v, parent)` on entering."""
    fanin, fanout = ctx.view.fanin, ctx.view.fanout
    stack, done = [(root, -1)], set()
    while stack:
        v, parent = stack.pop()
        if v in done:
            continue
        done.add(v)
        if v != root and not enter(v):
            continue
        visit(v, parent)
        if direction != OUTPUTS:
            stack.extend((u, v) for u in fanin[v] if u not in done)
        if direction != INPUTS:
            stack.extend((u, v) for u in fanout[v] if u not in done)


def _name(ctx: PassContext, v: int) -> str | None:
    return None if v < 0 else ctx.view.names[ctx.view.v_node[v]]


def seed_allowlist(ctx: PassContext, paint: Paint) -> None:
    """Pass 1 (AddAllowlistOps): every type attr of every processed allow-list node (or forced node) is allow."""
    view = ctx.view
    for v in range(view.num_vertices):
        node = view.v_node[v]
        if not ctx.processed[node]:
            continue
        if ctx.category[node] == "allow":
            rule = "user_force_low" if ctx.override[node] else "allow_list"
            paint.paint_allow(v, Reason("seed_allowlist", rule, view.names[node]))
        elif ctx.force_all and ctx.can_force(node):
            paint.paint_allow(v, Reason("seed_allowlist", "unsafe_force_all", view.names[node]))


def propagate_deny_forward(ctx: PassContext, paint: Paint) -> None:
    """Pass 2 (PropagateDenyFwdThroughClearAndInfer): deny flows forward from deny nodes through clear and infer
    nodes, but only along paths that reach another deny or infer node. Ignores devices and preservation."""
    if ctx.force_all:
        return
    view, category = ctx.view, ctx.category
    upstream = set()
    for root in range(view.num_vertices):
        if category[view.v_node[root]] not in ("deny", "infer"):
            continue
        traverse(ctx, root, INPUTS,
                 lambda v: v not in upstream and category[view.v_node[v]] == "clear",
                 lambda v, parent: upstream.add(v))
    for root in range(view.num_vertices):
        if category[view.v_node[root]] != "deny" or root in paint.deny:
            continue
        source = _name(ctx, root)

        def visit(v, parent):
            node = view.v_node[v]
            if category[node] == "deny":
                rule = "user_keep_fp32" if ctx.override[node] else "deny_list"
                paint.paint_deny(v, Reason("propagate_deny_forward", rule, view.names[node]))
            else:
                paint.paint_deny(v, Reason("propagate_deny_forward", "deny_propagated", source, _name(ctx, parent)))
        traverse(ctx, root, OUTPUTS, lambda v: v not in paint.deny and v in upstream, visit)


def add_between_allow(ctx: PassContext, paint: Paint) -> None:
    """Pass 3 (AddClearAndInferToAllowIfBetweenAllow): processed float32 clear/infer vertices with a low-precision
    kernel that sit on a path from one allow-list node to another become allow."""
    view, category = ctx.view, ctx.category
    roots = [v for v in range(view.num_vertices)
             if category[view.v_node[v]] == "allow" and ctx.processed[view.v_node[v]]]
    downstream = {}  # vertex -> the allow-list node it is downstream of

    def enter_down(v):
        node = view.v_node[v]
        return (v not in downstream and category[node] in ("clear", "infer") and v not in paint.deny
                and ctx.processed[node] and ctx.is_float32(v) and ctx.supports_low(v))
    for root in roots:
        if root not in downstream:
            src = _name(ctx, root)
            traverse(ctx, root, OUTPUTS, enter_down, lambda v, parent: downstream.setdefault(v, src))
    upstream = set()
    for root in roots:
        if root in upstream:
            continue
        dst = _name(ctx, root)

        def visit(v, parent):
            upstream.add(v)
            detail = f"on a path from allow node {downstream[v]} to allow node {dst}"
            paint.paint_allow(v, Reason("add_between_allow", "between_allow", downstream[v], _name(ctx, parent),
                                        detail))
        traverse(ctx, root, INPUTS, lambda v: v not in upstream and v in downstream, visit)


def add_infer_after_allow(ctx: PassContext, paint: Paint) -> None:
    """Pass 4 (AddInferToAllowIfFollowAllow): a processed float32 infer vertex whose fanins include an allow
    vertex and no deny vertex becomes allow (OpDef dtype check only, no kernel check, as in TF 2.21)."""
    view = ctx.view
    for v in range(view.num_vertices):
        node = view.v_node[v]
        if (ctx.category[node] != "infer" or not ctx.processed[node] or v in paint.deny or v in paint.allow
                or not ctx.is_float32(v) or not ctx.supports_dtype(v)):
            continue
        fanins = view.fanin[v]
        if any(u in paint.deny for u in fanins):
            continue
        allow_fanin = next((u for u in fanins if u in paint.allow), None)
        if allow_fanin is not None:
            paint.paint_allow(v, Reason("add_infer_after_allow", "follows_allow", _name(ctx, allow_fanin),
                                        _name(ctx, allow_fanin)))


def propagate_allow_through_clear(ctx: PassContext, paint: Paint) -> None:
    """Pass 5 (PropagateAllowThroughClear): allow spreads in both directions through connected processed float32
    clear vertices with a low-precision kernel (never into an Identity reading a ref variable)."""
    view = ctx.view
    reached = set()

    def enter(v):
        node = view.v_node[v]
        return (v not in paint.allow and v not in paint.deny and ctx.category[node] == "clear"
                and ctx.processed[node] and ctx.is_float32(v) and ctx.supports_low(v)
                and not ctx.reads_ref_variable(node))
    for root in range(view.num_vertices):
        if root in reached or root not in paint.allow or not ctx.processed[view.v_node[root]]:
            continue
        source = _name(ctx, root)

        def visit(v, parent):
            reached.add(v)
            paint.paint_allow(v, Reason("propagate_allow_through_clear", "allow_through_clear", source,
                                        _name(ctx, parent)))
        traverse(ctx, root, BOTH, enter, visit)


def remove_unsupported(ctx: PassContext, paint: Paint) -> None:
    """Pass 6 (RemoveAllowsetWithFp32): allow-list type attrs whose OpDef does not allow the target dtype, or
    whose node has a quantized type, leave allow. Unlike Grappler, fixed-dtype attrs of force-painted nodes
    leave too (Grappler then fails with "Failed to set type attribute")."""
    view = ctx.view
    for v in sorted(paint.allow):
        node = view.v_node[v]
        if ctx.category[node] != "allow" and view.v_attr[v]:
            continue
        if not ctx.supports_dtype(v):
            paint.unallow(v, Reason("remove_unsupported", "dtype_not_allowed",
                                    detail=f"the OpDef of {view.ops[node]} does not allow the low-precision dtype "
                                           f"for {view.v_key[v]}"))
        elif ctx.is_quantized(v):
            paint.unallow(v, Reason("remove_unsupported", "quantized", detail="the node has a quantized type"))


def match_recurrent_edges(ctx: PassContext, paint: Paint) -> None:
    """ForceColorMatchOnRecurrentEdges: a NextIteration and the Merges it feeds end up all allow or none allow.

    Raises:
        StageError: a NextIteration feeds something other than a Merge.
    """
    view = ctx.view
    for node, op in enumerate(view.ops):
        if op != "NextIteration":
            continue
        merges = []
        for dst, _ in view.out_edges[node][0]:
            if view.ops[dst] != "Merge":
                raise StageError("match_recurrent_edges", view.names[node], op,
                                 f"expected a Merge after NextIteration, got {view.ops[dst]} '{view.names[dst]}'")
            merges.append(view.node_vids[dst]["T"])
        mine = view.node_vids[node]["T"]
        if any(m not in paint.allow for m in merges):
            blocker = next(_name(ctx, m) for m in merges if m not in paint.allow)
            for v in merges + [mine]:
                paint.unallow(v, Reason("match_recurrent_edges", "recurrent_edge_match", blocker,
                                        detail=f"loop back edge {view.names[node]} feeds Merge {blocker}, which "
                                               "is not low precision"))
        else:
            paint.paint_allow(mine, Reason("match_recurrent_edges", "recurrent_edge_match", _name(ctx, merges[0])
                                           if merges else None, detail="all Merges it feeds are low precision"))


def make_casts_allow(ctx: PassContext, paint: Paint) -> None:
    """MakeCastsAllowIfAllOutputsAllow: an existing Cast to float32 whose consumers are all allow casts straight
    to the low-precision dtype instead (no ShouldProcess check, as in Grappler)."""
    view = ctx.view
    for node, op in enumerate(view.ops):
        if op != "Cast":
            continue
        dst_t = view.node_vids[node].get("DstT")
        if dst_t is None or not ctx.is_float32(dst_t):
            continue
        consumers = view.out_edges[node][0]
        if consumers and all(view.in_vids[d][p] in paint.allow for d, p in consumers):
            paint.paint_allow(dst_t, Reason("make_casts_allow", "cast_consumers_allow",
                                            detail="every consumer of this Cast is low precision"))
