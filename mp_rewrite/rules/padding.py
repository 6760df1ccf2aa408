"""`explicit_padding`: `Pad -> Conv2D | DepthwiseConv2dNative (padding VALID)` becomes the convolution alone, padding
as it reads: `padding="SAME"` where the Pad adds exactly what SAME would, else (Conv2D only) `padding="EXPLICIT"` with
the Pad's amounts as its `explicit_paddings`.

Keras writes `ZeroPadding2D` before every stride-2 convolution of MobileNetV2, EfficientNet and ResNet's stem, and
TF runs the Pad as its own kernel (a copy of the whole activation) before the convolution. Keras applications pad
with `correct_pad`, which is SAME's padding for the input's size. Exact: the padded values are the same zeros.

TF 2.21 aborts the process (CHECK failure in tensor_format.h, "Invalid index from the dimension: 1, 0, H") when it
runs a DepthwiseConv2dNative with `padding="EXPLICIT"`, oneDNN on; so a depthwise convolution takes SAME or nothing.
"""

from __future__ import annotations

import numpy as np

from .graph import FLOAT_TYPES, EditableGraph
from .record import Match

CONVOLUTIONS = ("Conv2D", "DepthwiseConv2dNative")


def match_explicit_padding(graph: EditableGraph, conv) -> Match | None:
    """A VALID NHWC convolution whose input is a zero Pad of its spatial axes only; None when it is not there. The
    Match's values: the Pad's "amounts" (8 numbers) and the "padding" the convolution takes (SAME or EXPLICIT)."""
    pad = graph.producer(conv.input[0])
    if pad is None or pad.op not in ("Pad", "PadV2") or conv.attr["padding"].s != b"VALID":
        return None
    if conv.attr["T"].type not in FLOAT_TYPES or conv.attr["data_format"].s not in (b"", b"NHWC"):
        return Match().fail(f"'{conv.name}' is not a float NHWC convolution")
    amounts = graph.constant(pad.input[1])
    if amounts is None or amounts.shape != (4, 2):
        return Match().fail(f"the padding of '{pad.name}' is not a constant 4x2 table")
    if amounts[0].any() or amounts[3].any() or (amounts < 0).any():
        return Match().fail(f"'{pad.name}' pads the batch or channel axis")
    if pad.op == "PadV2":
        value = graph.constant(pad.input[2])
        if value is None or np.any(value != 0):
            return Match().fail(f"'{pad.name}' pads with a value other than 0")
    if graph.is_kept(pad) or any(r.op not in CONVOLUTIONS or r.attr["padding"].s != b"VALID"
                                 for r in graph.readers(pad.name)):
        return Match().fail(f"'{pad.name}' is also read by something other than a VALID convolution")
    flat = [int(v) for v in amounts.reshape(-1)]
    if flat[2:6] == _same_padding(graph, pad, conv):
        return Match(nodes={"pad": pad, "conv": conv}, values={"amounts": flat, "padding": b"SAME"})
    if conv.op == "DepthwiseConv2dNative":
        return Match().fail(f"'{pad.name}' is not SAME's padding, and TF 2.21 aborts on a depthwise convolution "
                            "with explicit padding")
    return Match(nodes={"pad": pad, "conv": conv}, values={"amounts": flat, "padding": b"EXPLICIT"})


def _same_padding(graph: EditableGraph, pad, conv) -> list | None:
    """[top, bottom, left, right] that padding SAME adds for the Pad's input, or None when its size is unknown."""
    shape, kernel = graph.inferred_shape(pad.input[0]), graph.weight_shape(conv.input[1])
    if shape is None or kernel is None or len(shape) != 4 or None in shape[1:3]:
        return None
    amounts = []
    for axis in (1, 2):
        size, stride, dilation = shape[axis], conv.attr["strides"].list.i[axis], conv.attr["dilations"].list.i
        dilation = dilation[axis] if dilation else 1
        out = -(-size // stride)
        total = max((out - 1) * stride + (kernel[axis - 1] - 1) * dilation + 1 - size, 0)
        amounts += [total // 2, total - total // 2]
    return amounts


def rewrite_explicit_padding(graph: EditableGraph, match: Match) -> str:
    """Read the Pad's input directly with the Pad's amounts as explicit padding; drop the Pad if nothing reads it."""
    pad, conv = match.nodes["pad"], match.nodes["conv"]
    graph.set_inputs(conv, [pad.input[0]] + list(graph.data_inputs(conv)[1:]))
    conv.attr["padding"].s = match.values["padding"]
    del conv.attr["explicit_paddings"].list.i[:]
    if match.values["padding"] == b"EXPLICIT":
        conv.attr["explicit_paddings"].list.i.extend(match.values["amounts"])
    if not graph.readers(pad.name) and not any(f"^{pad.name}" in n.input for n in graph.graph_def.node):
        graph.remove([pad.name])
    return (f"'{conv.name}' pads {match.values['amounts'][2:6]} itself (padding {match.values['padding'].decode()});"
            f" the Pad '{pad.name}' is gone")
