"""`scale_into_weights`: a scalar Mul of what a projection computes linearly becomes part of the projection's
weights: `c * f(MatMul(x, W) + b)` for a linear f (Reshape, Transpose, one operand of an Einsum or BatchMatMul) is
`f(MatMul(x, c W) + c b)`.

Keras 3's MultiHeadAttention scales the attention scores, `Mul(Einsum(query, key), 1/sqrt(head size))`: on a CPU
that Mul is a pass over the [batch, heads, T, S] scores (in bfloat16, TF runs it through Eigen, slower than float32),
where the same factor folded into the query projection's weights costs nothing at run time. Exact up to float32
round-off (the factor multiplies the weights instead of the products).
"""

from __future__ import annotations

import numpy as np

from .graph import EditableGraph
from .record import Match

BILINEAR = ("Einsum", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
LINEAR = ("Reshape", "Transpose", "Identity")


def match_scale_into_weights(graph: EditableGraph, mul) -> Match | None:
    """`Mul(t, scalar constant)` where t is, through linear ops only it reads, a MatMul of a constant weight (and
    its constant bias); None when it is not."""
    inputs = graph.data_inputs(mul)
    if len(inputs) != 2 or graph.is_kept(mul):
        return None
    for data, other in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        factor = graph.constant(other)
        if factor is None or factor.size != 1 or not np.issubdtype(factor.dtype, np.floating):
            continue
        producer = graph.producer(data)
        if producer is None or graph.is_kept(producer) or len(graph.readers(producer.name)) != 1:
            continue
        starts = graph.data_inputs(producer) if producer.op in BILINEAR else [data]
        found_all = [_projection(graph, start) for start in starts]
        for found in found_all:
            # one factor per product: a projection on both sides (einsum(q, q)) would be scaled twice
            if found is not None and [f[0] for f in found_all if f is not None].count(found[0]) == 1:
                matmul, bias = found
                if graph.control_readers(mul.name):
                    return Match().fail(f"'{mul.name}' orders other nodes by a control dependency")
                return Match(nodes={"mul": mul, "matmul": matmul} | ({"bias": bias} if bias is not None else {}),
                             values={"factor": float(factor.reshape(())), "data": data})
    return None


def _projection(graph: EditableGraph, tensor: str):
    """(MatMul, its BiasAdd or None) when `tensor` is, through single-reader linear ops, a MatMul of a constant
    weight (plus a constant bias); else None."""
    node = graph.producer(tensor)
    while node is not None and node.op in LINEAR and len(graph.readers(node.name)) == 1 and not graph.is_kept(node):
        node = graph.producer(node.input[0])
    bias = None
    if node is not None and node.op == "BiasAdd" and graph.constant(node.input[1]) is not None:
        bias, node = node, graph.producer(node.input[0])
    if node is None or node.op != "MatMul" or graph.constant(node.input[1]) is None:
        return None
    if any(len(graph.readers(n.name)) != 1 or graph.is_kept(n) for n in (node, bias) if n is not None):
        return None
    return node, bias


def rewrite_scale_into_weights(graph: EditableGraph, match: Match) -> str:
    """New constants `factor * W` (and `factor * b`) for the projection; the Mul's readers read what it scaled."""
    mul, matmul, factor = match.nodes["mul"], match.nodes["matmul"], match.values["factor"]
    for node, port, role in ((matmul, 1, "weight"), (match.nodes.get("bias"), 1, "bias")):
        if node is None:
            continue
        value = graph.constant(node.input[port])
        scaled = graph.add_constant(f"{node.name}/scaled_{role}", (value.astype(np.float64) * factor).astype(
            value.dtype), node.device)
        inputs = graph.data_inputs(node)
        inputs[port] = scaled.name
        graph.set_inputs(node, inputs)
    for reader in graph.readers(mul.name):
        graph.set_inputs(reader, [match.values["data"] if t == mul.name or t == f"{mul.name}:0" else t
                                  for t in graph.data_inputs(reader)])
    graph.remove([mul.name])
    return f"the factor {factor:.6g} of '{mul.name}' is in the weights of '{matmul.name}'"
