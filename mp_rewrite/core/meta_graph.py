"""What a MetaGraphDef (of a SavedModel) runs: the nodes its signatures name, the nodes Grappler keeps for it, and
the library functions its signatures compute with and its object graph restores. `convert` rewrites those
functions; `inspect` the same ones, so that both tell one story."""

from __future__ import annotations

from google.protobuf import message
from tensorflow.core.framework import variable_pb2
from tensorflow.core.protobuf import meta_graph_pb2, queue_runner_pb2, saver_pb2

from .functions import called_functions, reachable_functions
from .graph_view import parse_input

INTERNAL_PREFIX = "__saved_model"  # "__saved_model_init_op", "__saved_model_train_op": not user signatures
# GrapplerItemFromMetaGraphDef takes the initializers of the variables in these collections as init ops.
VARIABLE_COLLECTIONS = ("variables", "local_variables", "model_variables", "trainable_variables")


def _tensor_names(info) -> list[str]:
    """Every tensor name a TensorInfo refers to (dense, sparse or composite)."""
    kind = info.WhichOneof("encoding")
    if kind == "name":
        return [info.name]
    if kind == "coo_sparse":
        sparse = info.coo_sparse
        return [sparse.values_tensor_name, sparse.indices_tensor_name, sparse.dense_shape_tensor_name]
    if kind == "composite_tensor":
        return [n for component in info.composite_tensor.components for n in _tensor_names(component)]
    return []


def signature_nodes(meta_graph: meta_graph_pb2.MetaGraphDef, keys=None, outputs_only: bool = False) -> list[str]:
    """Main-graph node names of the signatures' tensors (all signatures when keys is None)."""
    names = []
    for key, sig in meta_graph.signature_def.items():
        if keys is None or key in keys:
            infos = list(sig.outputs.values()) + ([] if outputs_only else list(sig.inputs.values()))
            names += [parse_input(t)[0] for info in infos for t in _tensor_names(info) if t]
    return list(dict.fromkeys(names))


def _upstream_nodes(graph_def, roots) -> list:
    """The NodeDefs the roots depend on (data and control inputs), the roots included."""
    nodes = {n.name: n for n in graph_def.node}
    seen, stack = set(), [r for r in roots if r in nodes]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(parse_input(t.lstrip("^"))[0] for t in nodes[name].input)
    return [nodes[n] for n in seen if n in nodes]


def functions_to_rewrite(meta_graph: meta_graph_pb2.MetaGraphDef, keys=None) -> list[str]:
    """Library functions to rewrite, callers before callees: those the signatures' outputs compute with (the
    selected `keys`, or every user signature), plus, when keys is None, those the object graph restores."""
    graph = meta_graph.graph_def
    library = {f.signature.name for f in graph.library.function}
    selected = [k for k in meta_graph.signature_def if keys is None or k in keys]
    outputs = signature_nodes(meta_graph, [k for k in selected if not k.startswith(INTERNAL_PREFIX)], True)
    roots = called_functions(_upstream_nodes(graph, outputs), library)
    if keys is None:
        roots += list(meta_graph.object_graph_def.concrete_functions)
    return reachable_functions(graph.library, roots)


def nodes_to_preserve(meta_graph: meta_graph_pb2.MetaGraphDef) -> dict[str, str]:
    """The main-graph nodes Grappler preserves when it optimizes this MetaGraphDef, each with why.

    GrapplerItemFromMetaGraphDef + GrapplerItem::NodesToPreserve: the fetches (the "train_op" collection and the
    signatures' outputs), the feeds (the signatures' inputs and every Placeholder), every node a collection's
    node_list names (keep_ops), the initializers of the variables in the variable collections and the
    "table_initializer" collection (init_ops), the saver's save, restore and filename nodes (the first usable
    SaverDef of the "savers" collection, else saver_def), and the queue runners' enqueue, close and cancel ops;
    and the asset tensors a SavedModel loader feeds.
    Names of nodes the graph does not hold are left out.
    """
    why = {}

    def add(tensors, reason: str) -> None:
        for tensor in tensors:
            if tensor:
                why.setdefault(parse_input(tensor.lstrip("^"))[0], reason)
    for key, sig in meta_graph.signature_def.items():
        add([t for info in sig.outputs.values() for t in _tensor_names(info)], f"output of signature '{key}'")
        add([t for info in sig.inputs.values() for t in _tensor_names(info)], f"input of signature '{key}' (fed)")
    collections = meta_graph.collection_def
    for name, collection in collections.items():
        add(collection.node_list.value, f"named in the MetaGraphDef's collection '{name}' (Grappler keeps it)")
    for name, variable in collection_variables(meta_graph):
        add([variable.initializer_name], f"initializer of a variable in collection '{name}'")
    add(_saver_nodes(meta_graph), "save or restore op of the MetaGraphDef's saver")
    for raw in collections["queue_runners"].bytes_list.value if "queue_runners" in collections else ():
        runner = _parsed(queue_runner_pb2.QueueRunnerDef, raw)
        if runner:
            add([*runner.enqueue_op_name, runner.close_op_name, runner.cancel_op_name], "queue runner op")
    add([n.name for n in meta_graph.graph_def.node if n.op == "Placeholder"], "placeholder (Grappler feeds it)")
    add([a.tensor_info.name for a in meta_graph.asset_file_def], "asset file path (the SavedModel loader feeds it)")
    present = {n.name for n in meta_graph.graph_def.node}
    return {name: reason for name, reason in why.items() if name in present}


def collection_variables(meta_graph: meta_graph_pb2.MetaGraphDef) -> list:
    """[(collection name, VariableDef)] of the MetaGraphDef's variable collections (entries that do not parse are
    left out)."""
    collections = meta_graph.collection_def
    return [(name, variable) for name in VARIABLE_COLLECTIONS if name in collections
            for variable in (_parsed(variable_pb2.VariableDef, raw) for raw in collections[name].bytes_list.value)
            if variable]


def _parsed(cls, raw: bytes):
    try:
        return cls.FromString(raw)
    except message.DecodeError:
        return None


def _saver_nodes(meta_graph: meta_graph_pb2.MetaGraphDef) -> list[str]:
    if "savers" in meta_graph.collection_def:
        savers = [_parsed(saver_pb2.SaverDef, raw) for raw in meta_graph.collection_def["savers"].bytes_list.value]
        saver = next((s for s in savers if s and s.filename_tensor_name), None)
    else:
        saver = meta_graph.saver_def
    if saver is None:
        return []
    return [saver.save_tensor_name, saver.restore_op_name, saver.filename_tensor_name]
