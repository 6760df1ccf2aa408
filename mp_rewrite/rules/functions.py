"""The rules in a SavedModel's function library, its weights kept as variables (the in-place conversion).

Each function body a MetaGraph's signatures (and object graph) run goes GraphDef -> `canonicalize` -> FunctionDef,
with what a body does not state given to the rules: the shape of each variable it reads (the object graph binds a
concrete function's last inputs to its variables: `SavedConcreteFunction.bound_inputs`, each a `SavedVariable` with
its shape) and the shape of each of its other inputs (the arguments' `_output_shapes`). The rules that need weight
values (BatchNorm folding, constant LayerNorm parameters, the attention scale) decline or do not match there; what
needs only shapes (Dense on 3-D inputs as MatMul + BiasAdd, GELU, activations, static Reshapes) applies, so the
functions run the kernels TensorFlow's remapper fuses while the variables, checkpoint and object graph stay as
they are. Protos only; nothing is run.
"""

from __future__ import annotations

from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from ..core.functions import function_to_graph, graph_to_function, is_polymorphic
from ..core.library import skipped_functions
from ..core.meta_graph import functions_to_rewrite
from ..core.op_support import Signatures
from .canonical import RULES, canonicalize
from .record import DECLINED, Record


def canonicalize_library(meta_graph, keys=None, rules=RULES) -> tuple[object, dict]:
    """Canonicalize every function body the rewrite of `meta_graph` reaches (core.meta_graph.functions_to_rewrite).

    Args:
        meta_graph: a MetaGraphDef (never modified).
        keys: signature keys whose functions to canonicalize; None: every signature and the object graph's
            functions, as the rewrite takes them.
        rules: the rules to run (canonical.RULES before the precision pass, PLACEMENT_RULES after it).

    Returns:
        (a new MetaGraphDef, {function name: [Record]} for each body where a rule applied or declined).
    """
    new = meta_graph_pb2.MetaGraphDef()
    new.CopyFrom(meta_graph)
    library = new.graph_def.library
    skipped = skipped_functions(library)
    index = {f.signature.name: i for i, f in enumerate(library.function)}
    signatures = Signatures(library)
    records = {}
    captured = {}  # tensors of a function the object graph names (restored as captured tensors): their names stay
    for node in meta_graph.object_graph_def.nodes:
        if node.WhichOneof("kind") == "captured_tensor":
            captured.setdefault(node.captured_tensor.concrete_function, []).append(node.captured_tensor.name)
    for name in functions_to_rewrite(meta_graph, keys):
        fdef = library.function[index[name]] if name in index else None
        if fdef is None or name in skipped or is_polymorphic(fdef):
            continue
        body = function_to_graph(fdef, signatures)
        named = captured.get(name, ())
        graph_def, done = canonicalize(body.graph_def, (*body.retvals, *body.control_outputs), rules,
                                       fold_batch_norms=False, shapes=body_shapes(meta_graph, fdef), alive=named)
        lost = sorted({t.split(":")[0] for t in named} - {n.name for n in graph_def.node})
        if lost and any(record.applied for record in done):  # the object graph could not restore the function
            done = [Record("functions", name, DECLINED, f"the rules removed '{lost[0]}', a tensor the object graph "
                           "restores by name; the function is left as it was")]
        elif any(record.applied for record in done):
            library.function[index[name]].CopyFrom(graph_to_function(graph_def, fdef, signatures))
        if done:
            records[name] = done
    return new, records


def body_shapes(meta_graph, fdef) -> dict:
    """{argument name: shape} of a function's inputs: its variables' (object graph) and the others' stated ones."""
    shapes = {}
    args = fdef.signature.input_arg
    for i, arg in enumerate(args):
        attrs = fdef.arg_attr[i].attr if i in fdef.arg_attr else {}
        # `in` first: reading an absent key of a protobuf map inserts an empty value, which TF refuses to run
        stated = attrs["_output_shapes"].list.shape if "_output_shapes" in attrs else ()
        if arg.type != types_pb2.DT_RESOURCE and len(stated) == 1 and not stated[0].unknown_rank:
            shapes[arg.name] = [d.size if d.size >= 0 else None for d in stated[0].dim]
    saved = meta_graph.object_graph_def.concrete_functions.get(fdef.signature.name)
    bound = list(saved.bound_inputs) if saved is not None else []
    nodes = meta_graph.object_graph_def.nodes
    for arg, node_id in zip(args[len(args) - len(bound):], bound):
        if node_id < len(nodes) and nodes[node_id].WhichOneof("kind") == "variable":
            shapes[arg.name] = [d.size for d in nodes[node_id].variable.shape.dim]
    return shapes
