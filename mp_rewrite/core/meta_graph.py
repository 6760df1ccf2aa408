"""What a MetaGraphDef (of a SavedModel) runs: the nodes its signatures name, and the library functions its
signatures compute with and its object graph restores. `convert` rewrites those functions; `inspect` the same ones,
so that both tell one story."""

from __future__ import annotations

from tensorflow.core.protobuf import meta_graph_pb2

from .functions import called_functions, reachable_functions
from .graph_view import parse_input

INTERNAL_PREFIX = "__saved_model"  # "__saved_model_init_op", "__saved_model_train_op": not user signatures


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
