"""The rules in a TF1 SavedModel's main graph, its weights kept as variables (the in-place conversion).

A TF1 export (`tf.compat.v1.saved_model.Builder`, an Estimator) computes in its MetaGraph's main graph, which the
MetaGraph's other parts name node by node: the signatures' tensors, the collections (variables with their
initializers and snapshots, `train_op`, queue runners), the saver's save and restore ops. Those nodes keep their
name, op and output (they are the rules' fetches: `core.meta_graph.nodes_to_preserve`, which is what Grappler keeps,
and each variable's own nodes); the weights' shapes come from the variables' `shape` attributes, so the rules that
need only shapes apply as they do in a TF2 function body (rules.functions). A graph with TF1 control flow
(Switch/Merge/Enter frames, whose contexts the collections also describe node by node) is left as it is, with the
reason. A TF2 SavedModel's main graph only calls functions (it has an object graph) and is not touched here.
"""

from __future__ import annotations

from ..core.meta_graph import collection_variables, nodes_to_preserve
from .canonical import RULES, canonicalize
from .graph import node_name
from .record import DECLINED, Record

MAIN_GRAPH = ""  # the key of the main graph's records beside the functions' (a function always has a name)

V1_CONTROL_FLOW = frozenset({"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
                             "NextIteration", "RefNextIteration", "LoopCond"})
VARIABLE_OPS = ("VariableV2", "Variable", "VarHandleOp")


def canonicalize_main_graph(meta_graph, rules=RULES) -> tuple[object, list]:
    """Canonicalize the main graph of a TF1 MetaGraph (one without an object graph).

    Returns:
        (the MetaGraphDef, [Record]): a new MetaGraphDef where a rule applied, else `meta_graph` itself (never
        modified); the records of the rules applied and declined ([] for a TF2 MetaGraph).
    """
    if meta_graph.object_graph_def.nodes:
        return meta_graph, []
    graph = meta_graph.graph_def
    frames = sorted({node.op for node in graph.node if node.op in V1_CONTROL_FLOW})
    if frames:
        return meta_graph, [Record("main_graph", "main graph", DECLINED, f"the main graph has TF1 control flow "
                                   f"({', '.join(frames)}), whose contexts name its nodes; it is left as it was")]
    fetches = [*nodes_to_preserve(meta_graph), *_variable_nodes(meta_graph)]
    canonical, records = canonicalize(graph, fetches, rules, fold_batch_norms=False, shapes=_weight_shapes(graph))
    if not any(record.applied for record in records):
        return meta_graph, records
    new = type(meta_graph)()
    new.CopyFrom(meta_graph)
    del new.graph_def.node[:]
    new.graph_def.node.extend(canonical.node)
    return new, records


def _variable_nodes(meta_graph) -> list[str]:
    """The tensors the variable collections name (each VariableDef's variable, snapshot and initial value)."""
    return [tensor for _, variable in collection_variables(meta_graph)
            for tensor in (variable.variable_name, variable.snapshot_name, variable.initial_value_name) if tensor]


def _weight_shapes(graph_def) -> dict:
    """{node name: shape} of each variable and of each Identity that reads a ref variable (its snapshot, "w/read"):
    the shapes `EditableGraph.weight_shape` gives the rules for a weight that is not a constant."""
    shapes = {}
    for node in graph_def.node:
        if node.op in VARIABLE_OPS and "shape" in node.attr and not node.attr["shape"].shape.unknown_rank:
            shapes[node.name] = [d.size for d in node.attr["shape"].shape.dim]
    for node in graph_def.node:
        if node.op == "Identity" and node.input and node_name(node.input[0]) in shapes:
            shapes[node.name] = shapes[node_name(node.input[0])]
    return shapes
