"""Whether a graph the rules rewrote is still one TensorFlow takes: the check every rewritten graph passes before it
goes on (`canonical.canonicalize` leaves out the rule that fails it).

A rule is proven on the models it was written around; on a model it was not, its rewrite might leave an input that
names a removed node, a node whose stated `_output_shapes` are its old shapes, or a graph TensorFlow's importer
refuses. Any of those would surface later as a traceback or as a model that does not load, far from its cause. The
check names the fault and the nodes it concerns, so the caller can tell which rule made it.
"""

from __future__ import annotations

import dataclasses
import re

from .graph import imported, node_name

_NAMED = re.compile(r"[Nn]ode '([^']+)'")


@dataclasses.dataclass(frozen=True)
class Fault:
    """Why TensorFlow would not take a graph.

    Attributes:
        reason: one line, as a user reads it.
        nodes: the names of the nodes the fault concerns (to find the rule that made it).
    """

    reason: str
    nodes: frozenset


def drop_stale_shapes(graph_def, before, shapes=None) -> int:
    """Remove (in place) the `_output_shapes` of `graph_def` that may no longer be true: those of every node that is
    not in `before` as it is now (a node the rules added, renamed or gave other inputs), then those that disagree
    with TensorFlow's own inference of the graph without them (a node downstream of a rewrite whose shape changed).
    TF's importer takes a node's stated shapes over its inference, and refuses them where they disagree.

    Args:
        graph_def: the rewritten GraphDef (edited in place).
        before: the GraphDef the rules were given.
        shapes: {node name: shape} of the weights and arguments the graph does not state.

    Returns:
        how many nodes lost their `_output_shapes`.
    """
    import tensorflow as tf
    was = {node.name: (node.op, tuple(node.input)) for node in before.node}
    dropped = 0
    for node in graph_def.node:
        if "_output_shapes" in node.attr and was.get(node.name) != (node.op, tuple(node.input)):
            del node.attr["_output_shapes"]
            dropped += 1
    if not dropped and len(was) == len(graph_def.node):
        return 0
    try:
        inferred = imported(graph_def, shapes or {}, stated_shapes=False)
    except (ValueError, TypeError, tf.errors.OpError):
        return dropped  # graph_fault will say why
    for node in graph_def.node:
        if "_output_shapes" in node.attr and not _agrees(node, inferred):
            del node.attr["_output_shapes"]
            dropped += 1
    return dropped


def _agrees(node, graph) -> bool:
    """Whether the node's stated `_output_shapes` are compatible with TF's inference in `graph`."""
    import tensorflow as tf
    try:
        outputs = graph.get_operation_by_name(node.name).outputs
    except (KeyError, ValueError):
        return True  # not imported as itself (a weight as a Placeholder, an _Arg, a _Retval)
    stated = node.attr["_output_shapes"].list.shape
    return len(stated) == len(outputs) and all(
        tf.TensorShape(shape).is_compatible_with(output.shape) for shape, output in zip(stated, outputs))


def graph_fault(graph_def, fetches=(), shapes=None) -> Fault | None:
    """The first reason TensorFlow would not take `graph_def`, or None.

    Args:
        graph_def: a GraphDef (a function body with _Arg/_Retval nodes, or a main graph); not modified.
        fetches: tensor or node names that must name a node.
        shapes: {node name: shape} of the weights and arguments the graph does not state (as the rules were given).

    Returns:
        a Fault: an input or fetch that names no node, or what TensorFlow's importer says of the graph.
    """
    import tensorflow as tf
    orphan = orphaned_input(graph_def, fetches)
    if orphan is not None:
        return orphan
    try:
        imported(graph_def, shapes or {})
    except (ValueError, TypeError, tf.errors.OpError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return Fault(f"TensorFlow does not import it ({message})", frozenset(_NAMED.findall(message)))
    return None


def orphaned_input(graph_def, fetches=()) -> Fault | None:
    """The first output or input of `graph_def` that names no node (graph_fault's check of the structure alone,
    which needs no TensorFlow), or None."""
    names = {node.name for node in graph_def.node}
    for fetch in fetches:
        if node_name(fetch) not in names:
            return Fault(f"the output '{fetch}' names no node", frozenset({node_name(fetch)}))
    for node in graph_def.node:
        for tensor in node.input:
            if node_name(tensor) not in names:
                return Fault(f"node '{node.name}' reads '{tensor}', which no node produces",
                             frozenset({node.name, node_name(tensor)}))
    return None
