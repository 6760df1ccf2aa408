"""`gelu`: a GELU after `MatMul + BiasAdd`, however it is spelled, rewritten in the spelling TensorFlow's remapper
fuses into `_FusedMatMul` (fused_ops [BiasAdd, GeluExact] or [BiasAdd, GeluApproximate]).

The remapper matches one spelling per form, by op types and constant values. Keras 3 and `tf.nn.gelu` write the
exact GELU as `0.5 * x * erfc(-x / sqrt 2)`; after `--freeze`'s constant folding and arithmetic optimization
neither that nor the tanh approximation is in the spelling the remapper matches any more (measured on TF 2.21), so
nothing is fused. The region is recognized by what it computes, not by how: it is evaluated (float64) at points
over [-8, 8] and compared with both GELUs, then replaced by the canonical spelling, which computes the same
function (float rounding apart).
"""

from __future__ import annotations

import math

import numpy as np

from .activation import activation_region
from .evaluate import erf, evaluate
from .graph import EditableGraph
from .record import Match

POINTS = np.linspace(-8.0, 8.0, 161)
TOLERANCE = 1e-5  # relative to max(1, |x|): float32 constants in the graph differ from the exact ones by ~1e-8
MARK = "/gelu_form/"  # the canonical spelling's nodes are named <output>/gelu_form/<role>
SQRT_HALF, SQRT_2_OVER_PI, CUBIC = 0.7071067811865476, math.sqrt(2.0 / math.pi), 0.044715
ARITHMETIC_MARK = "_grappler_ArithmeticOptimizer_MinimizeBroadcasts"


def gelu_exact(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x * SQRT_HALF))


def gelu_approximate(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + CUBIC * x ** 3)))


def match_gelu(graph: EditableGraph, bias) -> Match | None:
    """A GELU region after `BiasAdd(MatMul)` not yet in the canonical spelling; None if there is none."""
    matmul = graph.producer(bias.input[0])
    if matmul is None or matmul.op != "MatMul":
        return None
    found = activation_region(graph, bias)
    if found is None or not found.ok:
        return None
    region, exit_node = found.values["region"], found.nodes["exit"]
    if len(region) < 3 or all(MARK in n.name for n in region if n is not exit_node):
        return None  # a one-op activation, or already canonical
    values = evaluate(graph, bias, region, exit_node, POINTS)
    if values is None:
        return None
    for form, function in (("GeluExact", gelu_exact), ("GeluApproximate", gelu_approximate)):
        if np.all(np.abs(values - function(POINTS)) <= TOLERANCE * np.maximum(1.0, np.abs(POINTS))):
            return Match(nodes={"bias": bias, "exit": exit_node}, values={"region": region, "form": form})
    return None


def rewrite_gelu(graph: EditableGraph, match: Match) -> str:
    """Replace the region by the canonical spelling; its last node takes the old output's name."""
    bias, exit_node, form = match.nodes["bias"], match.nodes["exit"], match.values["form"]
    name, dtype, device = exit_node.name, exit_node.attr["T"].type, exit_node.device
    old = [n.name for n in match.values["region"]]
    graph.remove(old)  # only the region read them; the output's readers will read the new node of its name
    emit = _Emitter(graph, f"{name}{MARK}", dtype, device)
    x = bias.name
    if form == "GeluExact":
        scaled = emit.op("scaled", "Mul", x, emit.const("sqrt_half", SQRT_HALF))
        erf = emit.op("erf", "Erf", scaled)
        plus_one = emit.op("plus_one", "AddV2", erf, emit.const("one", 1.0))
        half = emit.op("half", "Mul", plus_one, emit.const("one_half", 0.5))
        emit.op(None, "Mul", x, half, name=name)
    else:
        # The remapper's own pattern (it matches it after fusing MatMul + BiasAdd, in its second pass).
        cubic = emit.op("cubic", "Mul", emit.op("times_c", "Mul", emit.const("c", CUBIC), x),
                        emit.op("square", "Square", x))
        inner = emit.op("inner", "AddV2", x, cubic)
        tanh = emit.op("tanh", "Tanh", emit.op("scaled", "Mul", inner, emit.const("sqrt_2_pi", SQRT_2_OVER_PI)))
        half = emit.op("half", "Mul", emit.op("plus_one", "AddV2", tanh, emit.const("one", 1.0)),
                       emit.const("one_half", 0.5))
        emit.op(None, "Mul", half, x, name=name)
    return f"rewrote the {len(old)}-node GELU after '{bias.name}' as the remapper's {form} spelling"


class _Emitter:
    """Adds the canonical spelling's nodes, all of one type and device, under one name prefix."""

    def __init__(self, graph: EditableGraph, prefix: str, dtype: int, device: str):
        self.graph, self.prefix, self.dtype, self.device = graph, prefix, dtype, device

    def const(self, role: str, value: float) -> str:
        import tensorflow as tf
        numpy_type = tf.dtypes.as_dtype(self.dtype).as_numpy_dtype
        return self.graph.add_constant(self.prefix + role, np.array(value, numpy_type), self.device).name

    def op(self, role, op: str, *inputs, name: str | None = None) -> str:
        node = self.graph.add_node(name or self.prefix + role, op, list(inputs), self.device)
        node.attr["T"].type = self.dtype
        if op in ("Mul", "AddV2"):
            # TF's arithmetic optimizer, which runs before the remapper, reorders chains of Muls and Adds
            # ("MinimizeBroadcasts") into an order the remapper's GELU patterns no longer match; this attribute is
            # its own mark for "already done", so it leaves the canonical order alone.
            node.attr[ARITHMETIC_MARK].b = True
        return node.name
