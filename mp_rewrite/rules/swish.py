"""`swish`: `Mul(x, Sigmoid(x))` with both reading the same node, so that TF's remapper sees swish.

Keras 3 computes swish as `x * sigmoid(beta * x)`; with beta = 1 Grappler folds the product into an Identity that
waits for beta's constant, and the remapper, which matches `Mul(Sigmoid(BiasAdd), BiasAdd)` (into `_FusedConv2D`
with `_MklSwish` after a Conv2D, `_MklSwish` elsewhere), sees a Sigmoid of an Identity instead. Exact: the
Identities forward the same tensor. (The IdentityN Keras adds for swish's gradient is rules/identity.py's.)
"""

from __future__ import annotations

from .graph import EditableGraph
from .record import Match


def match_swish(graph: EditableGraph, mul) -> Match | None:
    """A Mul of x and Sigmoid(x) where either reads x through Identities; None when both read it directly."""
    inputs = graph.data_inputs(mul)
    if len(inputs) != 2:
        return None
    for x, other in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        sigmoid = graph.producer(other)
        if sigmoid is None or sigmoid.op != "Sigmoid":
            continue
        source = graph.forwarded(x)
        if graph.forwarded(sigmoid.input[0]) != source or (x == source and sigmoid.input[0] == source):
            continue
        producer = graph.producer(source)
        contraction = graph.producer(producer.input[0]) if producer is not None and producer.op == "BiasAdd" \
            else None
        fusion = "Conv2D + BiasAdd + Swish" if contraction is not None and contraction.op == "Conv2D" else \
            "Swish (_MklSwish)"
        return Match(nodes={"mul": mul, "sigmoid": sigmoid}, values={"x": source, "fusion": fusion})
    return None


def rewrite_swish(graph: EditableGraph, match: Match) -> str:
    """The Mul and its Sigmoid read x itself."""
    mul, sigmoid, x = match.nodes["mul"], match.nodes["sigmoid"], match.values["x"]
    graph.set_inputs(sigmoid, [x])
    graph.set_inputs(mul, [x, sigmoid.name])
    return f"'{mul.name}' and '{sigmoid.name}' read '{x}' directly"
