"""Freezing models of any size: the weights stay variables of the output SavedModel instead of graph constants.

protobuf refuses to serialize a message over 2 GB, and a frozen graph holds every weight in one GraphDef: a
600M-parameter model (GPT-2 large, T5-large) cannot be frozen into constants. Here the signature's functions are
still inlined into one graph and folded, canonicalized and rewritten as for constants, but every variable it reads
stays a captured resource: a `ReadVariableOp` whose only consumers are Casts to the low precision becomes a read
of a low-precision variable (made once, here, from the float32 one: the Casts no longer run per call), and the
output SavedModel saves those variables in its checkpoint (variables/), about half the source's size. Weights are
converted one at a time, so the conversion holds the float32 model and the low-precision copy, not more.
"""

from __future__ import annotations

from ..core.dtypes import FLOAT, LOW
from ..errors import ModelError


def variable_captures(signature, loaded) -> dict:
    """{capture placeholder name: the variable} for every variable the signature reads (its captured handles)."""
    by_handle = {id(v.handle): v for v in signature.graph.variables}
    return {internal.name.split(":")[0]: by_handle[id(external)] for external, internal in signature.graph.captures
            if id(external) in by_handle}


def lower_variable_reads(graph_def, variables: dict, key: str, weights: str = "keep") -> dict:
    """Make every read of a float32 variable whose consumers are all Casts to one low precision a read in that
    precision (in place): the Casts go, their consumers read the ReadVariableOp.

    Args:
        graph_def: the rewritten graph (ours, edited in place).
        variables: {capture placeholder name: variable}, see variable_captures.
        key: the signature (for errors).
        weights: "low" refuses a variable also read in float32 (as check_weights_low does for constants).

    Returns:
        {capture placeholder name: the low DataType enum} for the variables to store in low precision.

    Raises:
        ModelError: with weights="low", a variable read in float32 too (named).
    """
    nodes = {n.name: n for n in graph_def.node}
    consumers = {}
    for node in graph_def.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name.split(":")[0], []).append((node, i))
    reads = {}
    for node in graph_def.node:
        source = _handle_source(node.input[0], nodes) if node.op == "ReadVariableOp" and node.input else None
        if source in variables:
            reads.setdefault(source, []).append(node)
    lowered = {}
    for placeholder, readers in reads.items():
        targets = {_low_cast_target(consumers.get(r.name, [])) for r in readers}
        if len(targets) != 1 or None in targets or readers[0].attr["dtype"].type != FLOAT:
            if weights == "low":
                raise ModelError(f"--weights low: signature '{key}' reads variable '{variables[placeholder].name}' in "
                                 "float32 too, so it cannot be stored in low precision only; drop --weights low")
            continue
        target = targets.pop()
        for read in readers:
            read.attr["dtype"].type = target
            for cast, _ in consumers.get(read.name, []):
                _bypass(cast, read.name, consumers)
                graph_def.node.remove(nodes[cast.name])
        lowered[placeholder] = target
    return lowered


def _handle_source(name: str, nodes: dict) -> str:
    """The node a resource handle comes from, through the Identity nodes function inlining leaves on the way."""
    node = nodes.get(name.split(":")[0])
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    return node.name if node is not None else name


def _low_cast_target(uses) -> int | None:
    """The low DataType every consumer Casts to, or None when a consumer is not such a Cast."""
    targets = {node.attr["DstT"].type if node.op == "Cast" and node.attr["DstT"].type in LOW else None
               for node, _ in uses}
    return targets.pop() if len(targets) == 1 and uses else None


def _bypass(cast, source: str, consumers: dict) -> None:
    """Make the Cast's consumers read `source` instead."""
    for node, index in consumers.get(cast.name, []):
        name = node.input[index]
        node.input[index] = source + (name[len(cast.name):] if name.startswith(cast.name + ":") else "")


def stored_variables(variables: dict, lowered: dict) -> dict:
    """{capture placeholder name: the variable the output saves}: a low-precision copy where the reads were
    lowered (made one at a time), the source's own variable otherwise."""
    import tensorflow as tf

    stored = {}
    for placeholder, variable in variables.items():
        if placeholder in lowered:
            value = tf.cast(variable, tf.dtypes.as_dtype(lowered[placeholder]))
            stored[placeholder] = tf.Variable(value, trainable=False, name=variable.name.split(":")[0])
            del value
        else:
            stored[placeholder] = variable
    return stored
