"""A Keras Dense on a rank > 2 input, written so TensorFlow's remapper fuses its MatMul, bias and activation.

Keras writes `Reshape -> MatMul -> Reshape -> BiasAdd (or AddV2 of the bias) -> activation`; the remapper fuses
`MatMul + BiasAdd + activation` only when they are adjacent. Two rules move the Reshape back to the end:

- `dense_bias`: `MatMul -> Reshape -> (BiasAdd | Add of a per-channel constant)` becomes `MatMul -> BiasAdd ->
  Reshape`. Exact: the reshape keeps the channel axis last (the bias is per channel), so each value gets the same
  bias before or after it.
- `dense_activation`: `BiasAdd(MatMul) -> Reshape -> elementwise activation` becomes `BiasAdd -> activation ->
  Reshape`. Exact: elementwise ops of scalar constants do not depend on shape.

Both keep the name of the last node, so whatever read it reads the same tensor. The same two rules, with a Squeeze
for the Reshape, handle Keras' Conv1D (`ExpandDims -> Conv2D -> Squeeze -> BiasAdd -> activation`): TF fuses
`Conv2D + Squeeze + BiasAdd` but no activation after it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .activation import GELUS, SINGLE, activation_name, activation_region
from .bias import contraction_channels
from .graph import FLOAT_TYPES, EditableGraph
from .record import Match

BIAS_OPS = ("BiasAdd", "Add", "AddV2")
CONTRACTION_OF = {"Reshape": "MatMul", "Squeeze": "Conv2D"}  # the reshaping op -> the contraction it follows


def matmul_channels(graph: EditableGraph, matmul) -> int | None:
    """How many output columns a MatMul has, when its weight's shape is known (a constant, or given)."""
    shape = graph.weight_shape(matmul.input[1]) if len(matmul.input) > 1 else None
    if shape is None or len(shape) != 2:
        return None
    return shape[0] if matmul.attr["transpose_b"].b else shape[1]


def match_dense_bias(graph: EditableGraph, reshape) -> Match | None:
    """`MatMul -> Reshape -> bias` (or `Conv2D -> Squeeze -> bias`) whose bias is per output channel; None when
    the pattern is not there."""
    matmul, bias = graph.producer(reshape.input[0]), graph.only_reader(reshape.name)
    if matmul is None or matmul.op != CONTRACTION_OF[reshape.op]:
        return None
    if bias is None or bias.op not in BIAS_OPS:
        if any(r.op in BIAS_OPS for r in graph.readers(reshape.name)):
            return Match().fail(f"the {reshape.op}d {matmul.op} output is read by "
                                f"{len(graph.readers(reshape.name))} nodes")
        return None
    if bias.op == "BiasAdd" and bias.attr["data_format"].s not in (b"", b"NHWC"):
        return Match().fail(f"BiasAdd '{bias.name}' is {bias.attr['data_format'].s.decode()}")
    reason = _contraction_problem(graph, matmul, reshape)
    if reason is not None:
        return Match().fail(reason)
    channels = matmul_channels(graph, matmul) if matmul.op == "MatMul" else contraction_channels(graph, matmul)
    if channels is None:
        return Match().fail(f"the {matmul.op}'s weight is not a constant (nor given a shape), so its channel count "
                            "is unknown")
    found, reason = _bias_tensor(graph, reshape, bias, channels)
    if reason is not None:
        return Match().fail(reason)
    return Match(nodes={"matmul": matmul, "reshape": reshape, "bias": bias}, values={"bias": found})


def _contraction_problem(graph: EditableGraph, contraction, reshape) -> str | None:
    """Why the contraction and its Reshape/Squeeze cannot be regrouped, or None."""
    if contraction.attr["T"].type not in FLOAT_TYPES:
        return f"the {contraction.op} is not float32 or bfloat16 (the CPU remapper fuses only those)"
    if len(graph.readers(contraction.name)) != 1 or graph.is_kept(contraction) or graph.is_kept(reshape):
        return f"{contraction.op} '{contraction.name}' or its {reshape.op} is read elsewhere or fetched"
    if reshape.op == "Squeeze":
        axes = list(reshape.attr["squeeze_dims"].list.i)
        if not axes or any(a in (3, -1) for a in axes) or contraction.attr["data_format"].s not in (b"", b"NHWC"):
            return f"Squeeze '{reshape.name}' may remove the channel axis (squeeze_dims {axes}) or the " \
                   "convolution is not NHWC"
    return None


@dataclasses.dataclass(frozen=True)
class FlatBias:
    """A variable bias of shape [..., heads, size] (a multi-head projection's), to be flattened to its channels."""

    tensor: str


def _bias_tensor(graph: EditableGraph, reshape, bias, channels: int):
    """(the bias: an input name that is one value per channel, a FlatBias, or a 1-D array of `channels` values,
    None), or (None, why not)."""
    if bias.op == "BiasAdd" and reshape.op == "Squeeze":
        return bias.input[1], None  # the channel axis stays last: the bias already had one value per channel
    tail, rank = target_shape(graph, reshape)
    if bias.op == "BiasAdd":
        value = graph.constant(bias.input[1])
        size = value.size if value is not None else tail[-1] if tail else None
        if size != channels:
            return None, f"the bias has {size} values for {channels} MatMul columns: the Reshape splits the channels"
        return bias.input[1], None
    inputs = graph.data_inputs(bias)
    other = inputs[1] if graph.producer(inputs[0]) is reshape else inputs[0]
    value = graph.constant(other)
    full = value.shape if value is not None else graph.weight_shape(other)
    if full is None or None in full:
        return None, f"'{bias.name}' adds a tensor that is neither a constant nor a variable of known shape"
    kind = "constant" if value is not None else "variable"
    size, shape = int(np.prod(full)), list(full)
    while shape and shape[0] == 1:
        shape.pop(0)
    if size != 1 and int(np.prod(shape)) != channels:
        return None, f"'{bias.name}' adds a {kind} of shape {tuple(full)}, not one value per channel " \
               f"of the {channels} MatMul columns"
    if len(full) > (rank if rank is not None else 1):
        return None, f"'{bias.name}' adds a {kind} of rank {len(full)}, which may raise the output's rank"
    if len(shape) > 1 and (tail is None or tail[-len(shape):] != shape):
        return None, f"'{bias.name}' adds a {kind} of shape {tuple(full)}, and the Reshape's target shape " \
               "does not show that it splits the channels that way"
    if value is None:
        if size == 1:
            return None, f"'{bias.name}' adds a variable holding one value (not per channel)"
        return (other if len(full) == 1 else FlatBias(other)), None
    if size == 1:  # one value for every channel
        return np.full(channels, value.reshape(-1)[0], value.dtype), None
    return value.reshape(-1), None


def target_shape(graph: EditableGraph, reshape) -> tuple:
    """(the trailing dimensions a Reshape's target shape states, its rank), each None when unknown. A constant target
    states all; a ConcatV2 of pieces (Keras' Tensordot, the einsum rule) its constant last piece, and its rank
    when every piece's length is known. A Squeeze of a 4-D convolution output: no dimensions, its rank."""
    if reshape.op == "Squeeze":
        return None, 4 - len(reshape.attr["squeeze_dims"].list.i)
    value = graph.constant(reshape.input[1])
    if value is not None:
        return [int(v) for v in value.reshape(-1)], value.size
    concat = graph.producer(reshape.input[1])
    if concat is None or concat.op != "ConcatV2":
        return None, None
    pieces = graph.data_inputs(concat)[:-1]
    last = graph.constant(pieces[-1])
    lengths = [_length(graph, piece) for piece in pieces]
    return ([int(v) for v in last.reshape(-1)] if last is not None else None,
            sum(lengths) if None not in lengths else None)


def _length(graph: EditableGraph, tensor: str) -> int | None:
    """How many values a 1-D shape piece has: a Const, a Gather of constant indices, a plain constant slice."""
    value, node = graph.constant(tensor), graph.producer(tensor)
    if value is not None:
        return value.size
    if node is not None and node.op == "GatherV2":
        indices = graph.constant(node.input[1])
        return indices.size if indices is not None else None
    if node is not None and node.op == "StridedSlice":
        begin, end, stride = (graph.constant(t) for t in node.input[1:4])
        masks = any(node.attr[m].i for m in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                              "shrink_axis_mask"))
        if not masks and None not in (begin, end, stride) and stride.tolist() == [1] and 0 <= begin[0] <= end[0]:
            return int(end[0] - begin[0])
    return None


def rewrite_dense_bias(graph: EditableGraph, match: Match) -> str:
    """The Reshape becomes the BiasAdd of the MatMul, the bias node becomes the Reshape (it keeps its name)."""
    matmul, reshape, bias = match.nodes["matmul"], match.nodes["reshape"], match.nodes["bias"]
    tensor = match.values["bias"]
    if isinstance(tensor, FlatBias):
        shape = graph.add_constant(f"{bias.name}/per_channel_shape", np.array([-1], np.int32), bias.device)
        flat = graph.add_node(f"{bias.name}/per_channel", "Reshape", [tensor.tensor, shape.name], bias.device)
        _set_attrs(flat, T=bias.attr["T"].type, Tshape=3)
        tensor = flat.name
    elif not isinstance(tensor, str):
        tensor = graph.add_constant(f"{bias.name}/per_channel", tensor.astype(_numpy_type(bias)), bias.device).name
    op, extra, attrs = reshape.op, list(graph.data_inputs(reshape)[1:]), _attrs_of(reshape)
    reshape.op = "BiasAdd"
    graph.set_inputs(reshape, [matmul.name, tensor])
    _set_attrs(reshape, T=bias.attr["T"].type, data_format=b"NHWC")
    bias.op = op
    graph.set_inputs(bias, [reshape.name] + extra)
    _copy_attrs(bias, attrs)
    return f"moved {op} '{bias.name}' after the bias"


def match_dense_activation(graph: EditableGraph, reshape) -> Match | None:
    """`MatMul -> BiasAdd -> Reshape -> elementwise activation` (or Conv2D and Squeeze); None when the pattern is
    not there."""
    bias = graph.producer(reshape.input[0])
    matmul = graph.producer(bias.input[0]) if bias is not None and bias.op == "BiasAdd" else None
    if matmul is None or matmul.op != CONTRACTION_OF[reshape.op]:
        return None
    found = activation_region(graph, reshape)
    if found is None or not found.ok:
        return found
    if len(graph.readers(bias.name)) != 1 or graph.is_kept(bias) or graph.is_kept(reshape):
        return Match().fail(f"BiasAdd '{bias.name}' is read by more than its {reshape.op} or fetched")
    name = activation_name(found.values["region"])
    if name not in SINGLE + (GELUS if matmul.op == "MatMul" else ()):
        return None  # e.g. attention's query scaling: moving the Reshape past it would enable no fusion
    found.nodes.update(matmul=matmul, bias=bias, reshape=reshape)
    found.values["activation"] = name
    return found


def rewrite_dense_activation(graph: EditableGraph, match: Match) -> str:
    """The region reads the BiasAdd; its exit is renamed and a Reshape (Squeeze) with the exit's old name follows
    it."""
    bias, reshape, exit_node = match.nodes["bias"], match.nodes["reshape"], match.nodes["exit"]
    region = match.values["region"]
    old = exit_node.name
    new = graph.fresh_name(f"{old}/before_{reshape.op.lower()}")
    for node in region:
        graph.set_inputs(node, [_renamed(t, reshape.name, bias.name, old, new) for t in graph.data_inputs(node)])
    del graph.nodes[old]
    exit_node.name = new
    graph.nodes[new] = exit_node
    moved = graph.add_node(old, reshape.op, [new] + graph.data_inputs(reshape)[1:], exit_node.device)
    _copy_attrs(moved, _attrs_of(reshape))
    graph.remove([reshape.name])
    return f"moved {reshape.op} '{reshape.name}' after the {match.values['activation']} activation"


def _renamed(tensor: str, reshape: str, bias: str, old: str, new: str) -> str:
    name = tensor.split(":")[0]
    return bias if name == reshape else new if name == old else tensor


def _numpy_type(node):
    import tensorflow as tf
    return tf.dtypes.as_dtype(node.attr["T"].type).as_numpy_dtype


def _attrs_of(node) -> dict:
    """A copy of the node's attributes."""
    return {key: _copied(value) for key, value in node.attr.items()}


def _copied(value):
    copy = type(value)()
    copy.CopyFrom(value)
    return copy


def _copy_attrs(node, attrs: dict) -> None:
    """Replace the node's attributes by `attrs` (AttrValue protos)."""
    node.attr.clear()
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)


def _set_attrs(node, **attrs) -> None:
    """Replace the node's attributes by `attrs` (ints are types, bytes are strings)."""
    node.attr.clear()
    for key, value in attrs.items():
        if isinstance(value, bytes):
            node.attr[key].s = value
        else:
            node.attr[key].type = value
