"""The angles of Sin and Cos computed from integer positions: kept float32 by the default conversion.

A rotary or sinusoidal position embedding multiplies positions (integer ids cast to float, or a Range) by inverse
frequencies and takes the Sin and Cos of the product. The angle grows with the position, and what Sin and Cos need
is its absolute error: bfloat16 keeps 8 significant bits, so an angle near 1000 radians moves in steps of 4 and
its sine is noise. Grappler's lists put the product (an Einsum or MatMul on the allow list, a Mul on the infer list)
in low precision all the same: keras-hub's Gemma 4 failed `--verify` with cosine 0.78 for that one Einsum, at
random position ids below 1000, where Keras' own mixed_bfloat16 policy computes it in float32.

`position_angles(graph_def)` finds, for each Sin/Cos/Tan, the nodes between it and a position origin -- a Cast from
an integer type, or a Range -- walking its argument's producers back through arithmetic, contractions and shape
ops, at most MAX_DEPTH nodes deep; those nodes and the Sin/Cos are kept float32 (core.pass_context's "angle"
override, the "position_angle" reason). A Sin of activations (a SIREN layer) reaches no origin and is left to the
lists. Protos in, names out; no TensorFlow.
"""

from __future__ import annotations

PERIODIC = frozenset({"Sin", "Cos", "Tan"})
# What an angle is computed through: positions scaled, offset, reshaped, joined, gathered, contracted.
THROUGH = frozenset({"Mul", "RealDiv", "Div", "DivNoNan", "AddV2", "Add", "Sub", "Neg", "Einsum", "MatMul",
                     "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Reshape", "ExpandDims", "Squeeze", "ConcatV2",
                     "Pack", "Tile", "Transpose", "Identity", "StridedSlice", "Slice", "GatherV2", "BroadcastTo",
                     "Cast"})
INTEGER_TYPES = frozenset({3, 9, 4, 5, 6, 17, 22, 23})  # int32, int64, uint8, int16, int8, uint16, uint32, uint64
MAX_DEPTH = 12  # a rotary embedding's angle is 2-5 nodes from its Cast; a sinusoidal one's about as many


def position_angles(graph_def) -> dict:
    """{node name: the Sin/Cos/Tan whose angle it computes from integer positions} of `graph_def`'s nodes (the
    Sin/Cos included, under its own name); {} where no Sin/Cos reads a position."""
    periodic = [node for node in graph_def.node if node.op in PERIODIC]
    if not periodic:  # most graphs: the pass asks of every body it rewrites
        return {}
    nodes = {node.name: node for node in graph_def.node}
    found = {}
    for node in periodic:
        path = _from_positions(nodes, node.input[0].split(":")[0] if node.input else "", MAX_DEPTH, {})
        if path:
            found.setdefault(node.name, node.name)
            for name in path:
                found.setdefault(name, node.name)
    return found


def _from_positions(nodes: dict, name: str, depth: int, memo: dict) -> frozenset:
    """The nodes from `name` back to a position origin (`name` included), or an empty set where none is within
    `depth`."""
    if (name, depth) in memo:
        return memo[name, depth]
    node = nodes.get(name)
    memo[name, depth] = frozenset()  # a cycle (a loop's NextIteration) reaches nothing
    if node is None or depth == 0 or node.op not in THROUGH and node.op != "Range":
        return frozenset()
    if node.op == "Range" or node.op == "Cast" and node.attr["SrcT"].type in INTEGER_TYPES:
        memo[name, depth] = frozenset({name})
        return memo[name, depth]
    reached = frozenset().union(*(_from_positions(nodes, i.split(":")[0], depth - 1, memo)
                                  for i in node.input if not i.startswith("^")))
    memo[name, depth] = reached | {name} if reached else frozenset()
    return memo[name, depth]
