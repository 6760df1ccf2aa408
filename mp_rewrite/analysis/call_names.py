"""How TensorFlow names the nodes it runs: a function body's nodes under the names of the call nodes that lead to
them. A TF1 session inlines every PartitionedCall / StatefulPartitionedCall of a SavedModel's main graph, so a body's
node runs as "StatefulPartitionedCall_1/StatefulPartitionedCall/name"; a TF2 signature call runs its function with
the calls inside it inlined the same way, one level down (analysis.served_trace adds the main graph's call node
back, so that both are named alike). Step stats and profiler events give those names; these map them back to the
graph and function body each node belongs to.
"""

from __future__ import annotations

from ..core.graph_view import parse_input
from .graph_costs import MAIN

INLINED_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})  # what a TF1 session inlines
MAX_PREFIXES = 8  # call sites followed per function


def inlined_prefixes(graph_def) -> dict:
    """{label: [prefix]}: how a TF1 session names the nodes of each function it inlines -- the names of the call
    nodes that lead to it, joined by "/" ("" for the main graph). A function called from two places has two."""
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    prefixes, stack = {MAIN: [""]}, [("", graph_def.node)]
    while stack:
        prefix, nodes = stack.pop()
        for node in nodes:
            called = node.attr["f"].func.name if node.op in INLINED_CALLS else ""
            if called in fdefs and len(prefixes.get(called, ())) < MAX_PREFIXES:
                prefixes.setdefault(called, []).append(f"{prefix}{node.name}/")
                stack.append((f"{prefix}{node.name}/", fdefs[called].node_def))
    return prefixes


def call_nodes(meta_graph, called) -> dict:
    """{signature key: "name/"} of the main graph's function call node each called signature's outputs all come
    from (a TF2 export's), or {} when some signature computes in the main graph itself (a TF1 export's): TF2 then
    serves it as a function pruned from that graph, whose nodes are named otherwise, and it is timed in a TF1
    session."""
    ops = {node.name: node.op for node in meta_graph.graph_def.node}
    found = {}
    for key in called:
        nodes = {parse_input(info.name)[0] for info in meta_graph.signature_def[key].outputs.values()}
        if len(nodes) != 1 or ops.get(next(iter(nodes))) not in INLINED_CALLS:
            return {}
        found[key] = f"{nodes.pop()}/"
    return found


def executed_names(graph_def, prefixes: dict) -> dict:
    """{executed node name: (graph label, node name, op)}: the main graph's nodes as they are, a function body's
    under each prefix a TF1 session inlines it by (inlined_prefixes)."""
    out = {node.name: (MAIN, node.name, node.op) for node in graph_def.node}
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    for label, called in prefixes.items():
        if label == MAIN or label not in fdefs:
            continue
        for prefix in called:
            out.update((prefix + node.name, (label, node.name, node.op)) for node in fdefs[label].node_def)
    return out
