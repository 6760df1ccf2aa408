"""Grappler's coloring passes, one function per stage, in Grappler's order (see `STAGES` in rewrite.py).

Each stage reads the PassContext and updates the Paint (allow/deny sets + reasons). None touches a proto.
Every traversal is Grappler's DfsTypeTraversal: the set of vertices reachable from a root through vertices that
satisfy the stage's predicate (the root always enters).
"""

from __future__ import annotations

from .coloring import Paint, Reason
from ..errors import StageError
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


def reach(ctx: PassContext, root: int, direction: str, ok, seen: bytearray) -> list:
    """Grappler's DfsTypeTraversal from `root` for the stages whose visit closes a vertex: a non-root vertex is
    entered when `ok[v]` (fixed for the stage) and not `seen[v]` (everything entered so far, by this or an earlier
    traversal of the stage). Marks what it enters in `seen`; returns [(vertex, parent)] in visit order.

    Same order as `traverse`: a vertex that fails `ok` once fails it every time and one seen stays seen, so
    testing both when pushing instead of keeping a per-root `done` set changes nothing but the cost. Flags in
    bytearrays rather than sets: on a million vertices a set lookup is a cache miss, a byte mostly is not.
    """
    view = ctx.view
    adjacency = ((view.fanin,) if direction == INPUTS else (view.fanout,) if direction == OUTPUTS
                 else (view.fanin, view.fanout))
    order, stack = [], [(root, -1)]
    seen[root] = 1
    while stack:
        v, parent = stack.pop()
        if parent >= 0:
            if seen[v]:
                continue
            seen[v] = 1
        order.append((v, parent))
        for neighbours in adjacency:
            for u in neighbours[v]:
                if ok[u] and not seen[u]:
                    stack.append((u, v))
    return order


def _name(ctx: PassContext, v: int) -> str | None:
    return None if v < 0 else ctx.view.names[ctx.view.v_node[v]]


def _flags(size: int, members) -> bytearray:
    flags = bytearray(size)
    for v in members:
        flags[v] = 1
    return flags


def seed_allowlist(ctx: PassContext, paint: Paint) -> None:
    """Pass 1 (AddAllowlistOps): every type attr of every processed allow-list node (or forced node) is allow."""
    view = ctx.view
    for node, category in enumerate(ctx.category):
        if not ctx.processed[node]:
            continue
        if category == "allow":
            rule = "user_force_low" if ctx.override[node] else "allow_list"
            reason = Reason("seed_allowlist", rule, view.names[node])
        elif ctx.force_all and ctx.can_force(node):
            reason = Reason("seed_allowlist", "unsafe_force_all", view.names[node])
        else:
            continue
        first = view.node_first[node]
        for v in range(first, first + view.layouts[node].size):
            paint.paint_allow(v, reason)


def propagate_deny_forward(ctx: PassContext, paint: Paint) -> None:
    """Pass 2 (PropagateDenyFwdThroughClearAndInfer): deny flows forward from deny nodes through clear and infer
    nodes, but only along paths that reach another deny or infer node. Ignores devices and preservation."""
    if ctx.force_all:
        return
    view, category = ctx.view, ctx.category
    denied_before = set(paint.deny)
    ok = _upstream_through_clear(ctx)
    for v in denied_before:
        ok[v] = 0
    seen = bytearray(view.num_vertices)
    for root in range(view.num_vertices):
        if category[view.v_node[root]] != "deny" or root in denied_before or seen[root]:
            continue
        source = _name(ctx, root)
        for v, parent in reach(ctx, root, OUTPUTS, ok, seen):
            node = view.v_node[v]
            if category[node] == "deny" and ctx.override[node] == "angle":
                paint.paint_deny(v, Reason("propagate_deny_forward", "position_angle", ctx.angle_of[node]))
            elif category[node] == "deny":
                rule = "user_keep_fp32" if ctx.override[node] else "deny_list"
                paint.paint_deny(v, Reason("propagate_deny_forward", rule, view.names[node]))
            else:
                paint.paint_deny(v, Reason("propagate_deny_forward", "deny_propagated", source, _name(ctx, parent)))


def _upstream_through_clear(ctx: PassContext) -> bytearray:
    """Flags every deny/infer vertex and every clear vertex on a path of clear vertices into one. Grappler runs one
    traversal per root; the union does not depend on their order, so one traversal from all roots gives it."""
    view, category = ctx.view, ctx.category
    is_clear = [category[node] == "clear" for node in view.v_node]
    stack = [v for v in range(view.num_vertices) if category[view.v_node[v]] in ("deny", "infer")]
    upstream = _flags(view.num_vertices, stack)
    while stack:
        for u in view.fanin[stack.pop()]:
            if is_clear[u] and not upstream[u]:
                upstream[u] = 1
                stack.append(u)
    return upstream


def add_between_allow(ctx: PassContext, paint: Paint) -> None:
    """Pass 3 (AddClearAndInferToAllowIfBetweenAllow): processed float32 clear/infer vertices with a low-precision
    kernel that sit on a path from one allow-list node to another become allow."""
    view, category = ctx.view, ctx.category
    roots = [v for v in range(view.num_vertices)
             if category[view.v_node[v]] == "allow" and ctx.processed[view.v_node[v]]]
    ok = ctx.low_candidates(("clear", "infer"))
    for v in paint.deny:
        ok[v] = 0
    downstream, seen = {}, bytearray(view.num_vertices)  # vertex -> the allow-list node it is downstream of
    for root in roots:
        if not seen[root]:
            src = _name(ctx, root)
            for v, _ in reach(ctx, root, OUTPUTS, ok, seen):
                downstream[v] = src
    ok = _flags(view.num_vertices, downstream)
    upstream = bytearray(view.num_vertices)
    for root in roots:
        if upstream[root]:
            continue
        dst = _name(ctx, root)
        for v, parent in reach(ctx, root, INPUTS, ok, upstream):
            if v in paint.allow:
                continue  # the allow-list roots: painting again would change nothing
            detail = f"on a path from allow node {downstream[v]} to allow node {dst}"
            paint.paint_allow(v, Reason("add_between_allow", "between_allow", downstream[v], _name(ctx, parent),
                                        detail))


def add_infer_after_allow(ctx: PassContext, paint: Paint) -> None:
    """Pass 4 (AddInferToAllowIfFollowAllow): a processed float32 infer vertex whose fanins include an allow
    vertex and no deny vertex becomes allow.

    Unlike TF 2.21, which checks only the OpDef here, a kernel for the low-precision dtype must exist too: TF's
    pass makes e.g. AvgPool3D half after a Conv3D on CPU, where no half kernel exists, and the graph cannot run.
    """
    view = ctx.view
    for v in range(view.num_vertices):
        node = view.v_node[v]
        if (ctx.category[node] != "infer" or not ctx.processed[node] or v in paint.deny or v in paint.allow
                or not ctx.is_float32(v) or not ctx.supports_low(v)):
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
    ok = ctx.low_candidates(("clear",))
    for v in range(view.num_vertices):
        if ok[v] and (v in paint.allow or v in paint.deny or ctx.reads_ref_variable(view.v_node[v])):
            ok[v] = 0
    reached = bytearray(view.num_vertices)
    for root in sorted(paint.allow):
        if reached[root] or not ctx.processed[view.v_node[root]]:
            continue
        source = _name(ctx, root)
        for v, parent in reach(ctx, root, BOTH, ok, reached)[1:]:  # the root is allow already
            paint.paint_allow(v, Reason("propagate_allow_through_clear", "allow_through_clear", source,
                                        _name(ctx, parent)))


def remove_unsupported(ctx: PassContext, paint: Paint) -> None:
    """Pass 6 (RemoveAllowsetWithFp32): allow-list type attrs whose OpDef does not allow the target dtype, or
    whose node has a quantized type, leave allow. Unlike Grappler, the attrs of force-painted (UNSAFE_FORCE_ALL)
    nodes are checked too (Grappler then fails with "Failed to set type attribute", e.g. on SparseMatMul)."""
    view = ctx.view
    for v in sorted(paint.allow):
        node = view.v_node[v]
        if ctx.category[node] != "allow" and view.v_attr[v] and not ctx.force_all:
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
    loops = [node for node, op in enumerate(view.ops) if op == "NextIteration"]
    consumers = view.consumers_of(loops) if loops else {}
    for node in loops:
        op = view.ops[node]
        merges = []
        for dst, _ in consumers.get((node, 0), ()):
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
    to the low-precision dtype instead.

    Unlike Grappler, which checks no ShouldProcess here, a preserved (e.g. fetched) or otherwise unprocessed Cast
    is left alone: Grappler changes a fetched Cast's output dtype.
    """
    view = ctx.view
    casts = [node for node, op in enumerate(view.ops) if op == "Cast" and ctx.processed[node]]
    consumers_of = view.consumers_of(casts) if casts else {}
    for node in casts:
        dst_t = view.node_vids[node].get("DstT")
        if dst_t is None or not ctx.is_float32(dst_t):
            continue
        consumers = consumers_of.get((node, 0), [])
        if consumers and all(view.in_vertex(d, p) in paint.allow for d, p in consumers):
            paint.paint_allow(dst_t, Reason("make_casts_allow", "cast_consumers_allow",
                                            detail="every consumer of this Cast is low precision"))
