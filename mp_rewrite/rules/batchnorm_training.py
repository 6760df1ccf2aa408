"""Keras 3's BatchNormalization in a traced training step, fused into the kernels tf_keras's uses.

Keras 3 (TensorFlow backend) writes a training-mode BatchNormalization as `tf.nn.moments` and
`tf.nn.batch_normalization`: about 20 elementwise ops a layer, and TF's autodiff adds about 21 more for the
gradient. In a ResNet-50 step they are a fifth of the float32 time, and they gain nothing from bfloat16. This rule
replaces each such layer in a step body with one FusedBatchNormV3 (training mode), and the gradient with one
FusedBatchNormGradV3:

    forward  x -> Mean -> StopGradient -> SquaredDifference(x, .) -> Mean -> Squeeze -> AddV2(eps) -> Rsqrt
             inv = Rsqrt * gamma; y = x * inv + (beta - Squeeze(mean) * inv)
    backward dy (the gradient of y): d gamma = (...) * Rsqrt; d beta = Reshape(Sum(dy)); d x = AddN of three
             contributions (dy * inv, the Mean's and the SquaredDifference's gradients)

    becomes  y, mean, var, r1, r2, r3 = FusedBatchNormV3(x, gamma, beta, is_training=True)
             dx, dgamma, dbeta = FusedBatchNormGradV3(dy, x, gamma, r1, r2, r3, is_training=True)

The batch mean goes wherever the layer's mean went (its moving-mean update). FusedBatchNormV3 returns the batch
variance with Bessel's correction, while `tf.nn.moments` does not. The moving-variance update is therefore given
`var * (1 - C / size(x))`.

What is matched:
- NHWC input (reduction over axes 0, 1, 2), float32, with gamma and beta.
- The gradient nodes lie in the name scope TF's autodiff gives them: a prefix ("gradient_tape/", "gradients/")
  before the layer's scope.
- Each gradient is found by its shape in the graph, and a layer is fused only when every piece is found exactly
  once.

Anything else is left as traced.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .graph import EditableGraph, drop_unset_attrs, node_name, reachable

_FLOAT = 1  # types_pb2.DT_FLOAT
_AXES = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class _Layer:
    """One matched layer: its scopes, the tensors the fused ops read (x, gamma, beta, dy), the nodes whose outputs
    they replace, the gradient AddN and its three contributions from the layer, and the forward nodes that go."""

    scope: str
    grad_scope: str
    x: str
    gamma: str
    beta: str
    eps: float
    y: object
    mean_sq: object
    var_sq: object
    dy: str
    addn: object
    parts: tuple
    dgamma: object
    dbeta: object
    dead: tuple
    device: str


def fuse_training_batch_norms(graph_def, keep=()):
    """Return (a copy of `graph_def` with every matched training BatchNormalization fused, [the layers' scopes]).

    Args:
        graph_def: a function body (core.functions.BodyGraph.graph_def) or a graph; never modified.
        keep: names of nodes that must stay (fetches, control outputs); a layer touching one is left alone. The
            nodes the fusion leaves unread are removed only with `keep` given (what it reaches is what is alive).
    """
    graph = EditableGraph(graph_def, fetches=keep)
    needed = reachable(graph.graph_def, keep)
    layers = [layer for layer in (_match(graph, n) for n in graph.graph_def.node if n.op == "Rsqrt")
              if layer is not None and not graph.kept & set(layer.dead)]  # all matched before the first edit
    redirects = {}
    for layer in layers:
        redirects.update(_fuse(graph, layer))
    _redirect(graph, redirects)
    # The layers' old nodes, forward and gradient, are what the fusion left unread; what was dead before stays.
    graph.remove(needed - reachable(graph.graph_def, keep))
    _remove_broken_dead(graph, keep)
    drop_unset_attrs(graph.graph_def)  # what the matchers' reads of absent attrs inserted (TF would refuse them)
    return graph.graph_def, [layer.scope for layer in layers]


def _remove_broken_dead(graph, keep) -> None:
    """Remove what nothing alive reads and that reads a node the fusion removed: a step traced with an unknown batch
    size has dead Shape nodes reading a layer's old ops, and TF refuses a graph with an input that names nothing."""
    alive = reachable(graph.graph_def, keep)
    while True:
        names = {node.name for node in graph.graph_def.node}
        broken = [node.name for node in graph.graph_def.node
                  if node.name not in alive and any(node_name(t) not in names for t in node.input)]
        if not broken:
            return
        graph.remove(broken)


def _op(graph, tensor, *ops):
    node = graph.producer(tensor)
    return node if node is not None and node.op in ops else None


def _readers(graph, node, op):
    return [r for r in graph.readers(node.name) if r.op == op]


def _same(a: str, b: str) -> bool:
    """Whether two data inputs read the same tensor ("n" and "n:0" are one)."""
    return a.removesuffix(":0") == b.removesuffix(":0")


def _other(node, name: str):
    """The data input of a two-input node besides the one reading node `name`'s output 0, or None."""
    inputs = [t for t in node.input if not t.startswith("^")]
    if len(inputs) != 2:
        return None
    first, second = inputs
    if _same(first, name):
        return second
    if _same(second, name):
        return first
    return None


def _reads(node, tensor: str) -> bool:
    return any(_same(t, tensor) for t in node.input if not t.startswith("^"))


def _axes(graph, node) -> bool:
    axes = graph.constant(node.input[1])
    return axes is not None and tuple(sorted(np.atleast_1d(axes).tolist())) == _AXES and \
        "keep_dims" in node.attr and node.attr["keep_dims"].b


def _unshaped(graph, tensor: str) -> str:
    """The tensor a Reshape reads, for a Reshape's output (Keras reshapes the per-channel vectors to [1, 1, 1, C]
    for a BatchNormalization with a positive axis); else `tensor`."""
    node = _op(graph, tensor, "Reshape")
    return node.input[0] if node is not None else tensor


def _chain_end(graph, node, scope: str):
    """`node`, or the last of the Reshapes under `scope` that follow it one after another."""
    while True:
        reshapes = [r for r in _readers(graph, node, "Reshape") if r.name.startswith(scope)]
        if len(reshapes) != 1:
            return node
        node = reshapes[0]


def _match(graph, rsqrt):
    """The pieces of one training BatchNormalization around `rsqrt`, or None."""
    add_eps = _op(graph, rsqrt.input[0], "AddV2", "Add")
    if add_eps is None or rsqrt.attr["T"].type != _FLOAT:
        return None
    var_sq = next((_op(graph, _unshaped(graph, t), "Squeeze") for t in add_eps.input
                   if _op(graph, _unshaped(graph, t), "Squeeze")), None)
    eps = next((graph.constant(t) for t in add_eps.input if graph.constant(t) is not None), None)
    variance = _op(graph, var_sq.input[0], "Mean") if var_sq is not None else None
    if variance is None or eps is None or eps.size != 1 or not _axes(graph, variance):
        return None
    sqdiff = _op(graph, variance.input[0], "SquaredDifference")
    stop = _op(graph, sqdiff.input[1], "StopGradient") if sqdiff is not None else None
    mean = _op(graph, stop.input[0], "Mean") if stop is not None else None
    if mean is None or not _axes(graph, mean) or not _same(mean.input[0], sqdiff.input[0]):
        return None
    x = mean.input[0]
    mean_sq = _readers(graph, mean, "Squeeze")
    invs = [m for m in _readers(graph, rsqrt, "Mul")
            if _op(graph, _unshaped(graph, _other(m, rsqrt.name) or ""), "ReadVariableOp", "Identity", "Cast")]
    if len(mean_sq) != 1 or len(invs) != 1:
        return None
    mean_sq, inv = mean_sq[0], invs[0]
    gamma = _unshaped(graph, _other(inv, rsqrt.name))
    scope = inv.name.rpartition("/batchnorm/")[0]
    x_inv = [m for m in _readers(graph, inv, "Mul") if _reads(m, x)]
    mean_inv = [m for m in _readers(graph, inv, "Mul")
                if _same(_unshaped(graph, _other(m, inv.name) or ""), mean_sq.name)]
    if not scope or len(x_inv) != 1 or len(mean_inv) != 1:
        return None
    subs = _readers(graph, mean_inv[0], "Sub")
    ys = [a for a in _readers(graph, x_inv[0], "AddV2") if subs and _reads(a, subs[0].name)]
    if len(subs) != 1 or len(ys) != 1 or not _same(subs[0].input[1], mean_inv[0].name):
        return None
    beta, y = _unshaped(graph, subs[0].input[0]), ys[0]
    # The gradient: dy is the tensor multiplied both by inv and by x.
    forward = (x_inv[0], mean_inv[0])
    by_inv = {_other(m, inv.name): m for m in _readers(graph, inv, "Mul") if m not in forward}
    dys = [t for t in by_inv if t and any(_reads(m, x) for m in graph.readers(node_name(t)) if m.op == "Mul")]
    if len(dys) != 1:
        return None
    dy, dx_part = dys[0], by_inv[dys[0]]
    prefix = dx_part.name[:dx_part.name.find(scope)] if scope in dx_part.name else ""
    grad_scope = f"{prefix}{scope}/"
    if not prefix:
        return None
    addns = _readers(graph, dx_part, "AddN")
    dgammas = [_chain_end(graph, m, grad_scope) for m in _readers(graph, rsqrt, "Mul")
               if m is not inv and m.name.startswith(grad_scope)]
    dbetas = [_chain_end(graph, s, grad_scope) for s in graph.readers(node_name(dy))
              if s.op == "Sum" and s.name.startswith(grad_scope)]
    if len(addns) != 1 or len(dgammas) != 1 or len(dbetas) != 1 or dbetas[0].op != "Reshape":
        return None
    addn = addns[0]
    parts = [t for t in graph.data_inputs(addn) if node_name(t).startswith(grad_scope)]
    if len(parts) != 3:
        return None
    reshapes = [node_name(t) for t in (*add_eps.input, _other(inv, rsqrt.name), _other(mean_inv[0], inv.name),
                                       subs[0].input[0]) if _op(graph, t, "Reshape")]
    dead = [rsqrt.name, add_eps.name, var_sq.name, variance.name, sqdiff.name, stop.name, mean.name, inv.name,
            x_inv[0].name, mean_inv[0].name, subs[0].name, y.name, *reshapes]
    return _Layer(scope, grad_scope, x, gamma, beta, float(eps), y, mean_sq, var_sq, dy, addn, tuple(parts),
                  dgammas[0], dbetas[0], tuple(dead), y.device)


def _fuse(graph, layer) -> dict:
    """Add the layer's fused ops and point its gradient AddN at them; returns {old node: the tensor replacing its
    output 0} for `_redirect`."""
    from tensorflow.core.framework import attr_value_pb2
    scope, device = layer.scope, layer.device

    def attrs(**extra):
        values = {"T": attr_value_pb2.AttrValue(type=_FLOAT), "U": attr_value_pb2.AttrValue(type=_FLOAT),
                  "epsilon": attr_value_pb2.AttrValue(f=layer.eps),
                  "data_format": attr_value_pb2.AttrValue(s=b"NHWC"),
                  "is_training": attr_value_pb2.AttrValue(b=True)}
        values.update(extra)
        return values

    empty = graph.add_constant(f"{scope}/fused/empty", np.zeros([0], np.float32), device).name
    fused = graph.add_node(f"{scope}/fused/FusedBatchNormV3", "FusedBatchNormV3",
                           [layer.x, layer.gamma, layer.beta, empty, empty], device,
                           attrs(exponential_avg_factor=attr_value_pb2.AttrValue(f=1.0)))
    grad = graph.add_node(f"{layer.grad_scope}fused/FusedBatchNormGradV3", "FusedBatchNormGradV3",
                          [layer.dy, layer.x, layer.gamma] + [f"{fused.name}:{i}" for i in (3, 4, 5)],
                          device, attrs())
    biased = _biased_variance(graph, layer, f"{fused.name}:2", device)
    addn = layer.addn
    rest = [t for t in graph.data_inputs(addn) if t not in layer.parts]
    graph.set_inputs(addn, rest + [grad.name])
    if rest:
        addn.attr["N"].i = len(rest) + 1
    else:
        addn.op = "Identity"
        del addn.attr["N"]
    return {layer.y.name: fused.name, layer.mean_sq.name: f"{fused.name}:1", layer.var_sq.name: biased,
            layer.dgamma.name: f"{grad.name}:1", layer.dbeta.name: f"{grad.name}:2"}


def _biased_variance(graph, layer, batch_variance, device):
    """`batch_variance * (1 - C / size(x))`: the variance tf.nn.moments gives, from FusedBatchNormV3's corrected one."""
    from tensorflow.core.framework import attr_value_pb2
    scope = f"{layer.scope}/fused"
    float_t = {"T": attr_value_pb2.AttrValue(type=_FLOAT)}

    def size(name, tensor):
        node = graph.add_node(f"{scope}/{name}", "Size", [tensor], device,
                              {"T": attr_value_pb2.AttrValue(type=_FLOAT),
                               "out_type": attr_value_pb2.AttrValue(type=3)})  # DT_INT32
        return graph.add_node(f"{scope}/{name}_float", "Cast", [node.name], device,
                              {"SrcT": attr_value_pb2.AttrValue(type=3), "DstT": attr_value_pb2.AttrValue(type=_FLOAT),
                               "Truncate": attr_value_pb2.AttrValue(b=False)}).name

    share = graph.add_node(f"{scope}/share", "RealDiv", [size("channels", batch_variance), size("elements", layer.x)],
                           device, float_t)
    one = graph.add_constant(f"{scope}/one", np.float32(1.0), device)
    factor = graph.add_node(f"{scope}/bessel", "Sub", [one.name, share.name], device, float_t)
    return graph.add_node(f"{scope}/variance", "Mul", [batch_variance, factor.name], device, float_t).name


def _redirect(graph, redirects: dict) -> None:
    """Point every data input that reads output 0 of a node named in `redirects` at the tensor it maps to."""
    for node in graph.graph_def.node:
        inputs = graph.data_inputs(node)
        moved = [redirects.get(node_name(t), t) if graph.producer(t) is not None else t for t in inputs]
        if moved != inputs:
            graph.set_inputs(node, moved)
