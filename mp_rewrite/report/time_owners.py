"""Which box of the time view a measured time belongs to, where it is not the box of the node it was measured
under: the arithmetic on a layer's weights done every call (weight_owners), and a fused kernel, which TF names
after the last op it fuses (fused_homes). Rendered from the graph and the runs, never decided again."""

from __future__ import annotations


def weight_owners(graph) -> dict:
    """{node: box} of the nodes no box draws that compute a box's weights every call -- reads of variables, and
    what a model computes from weights alone at each call (in place, a BatchNorm folded into a convolution scales
    its filter at every call: on ResNet-50 at 64x64 and batch 1, half of a float32 run) -- each to the first box
    that reads it, so that a layer's time holds the work done for it. Constants cost nothing here: TF folds them."""
    from .layer_graph import node_roles
    role, _ = node_roles(graph.table)
    rows, owners = graph.table.rows, {}
    drawn = set(graph.box_of).union(*(layer.cast_nodes for layer in graph.layers.values()))  # priced there
    for key, layer in graph.layers.items():
        stack = sorted(layer.weights, reverse=True)
        while stack:
            name = stack.pop()
            if name in owners or name in drawn or name not in rows or role.get(name) in ("input", "op", "drop"):
                continue
            owners[name] = key
            stack += [src for src, _ in rows[name].drawn_inputs]
    return owners


def kernel_op(kernel: str) -> str:
    """The op a fused kernel starts from, as a graph spells it ("_MklNativeFusedConv2D: BiasAdd+Relu6" ->
    "Conv2D", "_MklFusedMatMul: BiasAdd" -> "MatMul"); "" for a kernel that fuses nothing."""
    from ..analysis.run_times import MKL_PREFIXES
    if ":" not in kernel:
        return ""
    head = kernel.split(":")[0]
    head = next((head[len(p):] for p in (*MKL_PREFIXES, "_") if head.startswith(p)), head)
    return head[len("Fused"):] if head.startswith("Fused") else head


def fused_homes(graph, times: dict, kernel, column: int) -> tuple:
    """({node: box}, {node: box}): the drawn nodes TF named a fused kernel after whose kernel starts from an op in
    another box, and the ops fused into such a kernel on the way there (a BatchNorm's bias add), each with the box
    the kernel's time goes to. TF names a fused kernel after the last op it fuses (the Relu6 after a convolution
    and its bias), and a Keras activation is a layer of its own: each convolution's time would show in its
    activation's box, and a frozen MobileNetV2's slowest layers would read "block_16_expand_relu". The kernel is
    the convolution's: its time and name go to the box of the op it starts from, found back along the data inputs
    over the ops it fused. One column of the times at a time (0: float32, 1: as converted), with `kernel(row)` the
    kernel that column's run ran: float32 and bfloat16 may fuse differently."""
    rows, own = graph.table.rows, times.get(graph.table.name, {})
    homes, within = {}, {}
    for name, box in graph.box_of.items():
        fused = kernel(rows[name])
        if not fused or not kernel_op(fused):
            continue
        path = _fused_path(rows, own, name, kernel_op(fused), fused.count("+") + 1, column)
        if path and graph.box_of.get(path[-1], box) != box:
            homes[name] = graph.box_of[path[-1]]
            within.update((n, homes[name]) for n in path[:-1] if n in graph.box_of)
    return homes, within


def _fused_path(rows: dict, own: dict, carrier: str, op: str, fused: int, column: int) -> list:
    """The nodes from the one a kernel is named after (`carrier`, left out) up its data inputs to the node of op
    `op` it starts from, over at most `fused` ops (and as many identities) that ran no kernel of their own; []
    when there is none."""
    frontier, parent = [carrier], {carrier: None}
    for _ in range(2 * fused):
        found = []
        for name in frontier:
            for src, _ in rows[name].drawn_inputs:
                if src in parent or src not in rows or own.get(src, (0.0, 0.0))[column] > 0:
                    continue  # a node that ran a kernel of its own is not inside this one
                parent[src] = name
                if rows[src].op == op:
                    path = [src]
                    while parent[path[-1]] != carrier:
                        path.append(parent[path[-1]])
                    return path[::-1]
                found.append(src)
        frontier = found
    return []
