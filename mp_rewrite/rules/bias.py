"""`bias_add`: an Add of a per-channel bias right after a MatMul or an NHWC Conv2D becomes a BiasAdd, the op
TensorFlow's remapper fuses into `_FusedMatMul` / `_FusedConv2D` (it never fuses an Add as the bias). The bias is a
constant, or a weight of shape [channels] that is not one (a TF1 graph's `tf.matmul(x, w) + b` of variables). Exact:
both add the same value to every element of a channel."""

from __future__ import annotations

import numpy as np

from .graph import FLOAT_TYPES, EditableGraph
from .record import Match

CONTRACTIONS = {"MatMul": 2, "Conv2D": 4}  # op -> output rank


def contraction_channels(graph: EditableGraph, node) -> int | None:
    """Output channels of a MatMul or NHWC Conv2D whose weight's shape is known (a constant, or a weight given a
    shape: `EditableGraph.weight_shape`), else None."""
    shape = graph.weight_shape(node.input[1]) if len(node.input) > 1 else None
    if shape is None or len(shape) != CONTRACTIONS[node.op] or None in shape:
        return None
    if node.op == "MatMul":
        return shape[0] if node.attr["transpose_b"].b else shape[1]
    return shape[3] if node.attr["data_format"].s in (b"", b"NHWC") else None


def match_bias_add(graph: EditableGraph, add) -> Match | None:
    """`Add(contraction, bias)`; declined unless the bias is one value per output channel."""
    inputs = graph.data_inputs(add)
    if len(inputs) != 2:
        return None
    for data, other in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        contraction = graph.producer(data)
        if contraction is None or contraction.op not in CONTRACTIONS:
            continue
        if graph.constant(other) is not None:
            return _checked(graph, add, contraction, graph.constant(other))
        shape = graph.weight_shape(other)
        if shape is not None:
            return _checked_weight(graph, add, contraction, other, shape)
    return None


def _checked_weight(graph: EditableGraph, add, contraction, weight: str, shape: tuple) -> Match:
    """A bias that is not a constant: exactly [channels] (a weight of another shape would need a Reshape)."""
    match = _fusable(graph, contraction)
    if not match.ok:
        return match
    channels = contraction_channels(graph, contraction)
    if tuple(shape) != (channels,):
        return Match().fail(f"the weight '{weight}' of shape {tuple(shape)} is not one value per channel of "
                            f"{channels}")
    return Match(nodes={"contraction": contraction, "add": add}, values={"weight": weight})


def _fusable(graph: EditableGraph, contraction) -> Match:
    """A match to go on from (ok), or why the contraction cannot take a bias."""
    if contraction.attr["T"].type not in FLOAT_TYPES:
        return Match().fail("the contraction is not float32 or bfloat16 (the CPU remapper fuses only those)")
    if len(graph.readers(contraction.name)) != 1 or graph.is_kept(contraction):
        return Match().fail(f"'{contraction.name}' is read by {len(graph.readers(contraction.name))} nodes or "
                            "fetched, so it cannot fuse with the add")
    if contraction_channels(graph, contraction) is None:
        return Match().fail(f"the {contraction.op}'s weight has no known shape (or is not NHWC): channels unknown")
    return Match()


def _checked(graph: EditableGraph, add, contraction, value: np.ndarray) -> Match:
    match = _fusable(graph, contraction)
    if not match.ok:
        return match
    channels = contraction_channels(graph, contraction)
    if value.ndim > CONTRACTIONS[contraction.op] or value.size not in (1, channels) or \
            value.size == channels and value.shape[-1] != channels:
        return Match().fail(f"the constant of shape {tuple(value.shape)} is not one value per channel of "
                            f"{channels} (it would differ along another axis or broadcast the output)")
    bias = np.broadcast_to(value.reshape(-1), (channels,)).astype(value.dtype)
    return Match(nodes={"contraction": contraction, "add": add}, values={"bias": bias})


def rewrite_bias_add(graph: EditableGraph, match: Match) -> str:
    """The Add becomes `BiasAdd(contraction, the constant as a vector)` under its own name."""
    add, contraction = match.nodes["add"], match.nodes["contraction"]
    bias = match.values.get("weight") or graph.add_constant(f"{add.name}/bias", match.values["bias"], add.device).name
    dtype = add.attr["T"].type
    add.op = "BiasAdd"
    add.attr.clear()
    add.attr["T"].type = dtype
    add.attr["data_format"].s = b"NHWC"
    graph.set_inputs(add, [contraction.name, bias])
    return f"'{add.name}' is now a BiasAdd"
