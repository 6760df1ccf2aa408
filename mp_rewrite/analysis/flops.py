"""Matmul and convolution FLOPs from tensor shapes: how much of a model's heavy compute runs in low precision.

Shapes come from mp_rewrite.shapes (TensorFlow's shape inference, function bodies shaped by their callers).
FLOPs count a multiply-add as 2, per run of the graph as it is (a loop body counts once). An unknown leading
(batch) dimension of the inputs counts as `batch` (1 by default, so the numbers are per example); any other
unknown dimension a formula needs leaves the node's FLOPs unknown (None).
"""

from __future__ import annotations

import dataclasses
import math

from tensorflow.core.framework import graph_pb2

from ..core.graph_view import parse_input
from .shapes import Shape, node_shapes, result_shapes

__all__ = ["FLOP_RULES", "FlopShare", "compute_dtype", "flops_by_node", "low_precision_flop_share", "node_shapes",
           "result_flops", "result_shapes"]


def _flag(node, name: str) -> bool:
    value = node.attr.get(name)
    return value is not None and value.b


def _known(*dims) -> bool:
    return all(d is not None for d in dims)


def _batch(shape: Shape, batch: int) -> Shape:
    """The shape with an unknown leading (batch) dimension taken as `batch`."""
    return shape if not shape or shape[0] is not None else (batch,) + shape[1:]


def _prod(dims) -> int | None:
    return math.prod(dims) if _known(*dims) else None


def _matmul(node, ins, outs, batch):
    a, out = ins[0], outs[0]
    if a is None or out is None or len(a) != 2:
        return None
    a = _batch(a, batch)
    k = a[0] if _flag(node, "transpose_a") else a[1]
    m = a[1] if _flag(node, "transpose_a") else a[0]
    b = ins[1] if len(ins) > 1 else None
    if k is None and b is not None and len(b) == 2:
        k = b[1] if _flag(node, "transpose_b") else b[0]
    return 2 * m * out[1] * k if _known(m, out[1], k) else None


def _batch_matmul(node, ins, outs, batch):
    x, out = ins[0], outs[0]
    if x is None or out is None or len(x) < 2:
        return None
    adjoint = _flag(node, "adj_x")
    k = x[-2] if adjoint else x[-1]
    size = _prod(_batch(out, batch))
    return 2 * size * k if _known(size, k) else None


def _conv(spatial: int, filter_input: int, out_index: int | None, depthwise: bool = False):
    """FLOPs of a convolution or its backprop: 2 * |output-side activation| * kernel volume * in-channels per
    group. `filter_input` is the input holding the filter (or None: the filter is this node's output);
    `out_index` is the input holding the activation whose size counts (None: this node's output)."""
    def flops(node, ins, outs, batch):
        filt = ins[filter_input] if filter_input is not None else outs[0]
        act = ins[out_index] if out_index is not None else outs[0]
        if filt is None or act is None or len(filt) != spatial + 2:
            return None
        per_output = _prod(filt[:spatial]) if depthwise else _prod(filt[:spatial + 1])
        size = _prod(_batch(act, batch))  # a depthwise activation already counts every (channel, multiplier)
        return 2 * size * per_output if _known(size, per_output) else None
    return flops


def _einsum(node, ins, outs, batch):
    value = node.attr.get("equation")
    equation = "" if value is None else value.s.decode().replace(" ", "")
    if "->" not in equation or outs[0] is None:
        return None
    lhs, rhs = equation.split("->")
    sizes = {}
    for spec, shape in zip(lhs.split(","), ins):
        if shape is None:
            return None
        head, _, tail = spec.partition("...")
        pairs = list(zip(head, shape[:len(head)], range(len(head))))
        pairs += zip(tail[::-1], shape[::-1], [1] * len(tail))
        for letter, dim, pos in pairs:
            dim = batch if dim is None and pos == 0 else dim
            if dim is not None:
                sizes[letter] = max(sizes.get(letter, 1), dim)
    contracted = set(lhs) - set(rhs) - {",", "."}
    if any(c not in sizes for c in contracted):
        return None
    output_size = _prod(_batch(outs[0], batch))
    return None if output_size is None else 2 * output_size * math.prod(sizes[c] for c in contracted)


# op -> FLOPs(node, input shapes, output shapes, batch). Backprop ops count like their forward op.
FLOP_RULES = {
    "MatMul": _matmul, "_FusedMatMul": _matmul,
    "BatchMatMul": _batch_matmul, "BatchMatMulV2": _batch_matmul, "BatchMatMulV3": _batch_matmul,
    "Einsum": _einsum,
    "Conv2D": _conv(2, 1, None), "_FusedConv2D": _conv(2, 1, None),
    "Conv2DBackpropInput": _conv(2, 1, 2), "Conv2DBackpropInputV2": _conv(2, 1, 2),
    "Conv2DBackpropFilter": _conv(2, None, 2), "Conv2DBackpropFilterV2": _conv(2, None, 2),
    "Conv3D": _conv(3, 1, None),
    "Conv3DBackpropInput": _conv(3, 1, 2), "Conv3DBackpropInputV2": _conv(3, 1, 2),
    "Conv3DBackpropFilter": _conv(3, None, 2), "Conv3DBackpropFilterV2": _conv(3, None, 2),
    "DepthwiseConv2dNative": _conv(2, 1, None, depthwise=True),
    "DepthwiseConv2dNativeBackpropInput": _conv(2, 1, 2, depthwise=True),
    "DepthwiseConv2dNativeBackpropFilter": _conv(2, None, 2, depthwise=True),
}


def _input_shapes(node, shapes: dict) -> list:
    result = []
    for text in node.input:
        if text.startswith("^"):
            continue
        src, port = parse_input(text)
        outs = shapes.get(src) or []
        result.append(outs[port] if port < len(outs) else None)
    return result


def flops_by_node(graph_def: graph_pb2.GraphDef, shapes: dict, batch: int = 1) -> dict:
    """Return {node name: FLOPs (int) or None when its shapes are not known} for every matmul/conv node.

    Args:
        graph_def: the graph (or function body) whose nodes to count.
        shapes: node_shapes(graph_def) (or any {node: [shape per output]}).
        batch: the value of an unknown leading (batch) dimension.
    """
    result = {}
    for node in graph_def.node:
        rule = FLOP_RULES.get(node.op)
        if rule is None:
            continue
        ins, outs = _input_shapes(node, shapes), shapes.get(node.name) or [None]
        try:
            result[node.name] = rule(node, ins, outs, batch)
        except (IndexError, ValueError):
            result[node.name] = None
    return result


# --------------------------------------------------------------------------------------------- a whole rewrite


@dataclasses.dataclass(frozen=True)
class FlopShare:
    """Matmul/conv FLOPs of a rewrite, in low precision and in total (nodes with unknown shapes not counted).

    Attributes:
        low: FLOPs of the matmul/conv nodes that compute in float16/bfloat16 after the rewrite.
        total: FLOPs of every floating-point matmul/conv node whose shapes are known.
        unknown: how many float matmul/conv nodes have FLOPs that shapes could not give.
        nodes: how many float matmul/conv nodes there are.
    """

    low: int
    total: int
    unknown: int = 0
    nodes: int = 0

    @property
    def share(self) -> float | None:
        """low / total, or None when no FLOPs are known."""
        return self.low / self.total if self.total else None


def result_flops(result, batch: int = 1) -> dict:
    """{graph: {node: FLOPs or None}} for the matmul/conv nodes of a RewriteResult and its functions."""
    shapes = result_shapes(result, batch, FLOP_RULES)
    graphs = {"": result.graph_def, **{name: sub.graph_def for name, sub in result.functions.items()}}
    return {graph: flops_by_node(gd, shapes[graph], batch) for graph, gd in graphs.items()}


LOW_DTYPES = ("half", "bfloat16")
COUNTED_DTYPES = ("float", "half", "bfloat16")


def compute_dtype(result, node: str) -> str | None:
    """The dtype a node computes in after the rewrite: its "T" attribute (else its first type attribute)."""
    decisions = result.coloring.for_node(node)
    chosen = next((d for d in decisions if d.attr == "T"), decisions[0] if decisions else None)
    return None if chosen is None else chosen.dtype_after


def low_precision_flop_share(result, flops: dict | None = None) -> FlopShare:
    """FLOPs of the matmul/conv nodes that compute in low precision after the rewrite, against those of every
    floating-point (float32, float16, bfloat16) matmul/conv node, over the main graph and every rewritten function.

    Args:
        result: a RewriteResult.
        flops: result_flops(result), if already computed.
    """
    flops = result_flops(result) if flops is None else flops
    low = total = unknown = nodes = 0
    for graph, per_node in flops.items():
        sub = result if graph == "" else result.functions[graph]
        for node, value in per_node.items():
            dtype = compute_dtype(sub, node)
            if dtype not in COUNTED_DTYPES:
                continue
            nodes += 1
            if value is None:
                unknown += 1
                continue
            total += value
            low += value if dtype in LOW_DTYPES else 0
    return FlopShare(low, total, unknown, nodes)


def estimate_flops(graphs: dict) -> tuple:
    """FLOPs from known shapes: (FlopShare over every rewritten graph and function, {function name: FlopShare},
    {MetaGraph tags: FlopShare of the main graph})."""
    low = total = unknown = nodes = 0
    per_function, per_graph, seen = {}, {}, {}
    for tags, result in graphs.items():
        if id(result) in seen:  # a graph frozen for two signatures (Keras' serve, serving_default) counts once
            per_graph[tags] = per_graph[seen[id(result)]]
            continue
        seen[id(result)] = tags
        flops = result_flops(result)
        share = low_precision_flop_share(result, flops)
        low, total, unknown, nodes = low + share.low, total + share.total, unknown + share.unknown, nodes + share.nodes
        per_graph[tags] = low_precision_flop_share(result, {"": flops.get("", {})})
        for name, sub in result.functions.items():
            per_function[name] = low_precision_flop_share(sub, {"": flops.get(name, {})})
    return FlopShare(low, total, unknown, nodes), per_function, per_graph
