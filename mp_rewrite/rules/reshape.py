"""Reshapes around a matmul: a batched matmul of a constant matrix becomes `Reshape -> MatMul -> Reshape`, and two
Reshapes in a row become one.

Keras 3's EinsumDense (every projection of MultiHeadAttention) freezes, after Grappler's folding, to
`BatchMatMulV2(x, W)` of a rank-3 `x` and a constant matrix, often followed by a Reshape to heads and an `AddV2` of
a bias of shape (heads, head size). TensorFlow's remapper fuses no BatchMatMul with a BiasAdd; as a 2-D MatMul the
Dense rules (dense.py) can bring bias and activation next to it. Exact: a batched matmul with a broadcast matrix is
the matmul of the rows.
"""

from __future__ import annotations

import numpy as np

from .graph import FLOAT_TYPES, EditableGraph
from .record import Match
from .rows import ROWS_MARK
from .shape_math import constant_target

BATCH_MATMULS = ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def match_reshape_pair(graph: EditableGraph, reshape) -> Match | None:
    """`Reshape(Reshape(t))` whose inner Reshape nothing else reads; None otherwise (nothing to decline)."""
    inner = graph.producer(reshape.input[0])
    if inner is None or inner.op != "Reshape" or graph.is_kept(inner) or len(graph.readers(inner.name)) != 1:
        return None
    return Match(nodes={"inner": inner, "outer": reshape})


def rewrite_reshape_pair(graph: EditableGraph, match: Match) -> str:
    """The outer Reshape reads what the inner one read; the inner one goes."""
    inner, outer = match.nodes["inner"], match.nodes["outer"]
    graph.set_inputs(outer, [inner.input[0], outer.input[1]])
    graph.remove([inner.name])
    return f"merged Reshape '{inner.name}' into '{outer.name}'"


def match_static_reshape(graph: EditableGraph, reshape) -> Match | None:
    """A Reshape whose target is computed (Keras' `Shape -> Gather -> Prod -> Pack` of a Dense on 3-D inputs) but
    whose output shape TF's shape inference knows up to one dimension, or whose target shape_math evaluates to a
    constant up to the batch; None when the target is a constant, or when a FusedBatchNormV3's output is reshaped
    to another tensor's Shape: tf_keras's LayerNorm, `Reshape(FusedBatchNormV3(Reshape(x)), Shape(x)) * gamma +
    beta`, which TF's remapper fuses into _MklLayerNorm only where the output's shape is symbolically x's, unknown
    batch and all (a constant target with -1 gives the output a batch dimension of its own); None for residual.py's
    rows counted from another tensor's Shape, for the same reason."""
    if graph.constant(reshape.input[1]) is not None:
        return None
    shaped, normalized = graph.producer(reshape.input[1]), graph.producer(reshape.input[0])
    if shaped is not None and shaped.op == "Shape" and normalized is not None and normalized.op == "FusedBatchNormV3":
        return None
    if ROWS_MARK in reshape.input[1]:
        return None
    shape = graph.inferred_shape(reshape.name)
    if shape is not None and sum(d is None for d in shape) <= 1:
        return Match(nodes={"reshape": reshape}, values={"shape": [-1 if d is None else d for d in shape]})
    target = constant_target(graph, reshape.input[1])
    if target is None:
        return None  # nothing to say: most computed targets are computed because they must be
    return Match(nodes={"reshape": reshape}, values={"shape": target})


def rewrite_static_reshape(graph: EditableGraph, match: Match) -> str:
    """The target becomes a constant (-1 for the one unknown dimension); what computed it goes with the next
    clean-up when nothing else reads it."""
    reshape = match.nodes["reshape"]
    kind = np.int64 if reshape.attr["Tshape"].type == 9 else np.int32
    target = graph.add_constant(f"{reshape.name}/static_shape", np.array(match.values["shape"], kind), reshape.device)
    graph.set_inputs(reshape, [reshape.input[0], target.name])
    return f"'{reshape.name}' reshapes to the constant {match.values['shape']}"


def match_batch_matmul(graph: EditableGraph, node) -> Match | None:
    """A batched matmul of a tensor and a weight matrix (a constant, or a variable of known shape; not adjoint on
    the left)."""
    shape = graph.weight_shape(node.input[1]) if len(node.input) > 1 else None
    if shape is None or len(shape) != 2 or None in shape:
        return None
    if node.attr["adj_x"].b:
        return Match().fail("the left operand is adjoint")
    dtype = node.attr["T"].type if "T" in node.attr else node.attr["Ta"].type
    if dtype not in FLOAT_TYPES or "Tout" in node.attr and node.attr["Tout"].type != dtype:
        return Match().fail("not a float32 or bfloat16 matmul")
    if graph.is_kept(node):
        return Match().fail("the matmul is fetched (its op must stay)")
    inner, columns = (shape[1], shape[0]) if node.attr["adj_y"].b else (shape[0], shape[1])  # y is [K, N] or [N, K]
    return Match(nodes={"matmul": node}, values={"rows": inner, "columns": columns, "dtype": dtype})


def rewrite_batch_matmul(graph: EditableGraph, match: Match) -> str:
    """`Reshape(x, [-1, K]) -> MatMul -> Reshape(to x's shape with the last axis N)`, the last keeping the name."""
    node = match.nodes["matmul"]
    x, weight = node.input[0], node.input[1]
    dtype, columns, device = match.values["dtype"], match.values["columns"], node.device
    rows = graph.add_constant(f"{node.name}/rows_shape", np.array([-1, match.values["rows"]], np.int32), device)
    flat = graph.add_node(f"{node.name}/rows", "Reshape", [x, rows.name], device)
    _types(flat, T=dtype, Tshape=3)
    matmul = graph.add_node(f"{node.name}/matmul", "MatMul", [flat.name, weight], device)
    _types(matmul, T=dtype)
    matmul.attr["transpose_b"].b = node.attr["adj_y"].b
    shape = _output_shape(graph, node, x, -1, [columns])
    node.op = "Reshape"
    node.attr.clear()
    _types(node, T=dtype, Tshape=3)
    graph.set_inputs(node, [matmul.name, shape])
    return f"'{node.name}' is now Reshape -> MatMul -> Reshape"


def _output_shape(graph: EditableGraph, node, x: str, leading: int, tail: list) -> str:
    """A tensor holding x's first `leading` dimensions (all but the last when -1) followed by `tail`: a constant
    when x's shape is known up to one dimension (a Placeholder's shape, a Reshape's constant target), else computed
    from Shape(x)."""
    known = _static_shape(graph, x)
    if known is not None and sum(d < 0 for d in known[:leading]) <= 1:
        value = np.array(known[:leading] + list(tail), np.int32)
        return graph.add_constant(f"{node.name}/shape", value, node.device).name
    device = node.device
    shape = graph.add_node(f"{node.name}/input_shape", "Shape", [x], device)
    _types(shape, T=graph.nodes[node.name].attr["T"].type, out_type=3)
    consts = [graph.add_constant(f"{node.name}/{n}", np.array(v, np.int32), device).name
              for n, v in (("begin", [0]), ("end", [leading]), ("stride", [1]), ("tail", list(tail)), ("axis", 0))]
    first = graph.add_node(f"{node.name}/leading_dims", "StridedSlice", [shape.name, *consts[:3]], device)
    _types(first, T=3, Index=3)
    joined = graph.add_node(f"{node.name}/output_shape", "ConcatV2", [first.name, consts[3], consts[4]], device)
    _types(joined, T=3, Tidx=3)
    joined.attr["N"].i = 2
    return joined.name


def match_einsum(graph: EditableGraph, node) -> Match | None:
    """An Einsum of a tensor and a weight (a constant, or a variable of known shape) that is a plain dense
    contraction: `FK,KO->FO` (tf_keras' EinsumDense, MultiHeadAttention's projections)."""
    shape = graph.weight_shape(node.input[1]) if len(graph.data_inputs(node)) == 2 else None
    if shape is None or None in shape:
        return None
    equation = node.attr["equation"].s.decode().replace(" ", "")
    split = _dense_equation(equation)
    if split is None:
        return Match().fail(f"equation '{equation}' is not a dense contraction of the input's last axes "
                            "with the weight's first axes")
    if node.attr["T"].type not in FLOAT_TYPES or graph.is_kept(node):
        return Match().fail("not a float32 or bfloat16 Einsum, or fetched")
    free, contracted, out = split
    if len(shape) != len(contracted) + len(out):
        return Match().fail(f"the weight has rank {len(shape)}, the equation says {len(contracted) + len(out)}")
    rows = int(np.prod(shape[:len(contracted)]))
    return Match(nodes={"einsum": node}, values={"free": len(free), "rows": rows, "tail": list(shape[len(contracted):]),
                                                 "columns": int(np.prod(shape[len(contracted):]))})


def _dense_equation(equation: str):
    """(free, contracted, output letters) of 'FK,KO->FO' with distinct letters, or None."""
    if "..." in equation or "->" not in equation or equation.count(",") != 1:
        return None
    inputs, out = equation.split("->")
    lhs, rhs = inputs.split(",")
    contracted = [c for c in lhs if c in rhs and c not in out]
    free, tail = lhs[:len(lhs) - len(contracted)], rhs[len(contracted):]
    letters = lhs + tail
    if (lhs != free + "".join(contracted) or rhs != "".join(contracted) + tail or out != free + tail
            or len(set(letters)) != len(letters) or not contracted or not tail):
        return None
    return free, contracted, tail


def rewrite_einsum(graph: EditableGraph, match: Match) -> str:
    """`Reshape(x, [-1, K]) -> MatMul(weight as a K x O matrix) -> Reshape(F + O dims)`, the last keeping the name.
    A constant weight is stored as the matrix; a variable's is reshaped to it (a Reshape moves no data)."""
    node = match.nodes["einsum"]
    x, dtype, device = node.input[0], node.attr["T"].type, node.device
    weight, shape = node.input[1], (match.values["rows"], match.values["columns"])
    value = graph.constant(weight)
    if value is not None:
        matrix = graph.add_constant(f"{node.name}/matrix", value.reshape(shape), device)
    else:
        target = graph.add_constant(f"{node.name}/matrix_shape", np.array(shape, np.int32), device)
        matrix = graph.add_node(f"{node.name}/matrix", "Reshape", [weight, target.name], device)
        _types(matrix, T=dtype, Tshape=3)
    rows = graph.add_constant(f"{node.name}/rows_shape", np.array([-1, match.values["rows"]], np.int32), device)
    flat = graph.add_node(f"{node.name}/rows", "Reshape", [x, rows.name], device)
    _types(flat, T=dtype, Tshape=3)
    matmul = graph.add_node(f"{node.name}/matmul", "MatMul", [flat.name, matrix.name], device)
    _types(matmul, T=dtype)
    shape = _output_shape(graph, node, x, match.values["free"], match.values["tail"])
    node.op = "Reshape"
    node.attr.clear()
    _types(node, T=dtype, Tshape=3)
    graph.set_inputs(node, [matmul.name, shape])
    return f"'{node.name}' is now Reshape -> MatMul -> Reshape"


def _static_shape(graph: EditableGraph, tensor: str) -> list | None:
    """The shape of `tensor` when a Placeholder or a Reshape with a constant target states it, else as TF's shape
    inference gives it (-1: unknown)."""
    node = graph.producer(tensor)
    if node is not None and node.op == "Placeholder" and not node.attr["shape"].shape.unknown_rank:
        return [d.size for d in node.attr["shape"].shape.dim]
    if node is not None and node.op == "Reshape":
        value = graph.constant(node.input[1])
        if value is not None and value.ndim == 1:
            return [int(v) for v in value]
    inferred = graph.inferred_shape(tensor)
    return None if inferred is None else [-1 if d is None else d for d in inferred]


def _types(node, **types) -> None:
    for key, value in types.items():
        node.attr[key].type = value
