"""`evaluate`: what a region of elementwise and reducing nodes computes, in float64 numpy, for inputs a rule picks.

Rules recognize activations and normalizations by what they compute, not by one spelling of them (GELU, LayerNorm):
they feed chosen points through the region and compare with the function they expect. Constants are read from the
graph at their own shapes, so per-channel scales broadcast as they do in TensorFlow.
"""

from __future__ import annotations

import math

import numpy as np

from .graph import EditableGraph

erf = np.vectorize(math.erf)  # the error function, elementwise

UNARY = {"Tanh": np.tanh, "Erf": erf, "Erfc": lambda v: 1.0 - erf(v), "Neg": np.negative, "Square": np.square,
         "Exp": np.exp, "Sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "Relu": lambda v: np.maximum(v, 0.0),
         "Relu6": lambda v: np.clip(v, 0.0, 6.0),
         "Softplus": lambda v: np.logaddexp(0.0, v), "Softsign": lambda v: v / (1.0 + np.abs(v)),
         "Rsqrt": lambda v: 1.0 / np.sqrt(v), "Sqrt": np.sqrt, "Reciprocal": lambda v: 1.0 / v,
         "Inv": lambda v: 1.0 / v, "Identity": lambda v: v, "StopGradient": lambda v: v, "Snapshot": lambda v: v}
BINARY = {"Mul": np.multiply, "AddV2": np.add, "Add": np.add, "Sub": np.subtract, "RealDiv": np.divide,
          "Pow": np.power, "Maximum": np.maximum, "Minimum": np.minimum,
          "SquaredDifference": lambda a, b: np.square(a - b)}
REDUCTIONS = {"Mean": np.mean}


def evaluate(graph: EditableGraph, start, region: list, exit_node, x: np.ndarray,
             given: dict | None = None) -> np.ndarray | None:
    """The region's output when `start`'s output is `x` (float64) and the nodes named in `given` output the values
    it maps them to (weights that are variables), or None if it uses an op this evaluator does not know or another
    non-constant input from outside the region."""
    values = {name: np.asarray(value, np.float64) for name, value in (given or {}).items()}
    values[start.name] = x.astype(np.float64)
    pending = list(region)
    while pending:
        ready = [n for n in pending if all(_value(graph, t, values) is not None for t in graph.data_inputs(n))]
        if not ready:
            return None
        for node in ready:
            result = _apply(node, [_value(graph, t, values) for t in graph.data_inputs(node)])
            if result is None:
                return None
            values[node.name] = result
            pending.remove(node)
    return values[exit_node.name]


def _value(graph: EditableGraph, tensor: str, values: dict):
    name = tensor.split(":")[0]
    if name in values:
        return values[name]
    constant = graph.constant(tensor)
    if constant is None:
        return None
    # a one-value constant of any rank is a scalar to the region (it cannot raise the rank of what it scales)
    return constant.astype(np.float64).reshape(()) if constant.size == 1 else constant.astype(np.float64)


def _apply(node, args: list):
    with np.errstate(all="ignore"):
        if node.op in UNARY and len(args) == 1:
            return UNARY[node.op](args[0])
        if node.op in BINARY and len(args) == 2:
            return BINARY[node.op](args[0], args[1])
        if node.op == "AddN" and args:
            return sum(args[1:], args[0])
        if node.op in REDUCTIONS and len(args) == 2:
            axes = tuple(int(a) for a in np.atleast_1d(args[1]))
            return REDUCTIONS[node.op](args[0], axis=axes, keepdims=node.attr["keep_dims"].b)
    return None
