"""The per-op rules of the batch-rows analysis (batch_rows.py): for each op, how the states of its inputs
(batch_row_states.py) make the states of its outputs, or why it mixes the samples of a batch.

A rule is called only when some input is not `same`; it returns one State per output (the last one repeats) or
raises Refused with the reason. The rules of ops that move, cut, join or reshape tensors live in batch_row_layout.py;
those of ops that compute, and the table, here.
"""

from __future__ import annotations

import math

from ..core.graph_view import parse_input
from .batch_row_layout import (concat, expand_dims, fill, gather, pack, pad, reshape, shape_of, slice_rows, split,
                               squeeze, strided_slice, tile, transpose)
from .batch_row_states import (CHANNELS, LAST_AXIS, ROWS, SAME_STATE, SHAPE, SIZE, Refused, State, const_ints,
                               refuse_batch_axis, rows_k, unary, where)


def broadcasting(node, data, states, context):
    """An elementwise op with broadcasting: rows, if no `same` operand can broadcast over axis 0."""
    if any(s.kind in (SIZE, SHAPE) for s in states):
        return [_size_arithmetic(node, data, states, context)]
    k = rows_k(node, states)
    if node.op in ("BiasAdd", "AddN"):  # BiasAdd: a 1-D bias on the last axis of a rank >= 2 value
        if node.op == "BiasAdd" and states[0].kind != ROWS:
            raise Refused(where(node, "its bias carries the batch"))
        return [State(ROWS, k)]
    rows = [context.rank(t, node) for t, s in zip(data, states) if s.kind == ROWS]
    if len(set(rows)) != 1:
        raise Refused(where(node, f"its batch inputs differ in rank ({rows}): axis 0 would not line up"))
    for tensor, state in zip(data, states):
        shape = context.shape(tensor)
        if state == SAME_STATE and (shape is None or (len(shape) == rows[0] and shape[0] != 1)
                                    or len(shape) > rows[0]):
            raise Refused(where(node, f"{tensor} ({shape}) may broadcast over axis 0, the batch"))
    return [State(ROWS, k)]


def _size_arithmetic(node, data, states, context) -> State:
    """The batch size times a constant (a reshape's rows): Mul of size(k) by a constant integer."""
    sizes = [i for i, s in enumerate(states) if s.kind == SIZE]
    if node.op == "Mul" and len(sizes) == 1 and len(states) == 2:
        factor = const_ints(context.nodes.get(parse_input(data[1 - sizes[0]])[0]))
        if factor is not None and len(factor) == 1 and factor[0] > 0:
            return State(SIZE, states[sizes[0]].k * factor[0])
    raise Refused(where(node, f"computes with the batch size ({', '.join(map(str, states))})"))


def row_wise(node, data, states, context):
    """Per image, per row or per sample (convolutions, pools, inference normalizations, softmax): rows."""
    if states[0].kind == CHANNELS and node.op in CHANNEL_NORMS:
        return _channel_norm(node, data, states, context)
    if states[0].kind != ROWS:
        raise Refused(where(node, f"a parameter carries the batch, not its input ({states[0]})"))
    k = states[0].k
    rank = context.rank(data[0], node) if node.op in LAST_AXIS or len(states) > 1 else None
    for tensor, state in zip(data[1:], states[1:]):  # a fused residual (side input) is elementwise
        if state != SAME_STATE and (state != State(ROWS, k) or context.rank(tensor, node) != rank):
            raise Refused(where(node, f"{tensor} ({state}) does not line up with its input on the batch"))
    if node.op in LAST_AXIS and rank < 2:
        raise Refused(where(node, "normalizes a 1-D tensor: over the batch"))
    if node.op.startswith("FusedBatchNorm") or node.op == "_FusedBatchNormEx":
        if node.attr["is_training"].b:
            raise Refused(where(node, "normalizes with the batch's own statistics (training mode)"))
        return [State(ROWS, k), SAME_STATE]
    return [State(ROWS, k)]


def _channel_norm(node, data, states, context):
    """FusedBatchNorm of channels(k) in NCHW (the rules' LayerNorm spelling): each channel is one row, normalized
    by its own statistics: channels(k), and the per-channel statistics rows(k). Its scale and offset must be
    rows(k) (Fills to the row count); its running statistics too, or empty in training mode."""
    k = states[0].k
    if node.attr["data_format"].s != b"NCHW":
        raise Refused(where(node, "normalizes the batch's rows on axis 1 as positions, not as channels (NHWC)"))
    for tensor, state in zip(data[1:5], states[1:5]):
        empty = (context.shape(tensor) or (None,))[0] == 0
        if not (state == State(ROWS, k) and context.rank(tensor, node) == 1
                or state == SAME_STATE and empty and node.attr["is_training"].b):
            raise Refused(where(node, f"its per-channel parameter {tensor} ({state}) does not line up with the rows "
                                      "it normalizes as channels"))
    return [State(CHANNELS, k), State(ROWS, k)]


def matmul(node, data, states, context):
    """MatMul of rows by a `same` matrix, not transposed: rows."""
    if states[1] != SAME_STATE or states[0].kind != ROWS:
        raise Refused(where(node, f"multiplies by a matrix that carries the batch ({states[1]}): rows would mix"))
    if node.attr["transpose_a"].b:
        raise Refused(where(node, "contracts over axis 0 (transpose_a), the batch"))
    return row_wise(node, [data[0], *data[2:]], [states[0], *states[2:]], context)


def batch_matmul(node, data, states, context):
    """BatchMatMul whose batch operands keep axis 0 (the other broadcasts below it): rows."""
    x, y = states[:2]
    ranks = [context.rank(t, node) for t in data[:2]]
    if x.kind == ROWS and y.kind == ROWS and x.k == y.k and ranks[0] == ranks[1] >= 3:
        return [x]
    shapes = [context.shape(t) for t in data[:2]]
    for mine, other in ((0, 1), (1, 0)):
        if states[mine].kind == ROWS and states[other] == SAME_STATE and ranks[mine] >= 3 and (
                ranks[other] < ranks[mine] or shapes[other][0] == 1):
            return [states[mine]]
    if x.kind == ROWS and y == SAME_STATE and ranks[0] == 2 and not node.attr["adj_x"].b:
        return [x]
    raise Refused(where(node, f"its operands ({x}, rank {ranks[0]}; {y}, rank {ranks[1]}) do not line up on the "
                              "batch"))


def einsum(node, data, states, context):
    """Einsum whose batch letter leads every batch operand and the output, and no weight: rows."""
    equation = node.attr["equation"].s.decode().replace(" ", "")
    given, _, out = equation.partition("->")
    terms = given.split(",")
    rows = {terms[i][:1] for i, s in enumerate(states) if s.kind == ROWS}
    k = rows_k(node, states)
    letter = rows.pop() if len(rows) == 1 else "."
    same = "".join(t for t, s in zip(terms, states) if s == SAME_STATE)
    in_rows = [t[1:] for t, s in zip(terms, states) if s.kind == ROWS]
    if letter == "." or not out.startswith(letter) or letter in same or any(letter in t for t in in_rows):
        raise Refused(where(node, f"equation {equation!r} does not keep the batch on axis 0 of each operand"))
    return [State(ROWS, k)]


def reduction(node, data, states, context):
    """A reduction, or a running sum or product (Cumsum: Falcon's positions from its mask), over axes other than 0
    (or tf.tensordot's product of a shape): rows (or a size)."""
    if states[0].kind == SHAPE and node.op == "Prod" and states[1] == SAME_STATE:
        return [_shape_product(node, data, states[0], context)]
    if states[0].kind != ROWS or any(s != SAME_STATE for s in states[1:]):
        raise Refused(where(node, f"reduces with the batch in its axes ({states[1]})"))
    axes = context.value(data[1], node)
    refuse_batch_axis(node, axes, context.rank(data[0], node) if any(a < 0 for a in axes) else 0, "reduces over")
    return [states[0]]


def _shape_product(node, data, shape: State, context) -> State:
    """The product of a shape's values (tf.tensordot's rows): size(k * the rest), where the rest is known."""
    if context.value(data[1], node) not in ([0], [-1]) or shape.rest is None:
        raise Refused(where(node, f"multiplies the batch size by values not known here ({shape})"))
    size = State(SIZE, shape.k * math.prod(shape.rest))
    return State(SHAPE, size.k, ()) if node.attr["keep_dims"].b else size


def fourier(node, data, states, context):
    """An FFT over the innermost 1, 2 or 3 axes (FNet's mixing), of a tensor with the batch above them: rows."""
    if states[0].kind != ROWS or any(s != SAME_STATE for s in states[1:]):
        raise Refused(where(node, f"transforms with the batch in a parameter ({', '.join(map(str, states))})"))
    inner = int(node.op[-2]) if node.op[-1] == "D" else 1  # FFT2D: 2
    if context.rank(data[0], node) <= inner:
        raise Refused(where(node, "transforms over axis 0, the batch"))
    return [states[0]]


def lookup(node, data, states, context):
    """A table lookup of rows of keys: rows."""
    if states[0] != SAME_STATE or states[2] != SAME_STATE or states[1].kind != ROWS:
        raise Refused(where(node, "looks up a table with the batch in its table or default"))
    return [states[1]]
CHANNEL_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})


RULES = {
    **dict.fromkeys(({
        "Identity", "StopGradient", "PreventGradient", "Snapshot", "CheckNumerics", "Cast", "Relu", "Relu6", "Elu",
        "Selu", "LeakyRelu", "Gelu", "Tanh", "Sigmoid", "Exp", "Expm1", "Log", "Log1p", "Sqrt", "Rsqrt", "Square",
        "Neg", "Abs", "Erf", "Erfc", "Softplus", "Softsign", "Floor", "Ceil", "Round", "Rint", "Sign", "Sin", "Cos",
        "Reciprocal", "Inv", "IsNan", "IsFinite", "IsInf", "LogicalNot", "ZerosLike", "OnesLike", "_MklSwish",
        "Mish", "ClipByValue", "EnsureShape", "Real", "Imag", "ComplexAbs", "Angle", "Conj"}), unary),
    **dict.fromkeys(("Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "MulNoNan", "Maximum", "Minimum",
                     "Pow", "SquaredDifference", "FloorDiv", "FloorMod", "TruncateDiv", "Mod", "Less", "LessEqual",
                     "Greater", "GreaterEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "SelectV2", "Atan2",
                     "BiasAdd", "AddN", "Xlogy", "Xdivy", "Complex"), broadcasting),
    **dict.fromkeys(("Conv2D", "Conv3D", "DepthwiseConv2dNative", "_FusedConv2D", "_FusedDepthwiseConv2dNative",
                     "MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "FusedBatchNorm", "FusedBatchNormV2",
                     "FusedBatchNormV3", "_FusedBatchNormEx", "_MklLayerNorm", "Softmax", "LogSoftmax", "LRN"),
                    row_wise),
    **dict.fromkeys(("MatMul", "_FusedMatMul"), matmul),
    **dict.fromkeys(("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"), batch_matmul),
    "Einsum": einsum,
    **dict.fromkeys(("Mean", "Sum", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm", "ArgMax", "ArgMin",
                     "Cumsum", "Cumprod", "CumulativeLogsumexp"), reduction),
    **dict.fromkeys(("FFT", "IFFT", "RFFT", "IRFFT", "FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D", "FFT3D", "IFFT3D",
                     "RFFT3D", "IRFFT3D"), fourier),
    "Shape": shape_of, "ShapeN": shape_of,
    "StridedSlice": strided_slice, "Pack": pack, "ConcatV2": concat, "Reshape": reshape,
    "Fill": fill, "BroadcastTo": fill,
    "Transpose": transpose,
    "ExpandDims": expand_dims,
    "Slice": slice_rows,
    "Pad": pad, "PadV2": pad, "MirrorPad": pad,
    "Tile": tile,
    "Squeeze": squeeze, "GatherV2": gather, "Gather": gather,
    "Split": split, "SplitV": split, "Unpack": split,
    "LookupTableFindV2": lookup, "LookupTableFind": lookup,
    "IdentityN": lambda node, data, states, context: list(states),  # output i is input i (Keras' swish)
}
# Ops that read state without changing it or making it: `same` when their inputs are (weights, captured tables).
READS = frozenset({"Const", "Placeholder", "VarHandleOp", "ReadVariableOp", "NoOp", "HashTableV2",
                   "MutableHashTableV2", "LookupTableSizeV2", "LookupTableFindV2", "LookupTableFind"})
CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While", "StatelessWhile",
                   "Case", "StatelessCase"})
