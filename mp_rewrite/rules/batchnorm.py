"""Folding an inference-time normalization into the convolution or matmul before it, in a frozen graph.

Keras 3's BatchNormalization (and any per-channel scale and shift) freezes to `y = conv(x, W) [+ b] * s [+ t]`
with constant `s` and `t`, tf_keras' (and tf.nn.fused_batch_norm's) to an inference FusedBatchNorm of constant
parameters, which is the same with `s = gamma / sqrt(variance + epsilon)`, `t = beta - mean * s`. Grappler's
constant folding leaves the Mul and Add in place (its Mul push-down needs the Mul right after the convolution, and
Keras puts a BiasAdd between). Rewritten as `y = conv(x, W * s) + (b * s + t)` the graph is one convolution and one
BiasAdd, which TensorFlow's remapper fuses with the activation after it: two elementwise passes over every
activation disappear, and in low precision so do their Casts. The fold is exact in real arithmetic and rounds like
float32 arithmetic (W * s is one float32 multiply per weight).

Only what is certainly per output channel is folded: a constant `s` (and `t`) of one value or one value per output
channel, a contraction whose filter is a constant, NHWC convolutions, nothing preserved or shared along the chain.

Every chain found but not folded is recorded with the reason (a Record of the rules package, rule "batchnorm_fold"):
not per channel, a contraction read by another node (it would see the folded filter), a fetched node, ...
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.dtypes import FLOAT
from ..core.op_facts import CONTRACTIONS  # how each takes a per-output-channel scale: _scaled_filter
from .record import APPLIED, DECLINED, Record

# What may sit between the contraction and the scale: its bias, or the Identity Grappler leaves for an all-zero one.
BETWEEN = ("BiasAdd", "Identity")
SHIFTS = ("Add", "AddV2")
FUSED_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
RULE = "batchnorm_fold"


@dataclasses.dataclass
class _Chain:
    """One foldable `contraction [-> BiasAdd|Identity ...] -> Mul [-> Add]` (or `... -> Add`, `-> FusedBatchNorm`)."""

    contraction: object
    bias: np.ndarray | None
    scale: np.ndarray | None
    shift: np.ndarray | None
    last: object  # the Mul or the Add: it becomes the BiasAdd, so its consumers need no change


def fold_batch_norms(graph_def, fetches) -> tuple[object, list[str]]:
    """Fold per-channel constant scales and shifts into the constant-filter contraction before them.

    Args:
        graph_def: a frozen GraphDef (weights are Consts), after constant folding; not modified.
        fetches: tensor or node names whose nodes must keep their op (their value is unchanged either way).

    Returns:
        (a new GraphDef, the names of the nodes that became BiasAdds).
    """
    out, records = fold_batch_norms_recorded(graph_def, fetches)
    return out, [r.node for r in records if r.applied]


def fold_batch_norms_recorded(graph_def, fetches) -> tuple[object, list[Record]]:
    """fold_batch_norms, returning a Record per chain folded or declined (with the reason) instead of names.

    Returns:
        (a new GraphDef, [Record]); an applied record is named after the node that became the BiasAdd.
    """
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    nodes = {node.name: node for node in out.node}
    consumers = _data_consumers(out)
    kept = {f.split(":")[0].lstrip("^") for f in fetches}
    records = []
    for node in list(out.node):
        # A Mul's chain takes the Add after it; an Add reached first finds no contraction behind its Mul.
        if node.op in ("Mul",) + SHIFTS + FUSED_NORMS:
            chain = _chain(node, nodes, consumers, kept)
            if isinstance(chain, str):
                records.append(Record(RULE, node.name, DECLINED, chain))
            elif chain is not None:
                _rewrite(out, chain, nodes)
                what = f"folded {'the scale and shift' if chain.scale is not None else 'the shift'} into " \
                       f"'{chain.contraction.name}'"
                records.append(Record(RULE, chain.last.name, APPLIED, what, f"{chain.contraction.op} + BiasAdd",
                                      (chain.contraction.name, node.name, chain.last.name)))
    return out, records


def _data_consumers(graph_def) -> dict:
    """node name -> how many data inputs (of any node) read it; also "name:port" -> how many read that output, for
    every output but the first."""
    counts: dict = {}
    for node in graph_def.node:
        for name in node.input:
            if not name.startswith("^"):
                producer, _, port = name.partition(":")
                counts[producer] = counts.get(producer, 0) + 1
                if port not in ("", "0"):
                    counts[name] = counts.get(name, 0) + 1
    return counts


def _producer(name: str, nodes: dict):
    """The node whose first output the input `name` reads, or None (a control input, another output port)."""
    node, _, port = name.partition(":")
    return None if name.startswith("^") or port not in ("", "0") else nodes.get(node)


def _constant(name: str, nodes: dict):
    """The float32 value of the Const node the input `name` reads, or None."""
    import tensorflow as tf
    node = _producer(name, nodes)
    if node is None or node.op != "Const" or node.attr["dtype"].type != FLOAT:
        return None
    return tf.make_ndarray(node.attr["value"].tensor)


def _only_output(name: str, consumers: dict, kept: set) -> bool:
    """Whether the node's output is read by exactly one data input and the node is not preserved."""
    return consumers.get(name, 0) == 1 and name not in kept


def _chain(end, nodes: dict, consumers: dict, kept: set) -> _Chain | str | None:
    """The foldable chain that ends at `end` (a Mul or an Add), or just after it when `end` is a Mul whose only
    reader adds a constant; why not, when a contraction with a constant is there but cannot be folded; None if
    the pattern is not there."""
    if end.op in FUSED_NORMS:
        return _norm_chain(end, nodes, consumers, kept)
    if end.attr["T"].type != FLOAT or len([i for i in end.input if not i.startswith("^")]) != 2:
        return None
    reason = None
    for data, other in ((end.input[0], end.input[1]), (end.input[1], end.input[0])):
        value, producer = _constant(other, nodes), _producer(data, nodes)
        found = _contraction_before(producer, nodes, consumers, kept) if value is not None else None
        if found is None or isinstance(found, str):
            # A scalar times a shared contraction output is usually part of an activation (GELU's 0.5 * x):
            # not a normalization worth a line in the report.
            reason = reason or (found if value is not None and value.size > 1 else None)
            continue
        contraction, bias = found
        channels, rank = _output_channels(contraction, nodes), 2 if contraction.op == "MatMul" else 4
        if not _per_channel(value, channels, rank):
            reason = f"the constant of shape {value.shape} is not one value per output channel of " \
                     f"'{contraction.name}' ({channels} channels)"
            continue
        if end.name in kept:
            return f"'{end.name}' is fetched, so it must keep its op"
        if end.op != "Mul":
            return _Chain(contraction, bias, None, value, end)
        last, shift = _shift_after(end, nodes, consumers, kept, channels, rank) or (end, None)
        return _Chain(contraction, bias, value, shift, last)
    return reason


def _norm_chain(norm, nodes: dict, consumers: dict, kept: set) -> _Chain | str | None:
    """The chain that ends at an inference FusedBatchNorm of constant float32 parameters whose batch statistics
    (outputs 1 to 5) nobody reads, as a scale and a shift; a reason or None if there is none."""
    found = _contraction_before(_producer(norm.input[0], nodes), nodes, consumers, kept)
    if found is None or isinstance(found, str):
        return found
    if norm.attr["is_training"].b or norm.attr["T"].type != FLOAT or norm.attr["data_format"].s not in (b"", b"NHWC"):
        return "the FusedBatchNorm is in training mode, not float32 or not NHWC"
    if any(f"{norm.name}:{port}" in consumers for port in range(1, 6)) or norm.name in kept:
        return "the FusedBatchNorm's statistics are read, or it is fetched"
    params = [_constant(name, nodes) for name in norm.input[1:5]]
    if any(p is None for p in params):
        return "the FusedBatchNorm's scale, offset, mean or variance is not a constant"
    contraction, bias = found
    channels = _output_channels(contraction, nodes)
    gamma, beta, mean, variance = (p.astype(np.float64) for p in params)
    if any(p.shape != (channels,) for p in (gamma, beta, mean, variance)):
        return f"the FusedBatchNorm's parameters are not one value per channel of '{contraction.name}'"
    scale = gamma / np.sqrt(variance + norm.attr["epsilon"].f)
    return _Chain(contraction, bias, scale.astype(np.float32), (beta - mean * scale).astype(np.float32), norm)


def _contraction_before(node, nodes: dict, consumers: dict, kept: set):
    """(the constant-filter contraction `node` computes, possibly through a BiasAdd and Identities, that bias or
    None), when nothing else reads that chain; why not when there is one; None when there is none."""
    bias, chain = None, []
    while node is not None and node.op in BETWEEN:
        chain.append(node)
        if node.op == "BiasAdd":
            if bias is not None or node.attr["data_format"].s not in (b"", b"NHWC"):
                return None
            bias = _constant(node.input[1], nodes)
            if bias is None:
                return None
        node = _producer(node.input[0], nodes)
    if node is None or node.op not in CONTRACTIONS:
        return None
    for member in chain + [node]:
        if not _only_output(member.name, consumers, kept):
            return f"'{member.name}' is read by {consumers.get(member.name, 0)} nodes or fetched: another " \
                   "reader would see the folded filter"
    channels = _output_channels(node, nodes)
    if channels is None:
        return f"the filter of '{node.name}' is not a float32 constant (or not NHWC)"
    if bias is not None and bias.shape != (channels,):
        return None
    return node, bias


def _shift_after(mul, nodes: dict, consumers: dict, kept: set, channels: int, rank: int):
    """(the Add node, its per-channel constant) when `mul`'s only reader adds one, else None."""
    if not _only_output(mul.name, consumers, kept):
        return None
    readers = [n for n in nodes.values() if mul.name in n.input or f"{mul.name}:0" in n.input]
    if len(readers) != 1 or readers[0].op not in SHIFTS or readers[0].name in kept:
        return None
    add = readers[0]
    other = add.input[1] if add.input[0].split(":")[0] == mul.name else add.input[0]
    shift = _constant(other, nodes)
    return (add, shift) if shift is not None and _per_channel(shift, channels, rank) else None


def _per_channel(value: np.ndarray, channels: int, rank: int) -> bool:
    """One value, or one per output channel broadcast along the last axis, of no higher rank than the output."""
    return value.ndim <= rank and (value.size == 1 or (value.size == channels and value.shape[-1] == channels))


def _output_channels(contraction, nodes: dict) -> int | None:
    """How many output channels the contraction has, when its filter is a constant and its layout is known."""
    if contraction.attr["T"].type != FLOAT:
        return None
    weights = _constant(contraction.input[1], nodes)
    if weights is None:
        return None
    if contraction.op == "MatMul":
        return weights.shape[0] if contraction.attr["transpose_b"].b else weights.shape[1]
    if contraction.attr["data_format"].s not in (b"", b"NHWC") or weights.ndim != 4:
        return None
    return weights.shape[2] * weights.shape[3] if contraction.op == "DepthwiseConv2dNative" else weights.shape[3]


def _scaled_filter(contraction, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The filter with every output channel multiplied by its scale."""
    scale = scale.reshape(-1)
    if contraction.op == "MatMul" and contraction.attr["transpose_b"].b:
        return weights * scale.reshape(-1, 1)
    if contraction.op == "DepthwiseConv2dNative":  # output channel = input channel * multiplier + m
        return weights * np.broadcast_to(scale, (weights.shape[2] * weights.shape[3],)).reshape(weights.shape[2:])
    return weights * scale


def _rewrite(graph_def, chain: _Chain, nodes: dict) -> None:
    """Point the contraction at the scaled filter and turn the chain's last node into a BiasAdd of the new bias."""
    channels = _output_channels(chain.contraction, nodes)
    scale = np.ones(1, np.float32) if chain.scale is None else chain.scale
    scale = np.broadcast_to(scale.reshape(-1), (channels,)).astype(np.float32)
    weights = _constant(chain.contraction.input[1], nodes)
    bias = np.zeros(channels, np.float32) if chain.bias is None else chain.bias.astype(np.float32)
    bias = bias * scale
    if chain.shift is not None:
        bias = bias + np.broadcast_to(chain.shift.reshape(-1), (channels,))
    bias_name = f"{chain.last.name}/folded_bias"
    _add_constant(graph_def, bias_name, bias, chain.contraction.device, nodes)
    if chain.scale is not None:
        filter_name = f"{chain.last.name}/folded_filter"
        _add_constant(graph_def, filter_name, _scaled_filter(chain.contraction, weights, scale),
                      chain.contraction.device, nodes)
        chain.contraction.input[1] = filter_name
    controls = [i for i in chain.last.input if i.startswith("^")]
    last = chain.last
    last.op = "BiasAdd"
    del last.input[:]
    last.input.extend([chain.contraction.name, bias_name] + controls)
    for key in list(last.attr):
        if key != "T":
            del last.attr[key]
    last.attr["data_format"].s = b"NHWC"


def _add_constant(graph_def, name: str, value: np.ndarray, device: str, nodes: dict) -> None:
    """Add a float32 Const node `name` holding `value`."""
    import tensorflow as tf
    const = graph_def.node.add(name=name, op="Const", device=device)
    const.attr["dtype"].type = FLOAT
    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.astype(np.float32)))
    nodes[name] = const
