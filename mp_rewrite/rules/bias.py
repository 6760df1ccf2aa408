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
        contraction, shape = graph.producer(data), graph.weight_shape(other)
        if contraction is None or contraction.op not in CONTRACTIONS or shape is None:
            continue
        channels, value = contraction_channels(graph, contraction), graph.constant(other)
        if contraction.attr["T"].type not in FLOAT_TYPES:
            return Match().fail("the contraction is not float32 or bfloat16 (the CPU remapper fuses only those)")
        if len(graph.readers(contraction.name)) != 1 or graph.is_kept(contraction):
            return Match().fail(f"'{contraction.name}' is read by {len(graph.readers(contraction.name))} nodes or "
                                "fetched, so it cannot fuse with the add")
        if channels is None:
            return Match().fail(f"the {contraction.op}'s weight has no known shape (or is not NHWC): channels "
                                "unknown")
        nodes = {"contraction": contraction, "add": add}
        if value is None:  # a weight that is not a constant: exactly [channels] (another shape needs a Reshape)
            if tuple(shape) != (channels,):
                return Match().fail(f"the weight '{other}' of shape {tuple(shape)} is not one value per channel "
                                    f"of {channels}")
            return Match(nodes=nodes, values={"weight": other})
        if value.ndim > CONTRACTIONS[contraction.op] or value.size not in (1, channels) or \
                value.size == channels and value.shape[-1] != channels:
            return Match().fail(f"the constant of shape {tuple(value.shape)} is not one value per channel of "
                                f"{channels} (it would differ along another axis or broadcast the output)")
        bias = np.broadcast_to(value.reshape(-1), (channels,)).astype(value.dtype)
        return Match(nodes=nodes, values={"bias": bias})
    return None


def rewrite_bias_add(graph: EditableGraph, match: Match) -> str:
    """The Add becomes `BiasAdd(contraction, the constant as a vector, or the weight)` under its own name."""
    add, contraction = match.nodes["add"], match.nodes["contraction"]
    bias = match.values.get("weight") or graph.add_constant(f"{add.name}/bias", match.values["bias"], add.device).name
    dtype = add.attr["T"].type
    add.op = "BiasAdd"
    add.attr.clear()
    add.attr["T"].type = dtype
    add.attr["data_format"].s = b"NHWC"
    graph.set_inputs(add, [contraction.name, bias])
    return f"'{add.name}' is now a BiasAdd"
