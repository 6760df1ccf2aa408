"""`bias_add`: an Add of a per-channel constant right after a MatMul or an NHWC Conv2D becomes a BiasAdd, the op
TensorFlow's remapper fuses into `_FusedMatMul` / `_FusedConv2D` (it never fuses an Add as the bias). Exact: both
add the same value to every element of a channel."""

from __future__ import annotations

import numpy as np

from .graph import FLOAT_TYPES, EditableGraph
from .record import Match

CONTRACTIONS = {"MatMul": 2, "Conv2D": 4}  # op -> output rank


def contraction_channels(graph: EditableGraph, node) -> int | None:
    """Output channels of a MatMul or NHWC Conv2D with a constant weight, else None."""
    weight = graph.constant(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim != CONTRACTIONS[node.op]:
        return None
    if node.op == "MatMul":
        return weight.shape[0] if node.attr["transpose_b"].b else weight.shape[1]
    return weight.shape[3] if node.attr["data_format"].s in (b"", b"NHWC") else None


def match_bias_add(graph: EditableGraph, add) -> Match | None:
    """`Add(contraction, constant)`; declined unless the constant is one value per output channel."""
    inputs = graph.data_inputs(add)
    if len(inputs) != 2:
        return None
    for data, other in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        contraction = graph.producer(data)
        if contraction is not None and contraction.op in CONTRACTIONS and graph.constant(other) is not None:
            return _checked(graph, add, contraction, graph.constant(other))
    return None


def _checked(graph: EditableGraph, add, contraction, value: np.ndarray) -> Match:
    if contraction.attr["T"].type not in FLOAT_TYPES:
        return Match().fail("the contraction is not float32 or bfloat16 (the CPU remapper fuses only those)")
    if len(graph.readers(contraction.name)) != 1 or graph.is_kept(contraction):
        return Match().fail(f"'{contraction.name}' is read by {len(graph.readers(contraction.name))} nodes or "
                            "fetched, so it cannot fuse with the add")
    channels = contraction_channels(graph, contraction)
    if channels is None:
        return Match().fail(f"the {contraction.op}'s weight is not a constant (or not NHWC): channels unknown")
    if value.ndim > CONTRACTIONS[contraction.op] or value.size not in (1, channels) or \
            value.size == channels and value.shape[-1] != channels:
        return Match().fail(f"the constant of shape {tuple(value.shape)} is not one value per channel of "
                            f"{channels} (it would differ along another axis or broadcast the output)")
    bias = np.broadcast_to(value.reshape(-1), (channels,)).astype(value.dtype)
    return Match(nodes={"contraction": contraction, "add": add}, values={"bias": bias})


def rewrite_bias_add(graph: EditableGraph, match: Match) -> str:
    """The Add becomes `BiasAdd(contraction, the constant as a vector)` under its own name."""
    add, contraction = match.nodes["add"], match.nodes["contraction"]
    bias = graph.add_constant(f"{add.name}/bias", match.values["bias"], add.device)
    dtype = add.attr["T"].type
    add.op = "BiasAdd"
    add.attr.clear()
    add.attr["T"].type = dtype
    add.attr["data_format"].s = b"NHWC"
    graph.set_inputs(add, [contraction.name, bias.name])
    return f"'{add.name}' is now a BiasAdd"
