"""TensorList ("data structure") handling: clusters of list ops that must share one color, and the implicit
writer -> reader edges that let a list carry low precision from one allow region to the next.

Grappler rebuilds a cluster by DFS from every root; a cluster is exactly the connected component of the root's
variant vertex, so here each component is computed once (same result, linear time).
"""

from __future__ import annotations

from .coloring import Paint, Reason
from .pass_context import PassContext
from .stages import INPUTS, traverse

READERS = frozenset({"TensorListConcat", "TensorListConcatV2", "TensorListGather", "TensorListGetItem",
                     "TensorListPopBack", "TensorListStack"})
WRITERS = frozenset({"TensorListFromTensor", "TensorListPushBack", "TensorListPushBackBatch", "TensorListScatter",
                     "TensorListScatterV2", "TensorListScatterIntoExistingList", "TensorListSetItem",
                     "TensorListSplit"})
VARIANT_KEY = "fixed:variant"


def element_vertex(ctx: PassContext, node: int) -> int | None:
    """GetTensorListFloat32NodeTypeId: a TensorList op's first single, non-fixed, float32 type attr (element_dtype)."""
    view = ctx.view
    if "TensorList" not in view.ops[node]:
        return None
    for key, v in view.node_vids[node].items():
        if view.v_attr[v] and "[" not in key and ctx.is_float32(v):
            return v
    return None


def _component(ctx: PassContext, root: int) -> list[int]:
    seen = set()
    traverse(ctx, root, "both", lambda v: True, lambda v, parent: seen.add(v))
    return sorted(seen)


def find_clusters(ctx: PassContext, paint: Paint) -> list[list[int]]:
    """FindFloat32TensorListOpClustersAndDenylistUnsafe: one cluster (sorted member nodes) per root list node.

    A root's element type is painted deny when its cluster holds an unprocessed list node or touches a
    source/sink (function call, _Arg/_Retval, Placeholder, Optional*), since the list then leaves the graph.
    """
    view = ctx.view
    clusters, by_vertex = [], {}
    for root in range(view.num_vertices):
        node = view.v_node[root]
        if view.v_key[root] != VARIANT_KEY or not ctx.processed[node]:
            continue
        root_elem = element_vertex(ctx, node)
        if root_elem is None:
            continue
        if root not in by_vertex:
            component = _component(ctx, root)
            nodes = sorted({view.v_node[v] for v in component})
            for v in component:
                by_vertex[v] = nodes
        nodes = by_vertex[root]
        members = [n for n in nodes if element_vertex(ctx, n) is not None]
        unsafe = next((n for n in members if not ctx.processed[n]), None)
        if unsafe is None:
            unsafe = next((n for n in nodes if element_vertex(ctx, n) is None and ctx.is_source_or_sink(n)), None)
        if unsafe is not None:
            paint.paint_deny(root_elem, Reason("find_tensor_list_clusters", "tensor_list_leaves_graph",
                                               view.names[unsafe], detail=f"the list reaches {view.ops[unsafe]} "
                                               f"'{view.names[unsafe]}', so its elements must stay float32"))
        clusters.append(members)
    return clusters


def implicit_edges(ctx: PassContext, cluster: list[int]) -> list[tuple[int, int]]:
    """FindTensorListImplicitFloat32Edges: writer element vertex -> reader element vertex, for every writer
    upstream (through processed nodes) of each reader in the cluster."""
    view, edges = ctx.view, []
    for reader in cluster:
        if view.ops[reader] not in READERS:
            continue
        reader_elem = element_vertex(ctx, reader)
        start = view.node_vids[reader].get(VARIANT_KEY)
        if reader_elem is None or start is None:
            continue

        def visit(v, parent):
            node = view.v_node[v]
            if view.ops[node] in WRITERS:
                writer_elem = element_vertex(ctx, node)
                if writer_elem is not None:
                    edges.append((writer_elem, reader_elem))
        traverse(ctx, start, INPUTS, lambda v: ctx.processed[view.v_node[v]], visit)
    return edges


def match_cluster_colors(ctx: PassContext, paint: Paint, clusters: list[list[int]]) -> None:
    """ForceColorMatchBetweenTensorListOps: if any member's element type is deny, all become deny; else if any
    is allow, all become allow."""
    view = ctx.view
    for cluster in clusters:
        elems = [element_vertex(ctx, n) for n in cluster]
        denied = next((v for v in elems if v in paint.deny), None)
        allowed = None if denied is not None else next((v for v in elems if v in paint.allow), None)
        if denied is None and allowed is None:
            continue
        cause = view.names[view.v_node[denied if denied is not None else allowed]]
        reason = Reason("match_tensor_list_colors", "tensor_list_match", cause,
                        detail=f"one TensorList: every op on it shares the color of {cause}")
        for v in elems:
            (paint.paint_deny if denied is not None else paint.paint_allow)(v, reason)
