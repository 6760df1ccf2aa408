"""`row_origin`: what a tensor's first dimension is at run time, proven from the graph: the node whose first
dimension it is a fixed multiple of.

A rewrite that adds two tensors as rows (`[-1, channels]`) instead of as they are is exact only if neither
broadcasts over the first dimension: their first dimensions must be equal at every call, not only in the static
shape (two unknown batches may differ). `row_origin` follows a tensor back through the ops whose output's first
dimension is their input's (elementwise ops, BiasAdd, MatMul, Softmax, a Reshape to `[-1, known...]` from known
other dimensions, Gather by an index tensor, attention's einsums and batch matmuls) to the node where the
reasoning stops; two tensors with the same origin and multiple have equal first dimensions at every call.
Elementwise ops of several tensors follow them only when they all agree (an input of lower rank, a constant or a
static first dimension of 1 broadcasts into the others and is left out).
"""

from __future__ import annotations

from fractions import Fraction

from .graph import EditableGraph, is_first_output, node_name

SAME_ROWS = frozenset({
    "Identity", "Snapshot", "StopGradient", "Cast", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Tanh", "Sigmoid",
    "Erf", "Erfc", "Exp", "Log", "Log1p", "Neg", "Rsqrt", "Sqrt", "Square", "Abs", "Reciprocal", "Softplus",
    "Softsign", "Softmax", "LogSoftmax", "BiasAdd"})
# the output's first dimension is the broadcast of their inputs'
BROADCASTING = frozenset({"Add", "AddV2", "Sub", "Mul", "RealDiv", "DivNoNan", "SquaredDifference", "Maximum",
                          "Minimum", "Pow", "SelectV2", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
REDUCING = frozenset({"Mean", "Sum", "Max", "Min", "Prod"})
# In the name of a Reshape target that counts rows from another tensor's Shape so that Grappler sees the two row
# counts as one symbol (residual.py's): a constant -1 in its place (static_reshape's) would undo that.
ROWS_MARK = "/residual_rows/"


def row_origin(graph: EditableGraph, tensor: str) -> tuple[str, Fraction]:
    """(origin node, m): the tensor's first dimension is m times the origin's output's, at every call."""
    memo: dict = {}
    stack, pending = [_key(tensor)], set()
    while stack:
        name = stack[-1]
        if name in memo:
            stack.pop()
            continue
        node = graph.nodes.get(name)
        needed = [] if node is None else [_key(t) for t in _followed(graph, node) if _key(t) not in memo]
        if needed and name not in pending and not pending.intersection(needed):
            pending.add(name)
            stack.extend(needed)
            continue
        # a cycle (a malformed graph) or a second visit that still finds an input unresolved: stop here
        memo[name] = (name, Fraction(1)) if node is None or needed else _origin(graph, node, memo)
        pending.discard(name)
        stack.pop()
    return memo[_key(tensor)]


def _key(tensor: str) -> str:
    """A node's name for output 0; the tensor name itself (no node of that name) for another output."""
    return node_name(tensor) if is_first_output(tensor) else tensor


def _flag(node, name: str) -> bool:
    """A boolean attribute, read without adding it to the node (reading a missing key of a proto map adds it)."""
    return name in node.attr and node.attr[name].b


def _rank(graph: EditableGraph, tensor: str) -> int | None:
    shape = graph.inferred_shape(tensor)
    return None if shape is None else len(shape)


def _followed(graph: EditableGraph, node) -> list:
    """The inputs whose first dimension the node's output takes (before checking that they agree)."""
    op, inputs = node.op, graph.data_inputs(node)
    if not inputs:
        return []
    if op in SAME_ROWS or op in ("MatMul", "_FusedMatMul") and not _flag(node, "transpose_a"):
        return inputs[:1]
    if op == "Transpose":
        perm = graph.constant(inputs[1])
        return inputs[:1] if perm is not None and perm.size and int(perm.reshape(-1)[0]) == 0 else []
    if op == "Reshape":
        return inputs[:1] if _reshape_factor(graph, node) is not None else []
    if op == "GatherV2":
        axis = graph.constant(inputs[2]) if len(inputs) > 2 else None
        gathered = axis is not None and int(axis) == 0 and not ("batch_dims" in node.attr and node.attr["batch_dims"].i)
        return inputs[1:2] if gathered and (_rank(graph, inputs[1]) or 0) >= 1 else []
    if op in REDUCING:
        axes, rank = graph.constant(inputs[1]), _rank(graph, inputs[0])
        kept = axes is not None and rank and all(int(a) % rank != 0 for a in axes.reshape(-1))
        return inputs[:1] if kept else []
    if op in BROADCASTING:
        return _broadcasting(graph, node, inputs[1:] if op == "SelectV2" and _rank(graph, inputs[0]) == 0 else inputs)
    if op == "Einsum":
        return _einsum_rows(graph, node, inputs)
    return []


def _broadcasting(graph: EditableGraph, node, inputs: list) -> list:
    """The inputs that carry the output's first dimension: all but those of lower rank, constants and a static 1."""
    rank = _rank(graph, node.name)
    if rank is None or rank == 0:
        return []
    carried = []
    for tensor in inputs:
        shape = graph.inferred_shape(tensor)  # None for another output than the first, too
        if shape is None:
            return []  # a rank unknown: it may carry the first dimension, or broadcast it
        if graph.constant(tensor) is not None or len(shape) < rank or shape[0] == 1:
            continue
        carried.append(tensor)
    return carried


def _einsum_rows(graph: EditableGraph, node, inputs: list) -> list:
    """An einsum's inputs that start with the output's first label (those without it broadcast nothing into it)."""
    equation = node.attr["equation"].s.decode() if "equation" in node.attr else ""
    if "..." in equation or "->" not in equation:
        return []
    operands, output = equation.split("->")
    labels = operands.split(",")
    if not output or len(labels) != len(inputs):
        return []
    first = output[0]
    carried = [t for t, spec in zip(inputs, labels) if first in spec]
    if any(not spec.startswith(first) for spec in labels if first in spec):
        return []
    return carried


def _reshape_factor(graph: EditableGraph, node) -> Fraction | None:
    """For `Reshape(x, [-1, d1, ...])` of an x whose other dimensions are known: output rows / input rows."""
    target, shape = graph.constant(node.input[1]), graph.inferred_shape(node.input[0])
    if target is None or target.ndim != 1 or not target.size or shape is None or len(shape) < 1:
        return None
    target = [int(d) for d in target]
    if target[0] != -1 or any(d < 0 for d in target[1:]) or any(d is None for d in shape[1:]):
        return None
    inner, outer = 1, 1
    for d in shape[1:]:
        inner *= d
    for d in target[1:]:
        outer *= d
    return Fraction(inner, outer) if outer else None


def _origin(graph: EditableGraph, node, memo: dict) -> tuple[str, Fraction]:
    followed = _followed(graph, node)
    origins = {memo[_key(t)] for t in followed}
    if len(origins) != 1:
        return node.name, Fraction(1)
    origin, factor = origins.pop()
    if node.op == "Reshape":
        factor *= _reshape_factor(graph, node)
    return origin, factor
