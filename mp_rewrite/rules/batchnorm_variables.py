"""`batchnorm_into_filter`: an inference BatchNormalization after a convolution or matmul whose weights are
variables (the in-place conversion), folded into the filter at each call.

Keras 3 writes it `y = conv(x, W) [+ b] * s + t`, with `s = rsqrt(variance + epsilon) * gamma` and `t = beta -
mean * s` computed from the layer's variables: two elementwise passes over every activation, which TF's remapper
fuses with nothing. Two rewrites, chosen by what the graph will compute in:

- `batchnorm_into_filter`, for low precision: `BiasAdd(conv(x, W * s), b * s + t)`, the filter scaled at each call
  (a pass over the weights, which a low-precision graph casts at each call anyway); the remapper fuses the
  convolution with the BiasAdd, the activation and a residual add.
- `batchnorm_fused`, for float32: after a Conv2D, an inference `FusedBatchNormV3(conv, s, b * s + t, mean 0,
  variance 1, epsilon 0)`, which the remapper fuses into the convolution as a per-channel post-op, the filter
  untouched (scaling it took half of ResNet-50's float32 run at 64x64, batch 1). TF 2.21 fuses it into a float32
  Conv2D only (a bfloat16 one ran as a convolution and a separate FusedBatchNormV3, measured), and into no
  depthwise convolution or MatMul, which take the first rewrite.

The variables stay as they are, so the model still trains and restores; batchnorm.py folds the same in a frozen
graph, once, offline.
"""

from __future__ import annotations

import numpy as np

from ..core.dtypes import FLOAT
from .graph import EditableGraph, is_first_output, node_name
from .record import Match

CONTRACTIONS = ("Conv2D", "DepthwiseConv2dNative", "MatMul")
FUSED_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")  # tf_keras' inference BatchNormalization
FOLDED = "_mp_rewrite_folded_batch_norm"  # marks the FusedBatchNorm a rewrite wrote, which is not folded again
RESOURCE = 20  # types_pb2.DT_RESOURCE


def match_batchnorm_into_filter(graph: EditableGraph, add) -> Match | None:
    """`Add(Mul(contraction [-> BiasAdd], s), t)` with `s` and `t` per output channel and computed from variables
    and constants only, or tf_keras' inference `FusedBatchNorm(contraction [-> BiasAdd], gamma, beta, mean,
    variance)` of variables; None when the pattern is not there."""
    if add.op in FUSED_NORMS:
        return _fused_norm(graph, add)
    inputs = graph.data_inputs(add)
    if len(inputs) != 2 or graph.is_kept(add):
        return None
    for data, shift in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        mul = graph.producer(data)
        if mul is None or mul.op != "Mul" or not is_first_output(data) or len(graph.data_inputs(mul)) != 2:
            continue
        for chain, scale in (graph.data_inputs(mul), graph.data_inputs(mul)[::-1]):
            found = _contraction(graph, chain)
            if found is not None:
                return _checked(graph, add, mul, *found, scale, shift)
    return None


def _fused_norm(graph: EditableGraph, norm) -> Match | None:
    """An inference FusedBatchNorm of a contraction's output whose parameters are variables (or constants), of
    which only the normalized output is read."""
    inputs = graph.data_inputs(norm)
    if len(inputs) != 5 or FOLDED in norm.attr or norm.attr["is_training"].b \
            or norm.attr["data_format"].s not in (b"", b"NHWC"):
        return None
    if graph.is_kept(norm) or any(t.split(":")[0] == norm.name and not is_first_output(t)
                                  for reader in graph.readers(norm.name) for t in graph.data_inputs(reader)):
        return None
    found = _contraction(graph, inputs[0])
    if found is None or not all(_from_weights(graph, t) for t in inputs[1:]):
        return None
    epsilon = norm.attr["epsilon"].f if "epsilon" in norm.attr else 1e-4  # the op's default
    return _checked(graph, norm, None, *found, None, None, parameters=(*inputs[1:], epsilon))


def _contraction(graph: EditableGraph, tensor: str):
    """(contraction, BiasAdd or None) when `tensor` is a float32 contraction's output, or its BiasAdd's."""
    node = graph.producer(tensor) if is_first_output(tensor) else None
    bias = node if node is not None and node.op == "BiasAdd" else None
    if bias is not None:
        node = graph.producer(bias.input[0]) if is_first_output(bias.input[0]) else None
    if node is None or node.op not in CONTRACTIONS or node.attr["T"].type != FLOAT:
        return None
    return node, bias


def _checked(graph: EditableGraph, add, mul, contraction, bias, scale: str | None, shift: str | None,
             parameters: tuple = ()) -> Match | None:
    """The Match of `contraction [-> bias] [-> mul] -> add`, scaled by `scale` and shifted by `shift` (or, for a
    FusedBatchNorm `add`, by what its `parameters` (gamma, beta, mean, variance, epsilon) make), or why not."""
    weights = graph.weight_shape(contraction.input[1])
    if weights is None or graph.constant(contraction.input[1]) is not None:
        return None  # a constant filter is batchnorm.py's (a frozen graph)
    if not parameters and not (_from_weights(graph, scale) and _from_weights(graph, shift)):
        return None  # a product with activations, not a per-channel scale
    channels = _output_channels(contraction, weights)
    if channels is None:
        return Match().fail(f"{contraction.op} '{contraction.name}' is not NHWC, or its filter's shape is unknown")
    chain = [contraction] + ([bias] if bias is not None else []) + ([mul] if mul is not None else [])
    if any(graph.is_kept(n) or len(graph.readers(n.name)) != 1 for n in chain):
        return Match().fail(f"a node between {contraction.op} '{contraction.name}' and '{add.name}' is read "
                            "elsewhere or fetched (it would see the scaled filter)")
    tensors = (("scale", scale), ("shift", shift)) if not parameters else \
        [(role, t) for role, t in zip(("gamma", "beta", "mean", "variance"), parameters)]
    for role, tensor in tensors:
        shape = graph.inferred_shape(tensor)
        if shape is None or None in shape or int(np.prod(shape)) != channels or (shape and shape[-1] != channels):
            return Match().fail(f"the {role} '{tensor}' is not one value per output channel of the {channels} "
                                f"(shape {shape})")
    nodes = {"contraction": contraction, "add": add, **({"bias": bias} if bias else {}),
             **({"mul": mul} if mul else {})}
    return Match(nodes=nodes, values={"scale": scale, "shift": shift, "parameters": parameters, "channels": channels,
                                      "filter": tuple(weights)})


def _from_weights(graph: EditableGraph, tensor: str) -> bool:
    """Whether `tensor` is computed from variables and constants only (no input of the function or graph)."""
    seen, stack = set(), [node_name(tensor)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = graph.nodes.get(name)
        if node is None or node.op == "Placeholder" and node.attr["dtype"].type != RESOURCE \
                or node.op == "_Arg" and node.attr["T"].type != RESOURCE:
            return False
        if node.op not in ("ReadVariableOp", "Const"):
            stack.extend(node_name(t) for t in graph.data_inputs(node))
        if len(seen) > 64:
            return False
    return True


def _output_channels(contraction, weights: tuple) -> int | None:
    if None in weights:
        return None
    if contraction.op == "MatMul":
        return weights[0] if contraction.attr["transpose_b"].b else weights[1]
    if contraction.attr["data_format"].s not in (b"", b"NHWC") or len(weights) != 4:
        return None
    return weights[2] * weights[3] if contraction.op == "DepthwiseConv2dNative" else weights[3]


def rewrite_batchnorm_into_filter(graph: EditableGraph, match: Match) -> str:
    """The filter is multiplied by the scale and the shift becomes the contraction's BiasAdd (for a graph that
    computes in low precision: TF fuses a FusedBatchNorm into a float32 Conv2D only)."""
    return _rewrite(graph, match, fused=False)


def rewrite_batchnorm_fused(graph: EditableGraph, match: Match) -> str:
    """After a Conv2D, an inference FusedBatchNormV3 of mean 0 and variance 1 that the remapper fuses into the
    float32 convolution as a per-channel post-op (nothing touches the filter); elsewhere as
    rewrite_batchnorm_into_filter."""
    return _rewrite(graph, match, fused=match.nodes["contraction"].op == "Conv2D")


def _rewrite(graph: EditableGraph, match: Match, fused: bool) -> str:
    """Either rewrite; the Add keeps its name (what read it reads output 0), and the Mul and the old BiasAdd go."""
    contraction, mul, add = match.nodes["contraction"], match.nodes.get("mul"), match.nodes["add"]
    bias, device, channels = match.nodes.get("bias"), contraction.device, match.values["channels"]

    def node(suffix: str, op: str, inputs, **types):
        made = graph.add_node(f"{contraction.name}/{suffix}", op, inputs, device)
        made.attr["T"].type = FLOAT
        for key, value in types.items():
            made.attr[key].type = value
        return made.name

    def shaped(tensor: str, shape, suffix: str) -> str:
        target = graph.add_constant(f"{contraction.name}/{suffix}_shape", np.array(shape, np.int32), device)
        return node(suffix, "Reshape", [tensor, target.name], Tshape=3)

    if match.values["parameters"]:  # a FusedBatchNorm's: scale = gamma * rsqrt(variance + epsilon), shift = beta -
        gamma, beta, mean, variance, epsilon = match.values["parameters"]  # mean * scale
        eps = graph.add_constant(f"{contraction.name}/bn_epsilon", np.array(epsilon, np.float32), device)
        norm_scale = node("bn_norm_scale", "Mul", [gamma, node("bn_rsqrt", "Rsqrt", [
            node("bn_variance_plus", "AddV2", [variance, eps.name])])])
        norm_shift = node("bn_norm_shift", "Sub", [beta, node("bn_mean_scaled", "Mul", [mean, norm_scale])])
    else:
        norm_scale, norm_shift = match.values["scale"], match.values["shift"]
    scale = shaped(norm_scale, [channels], "bn_scale")
    shift = shaped(norm_shift, [channels], "bn_shift")
    if bias is not None:
        shift = node("bn_bias", "AddV2", [node("bn_bias_scaled", "Mul", [bias.input[1], scale]), shift])
    add.attr.clear()
    add.attr["T"].type = FLOAT
    add.attr["data_format"].s = b"NHWC"
    if fused:
        _as_fused_batch_norm(graph, add, contraction, scale, shift, channels)
        done = "an inference FusedBatchNormV3 of mean 0 and variance 1 (TF fuses it into the convolution)"
    else:
        filter_shape = match.values["filter"]
        if contraction.op == "DepthwiseConv2dNative":  # output channel = input channel * multiplier + m
            per_filter = shaped(scale, list(filter_shape[2:]), "bn_filter_scale")
        elif contraction.attr["transpose_b"].b:
            per_filter = shaped(scale, [channels, 1], "bn_filter_scale")
        else:
            per_filter = scale
        scaled = node("scaled_filter", "Mul", [contraction.input[1], per_filter])
        graph.set_inputs(contraction, [graph.data_inputs(contraction)[0], scaled])
        add.op = "BiasAdd"
        graph.set_inputs(add, [contraction.name, shift])
        done = "its filter scaled and a BiasAdd, at each call"
    graph.remove([n.name for n in (mul, bias) if n is not None])
    return f"the per-channel scale and shift after {contraction.op} '{contraction.name}' are now {done}"


def _as_fused_batch_norm(graph: EditableGraph, node, contraction, scale: str, shift: str, channels: int) -> None:
    """Make `node` (it keeps its name) the inference FusedBatchNormV3 `contraction * scale + shift`: mean 0,
    variance 1, epsilon 0."""
    device = contraction.device
    mean = graph.add_constant(f"{contraction.name}/bn_zero_mean", np.zeros(channels, np.float32), device)
    variance = graph.add_constant(f"{contraction.name}/bn_unit_variance", np.ones(channels, np.float32), device)
    node.op = "FusedBatchNormV3"
    node.attr.clear()
    node.attr["T"].type = FLOAT
    node.attr["U"].type = FLOAT
    node.attr["data_format"].s = b"NHWC"
    node.attr["epsilon"].f = 0.0
    node.attr["is_training"].b = False
    node.attr["exponential_avg_factor"].f = 1.0
    node.attr[FOLDED].b = True
    graph.set_inputs(node, [contraction.name, scale, shift, mean.name, variance.name])


def match_float32_scaled_filter(graph: EditableGraph, bias_add) -> Match | None:
    """After the precision pass: `BiasAdd(Conv2D(x, Mul(W, s)), t)` left float32 (the cut kept it so, or the
    machine has no low-precision units), with `s` and `t` computed from variables: what `batchnorm_into_filter`
    wrote for a low-precision graph."""
    conv = graph.producer(bias_add.input[0]) if is_first_output(bias_add.input[0]) else None
    if bias_add.attr["T"].type != FLOAT or conv is None or conv.op != "Conv2D" or conv.attr["T"].type != FLOAT:
        return None
    mul = graph.producer(conv.input[1]) if is_first_output(conv.input[1]) else None
    if mul is None or mul.op != "Mul" or mul.attr["T"].type != FLOAT or len(graph.data_inputs(mul)) != 2:
        return None
    weights, scale = graph.data_inputs(mul)
    shape, shift = graph.weight_shape(weights), graph.data_inputs(bias_add)[1]
    if shape is None or len(shape) != 4 or not (_from_weights(graph, scale) and _from_weights(graph, shift)):
        return None
    if any(graph.is_kept(n) or len(graph.readers(n.name)) != 1 for n in (mul, conv)) or graph.is_kept(bias_add):
        return Match().fail(f"Conv2D '{conv.name}' or its scaled filter is read elsewhere or fetched")
    return Match(nodes={"conv": conv, "mul": mul, "bias_add": bias_add},
                 values={"weights": weights, "scale": scale, "shift": shift, "channels": shape[3]})


def rewrite_float32_scaled_filter(graph: EditableGraph, match: Match) -> str:
    """The convolution reads its filter as stored again; the BiasAdd becomes the FusedBatchNorm TF fuses into a
    float32 convolution."""
    conv, values = match.nodes["conv"], match.values
    graph.set_inputs(conv, [graph.data_inputs(conv)[0], values["weights"]])
    _as_fused_batch_norm(graph, match.nodes["bias_add"], conv, values["scale"], values["shift"], values["channels"])
    graph.remove([match.nodes["mul"].name])
    return f"float32 Conv2D '{conv.name}' reads its filter unscaled, its BatchNorm a FusedBatchNorm TF fuses into it"


def batchnorm_fusion(match: Match) -> str:
    """The fusion rewrite_batchnorm_into_filter enables, for records."""
    return f"{match.nodes['contraction'].op} + BiasAdd"


def batchnorm_fused_fusion(match: Match) -> str:
    """The fusion rewrite_batchnorm_fused enables, for records."""
    op = match.nodes["contraction"].op
    return f"{op} + FusedBatchNorm" if op == "Conv2D" else f"{op} + BiasAdd"
