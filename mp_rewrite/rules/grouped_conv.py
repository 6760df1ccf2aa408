"""`grouped_conv`: a grouped convolution Keras 3 hands to XLA becomes TensorFlow's native kernels.

TF's CPU Conv2D kernel has no groups, so Keras 3's TensorFlow backend compiles `Conv2D(groups > 1)` as a function
marked `_XlaMustCompile` (`_conv_xla`), called through a StatefulPartitionedCall: XLA at every call, in float32
(the precision pass does not enter it), and nothing fuses with it. ConvNeXt writes its depthwise convolutions so.
When groups equal the input channels, the call is a DepthwiseConv2dNative (its filter [kh, kw, 1, C*M] reshaped to
[kh, kw, C, M]: the same values in the same order); otherwise a Split of the channels, one Conv2D per group and a
Concat. Either is TF's own oneDNN kernel, which fuses with the bias and activation after it and runs in bfloat16.
"""

from __future__ import annotations

import numpy as np

from .graph import FLOAT_TYPES, EditableGraph, node_name
from .record import Match

CALLS = ("StatefulPartitionedCall", "PartitionedCall")
MAX_GROUPS = 64  # beyond this, one Conv2D per group is more kernel launches than it is worth


def match_grouped_conv(graph: EditableGraph, call) -> Match | None:
    """A call of a function whose body is one grouped Conv2D of the call's two inputs (a constant filter and x)."""
    function = _function(graph, call.attr["f"].func.name)
    conv = _sole_conv(function) if function is not None else None
    if conv is None:
        return None
    args = [arg.name for arg in function.signature.input_arg]
    inputs = [_argument(function, t) for t in conv.input if not t.startswith("^")]
    if len(inputs) != 2 or None in inputs or len(args) != len(graph.data_inputs(call)):
        return None
    x, kernel = (graph.data_inputs(call)[args.index(name)] for name in inputs)
    weights, shape = graph.constant(kernel), graph.inferred_shape(x)
    if weights is None or weights.ndim != 4 or shape is None or len(shape) != 4 or shape[3] is None:
        return Match().fail(f"the grouped convolution in '{call.name}' has no constant filter or known channels")
    if conv.attr["T"].type not in FLOAT_TYPES or conv.attr["data_format"].s not in (b"", b"NHWC"):
        return Match().fail(f"the convolution in '{call.name}' is not a float NHWC one")
    channels, per_group, out = shape[3], weights.shape[2], weights.shape[3]
    groups = channels // per_group
    if groups < 2 or channels % per_group or out % groups:
        return None
    depthwise = per_group == 1
    if depthwise and conv.attr["padding"].s == b"EXPLICIT":
        return Match().fail(f"'{call.name}' pads explicitly, and TF 2.21 aborts on a depthwise convolution that does")
    if not depthwise and groups > MAX_GROUPS:
        return Match().fail(f"'{call.name}' has {groups} groups of {per_group} channels (> {MAX_GROUPS} Conv2Ds)")
    return Match(nodes={"call": call}, values={"conv": conv, "x": x, "weights": weights, "groups": groups,
                                               "function": function.signature.name, "depthwise": depthwise})


def _function(graph: EditableGraph, name: str):
    return next((f for f in graph.graph_def.library.function if f.signature.name == name), None)


def _sole_conv(function):
    """The body's one Conv2D when everything else is an Identity or a NoOp and the one output is the Conv2D's."""
    computing = [n for n in function.node_def if n.op not in ("Identity", "NoOp")]
    if len(computing) != 1 or computing[0].op != "Conv2D" or len(function.ret) != 1:
        return None
    conv = computing[0]
    return conv if _source(function, next(iter(function.ret.values()))) == conv.name else None


def _argument(function, tensor: str) -> str | None:
    """The function argument an input of the body reads, through Identities, or None."""
    source = _source(function, tensor)
    return source if source in {a.name for a in function.signature.input_arg} else None


def _source(function, tensor: str) -> str:
    """The name of the body's node or argument behind `tensor`, looking through Identities."""
    nodes = {n.name: n for n in function.node_def}
    while node_name(tensor) in nodes and nodes[node_name(tensor)].op == "Identity":
        tensor = nodes[node_name(tensor)].input[0]
    return node_name(tensor)


def rewrite_grouped_conv(graph: EditableGraph, match: Match) -> str:
    """Replace the call by native kernels under its name; drop the function when nothing else calls it."""
    call, conv, x, weights, groups = (match.nodes["call"], match.values["conv"], match.values["x"],
                                      match.values["weights"], match.values["groups"])
    name, device = call.name, call.device
    graph.remove([name])  # its readers will read the replacement, which takes its name
    if match.values["depthwise"]:
        kh, kw, _, out = weights.shape
        filt = graph.add_constant(f"{name}/depthwise_filter", weights.reshape(kh, kw, groups, out // groups), device)
        node = graph.add_node(name, "DepthwiseConv2dNative", [x, filt.name], device)
        _copy_attrs(conv, node)
        done = f"a DepthwiseConv2dNative (multiplier {out // groups})"
    else:
        done = _split_convolution(graph, name, conv, x, weights, groups, device)
    if not any("f" in n.attr and n.attr["f"].func.name == match.values["function"] for n in graph.graph_def.node):
        library = graph.graph_def.library.function
        del library[[f.signature.name for f in library].index(match.values["function"])]
    return f"the XLA-compiled grouped convolution '{name}' ({groups} groups) is now {done}"


def _split_convolution(graph: EditableGraph, name: str, conv, x: str, weights, groups: int, device: str) -> str:
    """Split x's channels into the groups, one Conv2D each (its slice of the filter), and concatenate."""
    axis = graph.add_constant(f"{name}/channel_axis", np.array(3, np.int32), device).name
    split = graph.add_node(f"{name}/split", "Split", [axis, x], device)
    split.attr["T"].type, split.attr["num_split"].i = conv.attr["T"].type, groups
    per = weights.shape[3] // groups
    parts = []
    for g in range(groups):
        filt = graph.add_constant(f"{name}/group_{g}/filter", weights[..., g * per:(g + 1) * per], device)
        part = graph.add_node(f"{name}/group_{g}", "Conv2D", [f"{split.name}:{g}", filt.name], device)
        _copy_attrs(conv, part)
        parts.append(part.name)
    concat = graph.add_node(name, "ConcatV2", parts + [axis], device)
    concat.attr["T"].type, concat.attr["N"].i = conv.attr["T"].type, groups
    concat.attr["Tidx"].type = 3  # DT_INT32
    return f"{groups} Conv2Ds of its channel groups, concatenated"


def _copy_attrs(conv, node) -> None:
    for key in ("T", "strides", "padding", "dilations", "data_format", "explicit_paddings"):
        if key in conv.attr:
            node.attr[key].CopyFrom(conv.attr[key])
