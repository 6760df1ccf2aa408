"""Activations as regions: the elementwise nodes after a tensor that compute one function of it (GELU is five or
more nodes), found by what they are (elementwise, every other input a scalar constant, one way out), not by one
spelling of each activation. TensorFlow's remapper matches each spelling itself; moving a region whole past a
Reshape is exact whatever the spelling, because elementwise ops of scalars do not care about shape."""

from __future__ import annotations

from .graph import EditableGraph
from .record import Match

UNARY = frozenset({"Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Tanh", "Sigmoid", "Erf", "Erfc", "Neg", "Square",
                   "Exp", "Softplus", "Softsign"})
BINARY = frozenset({"Mul", "AddV2", "Add", "Sub", "RealDiv", "Pow", "Maximum", "Minimum"})
MAX_NODES = 16  # the largest spelling, tanh-approximated GELU with Pow, has 9 nodes
SINGLE = ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid")  # what the remapper fuses as one op
GELUS = ("GeluExact", "GeluApproximate")  # what it fuses after a MatMul as several


def activation_region(graph: EditableGraph, start) -> Match | None:
    """The elementwise region that reads `start` and has one node whose output leaves it.

    Returns:
        None when no elementwise node reads `start`; else a Match with values "region" (the region's nodes, in
        graph order) and nodes "exit" (the node whose output leaves the region), or a declined Match saying why.
    """
    region = _grow(graph, start)
    if not region:
        return None
    names = {node.name for node in region} | {start.name}
    if any(reader.name not in names for reader in graph.readers(start.name)) or graph.is_kept(start):
        return Match().fail(f"'{start.name}' is also read outside its activation")
    if len(region) > MAX_NODES:
        return Match().fail(f"the elementwise region after '{start.name}' has {len(region)} nodes (> {MAX_NODES})")
    exits = [node for node in region
             if graph.is_kept(node) or any(r.name not in names for r in graph.readers(node.name))
             or not graph.readers(node.name)]
    if len(exits) != 1:
        return Match().fail(f"the activation after '{start.name}' has {len(exits)} outputs "
                            f"({', '.join(n.name for n in exits)}); one is needed")
    return Match(nodes={"exit": exits[0]}, values={"region": region})


def _grow(graph: EditableGraph, start) -> list:
    """The elementwise nodes reachable from `start` whose inputs are `start`, the region or scalar constants."""
    found = {start.name: start}
    changed = True
    while changed and len(found) <= MAX_NODES + 1:
        changed = False
        for node in list(found.values()):
            for reader in graph.readers(node.name):
                if reader.name not in found and _elementwise_of(graph, reader, found, start):
                    found[reader.name] = reader
                    changed = True
    order = {id(node): i for i, node in enumerate(graph.graph_def.node)}
    return sorted((n for n in found.values() if n is not start), key=lambda n: order[id(n)])


def _elementwise_of(graph: EditableGraph, node, found: dict, start) -> bool:
    """Whether `node` is an elementwise op of the region's type whose data inputs are region outputs (port 0) or
    constants of one value that cannot raise the rank (at most 2-D)."""
    if node.op not in UNARY | BINARY or graph.is_kept(node):
        return False
    if node.attr["T"].type != start.attr["T"].type:
        return False
    for tensor in graph.data_inputs(node):
        producer = graph.producer(tensor)
        if producer is not None and producer.name in found:
            continue
        value = graph.constant(tensor)
        if value is None or value.size != 1 or value.ndim > 2:
            return False
    return True


def activation_name(region: list) -> str:
    """What TensorFlow's remapper calls the activation the region computes (in `fused_ops`), by its ops."""
    ops = sorted(node.op for node in region)
    if len(ops) == 1 and ops[0] in SINGLE:
        return ops[0]
    if "Erf" in ops or "Erfc" in ops:
        return "GeluExact"
    if "Tanh" in ops and ("Pow" in ops or "Square" in ops):
        return "GeluApproximate"
    if ops == ["Mul", "Sigmoid"]:
        return "Swish"
    return "elementwise " + "+".join(ops)
