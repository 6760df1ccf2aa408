"""Which graph holds the network: a SavedModel's main graph only calls its signature wrappers, which call the
model's `__call__` function (`__inference___call___NNN`), where the layers are. The whole-model pictures and Model
Explorer open on that function."""

from __future__ import annotations

# Ops that carry a layer's weights: the work a network is made of.
WEIGHT_OPS = frozenset({
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
    "Einsum", "Conv2DBackpropInput", "Conv3DBackpropInputV2", "_FusedConv2D", "_FusedMatMul", "ResourceGather",
    "GatherV2", "CudnnRNN", "CudnnRNNV3", "BlockLSTM", "BlockLSTMV2", "While", "StatelessWhile"})
# Function-call ops whose callee is drawn through them (not While/If bodies: those belong to a layer).
CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})


def callees(table, names) -> list[str]:
    """The functions (among `names`) the call nodes of `table` call, in graph order, without repeats."""
    found = []
    for node in table.result.graph_def.node:
        if node.op in CALL_OPS and "f" in node.attr and node.attr["f"].func.name in names:
            found.append(node.attr["f"].func.name)
    return list(dict.fromkeys(found))


def own_work(table) -> int:
    """Weight-bearing nodes of the graph itself (Conv2D, MatMul, Einsum, ...)."""
    return sum(1 for row in table.rows.values() if row.op in WEIGHT_OPS)


def network_table(tables):
    """The GraphTable that holds the network.

    From the main graph (the first table), follow call nodes while the current graph has no weight-bearing op of
    its own, into the callee whose call tree holds the most; a bare GraphDef, or a graph with layers of its own,
    is its own answer.

    Args:
        tables: node_table.build_tables(result) (main graph first).

    Returns:
        One of `tables`.
    """
    by_name = {t.name: t for t in tables}
    memo: dict = {}

    def total(name: str, seen: frozenset) -> int:
        if name not in memo:
            table = by_name[name]
            memo[name] = own_work(table) + sum(total(c, seen | {name}) for c in callees(table, by_name)
                                               if c not in seen)
        return memo[name]

    current, seen = tables[0], set()
    while own_work(current) == 0:
        seen.add(current.name)
        options = [c for c in callees(current, by_name) if c not in seen]
        if not options:
            break
        best = max(options, key=lambda c: total(c, frozenset(seen)))
        if total(best, frozenset(seen)) == 0:
            break
        current = by_name[best]
    return current
