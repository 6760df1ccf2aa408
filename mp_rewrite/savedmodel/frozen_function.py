"""A frozen graph made small and callable again: pruned to what its outputs need, low-precision constants stored as
raw bytes, and imported into one `tf.function` with the signature's interface (the form `tf.saved_model.save`
writes)."""

from __future__ import annotations

import itertools
import os

from ..core.dtypes import LOW
from ..rules.graph import reachable

_IMPORTS = itertools.count()  # a fresh suffix per imported graph, unique in the process


def compact(graph_def, fetches):
    """Drop what the fetches no longer need (the float32 originals of folded weights) and store low-precision
    constants as raw bytes (Grappler writes them as one varint per value). Works in place on a graph of ours."""
    import tensorflow as tf

    # A control dependency on a constant orders nothing; frozen Keras graphs keep the weight reads' (now Consts)
    # behind NoOps, which would keep the float32 originals alive.
    consts = {n.name for n in graph_def.node if n.op == "Const"}
    for node in graph_def.node:
        kept = [i for i in node.input if not (i.startswith("^") and i[1:] in consts)]
        if len(kept) != len(node.input):
            del node.input[:]
            node.input.extend(kept)
    prune(graph_def, fetches)
    for node in graph_def.node:
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is not None and tensor.dtype in LOW and not tensor.tensor_content:
            # TensorFlow's parser reads the varints in C++ (numpy's fromiter over them took 2.7 s on ResNet-50).
            values = tf.io.parse_tensor(tensor.SerializeToString(), tf.dtypes.as_dtype(tensor.dtype)).numpy()
            tensor.ClearField("half_val")
            tensor.tensor_content = values.tobytes()
    return graph_def


def prune(graph_def, fetches):
    """Remove, in place, every node the fetches do not depend on (through data or control inputs); return it."""
    needed = reachable(graph_def, fetches)
    # Deleting in place: copying the kept nodes into a new GraphDef would copy every weight once more.
    for index in reversed([i for i, n in enumerate(graph_def.node) if n.name not in needed]):
        del graph_def.node[index]
    return graph_def


def _renamed_functions(graph_def, suffix: str):
    """A copy of `graph_def` whose library functions (and every reference to them) end in `suffix`.

    The frozen signature's original bodies stay registered in the eager context under their names; importing a
    rewritten body under the same name is refused ("duplicate function ... definitions differ").
    """
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    names = {f.signature.name: f.signature.name + suffix for f in out.library.function}

    def rename(nodes):
        for node in nodes:
            for value in node.attr.values():
                if value.HasField("func") and value.func.name in names:
                    value.func.name = names[value.func.name]
                for func in value.list.func:
                    func.name = names.get(func.name, func.name)
    rename(out.node)
    for function in out.library.function:
        function.signature.name = names[function.signature.name]
        rename(function.node_def)
    for gradient in out.library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)
    return out


def as_function(graph_def, inputs, outputs: dict, captured=(), shapes=None):
    """A tf.function with the signature's input names and specs that runs `graph_def` and returns `outputs` (with
    the static `shapes` of the signature's outputs, where given), its `captured` placeholders fed with the resource
    handles of their owners (tables, or variables)."""
    import tensorflow as tf

    imported, specs = imported_function(graph_def, inputs, outputs, captured)
    fetch_keys = list(outputs)

    @tf.function(input_signature=specs, autograph=False)
    def run(*args):
        return shaped_outputs(fetch_keys, imported(*args), shapes)

    return run


def shaped_outputs(keys, tensors, shapes=None) -> dict:
    """{output key: tensor}, each with the static shape the signature promises (`shapes`, where given): a shape
    Grappler computed from folded weights, kept where a call of the imported graph (or a tf.cond over several)
    does not carry it."""
    results = dict(zip(keys, tensors))
    for key, shape in (shapes or {}).items():
        results[key].set_shape(shape)
    return results


def imported_function(graph_def, inputs, outputs: dict, captured=()):
    """(a concrete function running `graph_def` on the signature's inputs, in order, and returning the `outputs`'
    tensors in their order; the inputs' TensorSpecs). The graph is imported once: callers call it, so that saving
    (which traces them again) stores the weights once."""
    import tensorflow as tf

    feeds = [name for _, name in inputs]
    fetch_keys = list(outputs)
    graph_def = _renamed_functions(graph_def, f"_mp_rewrite_{next(_IMPORTS)}")
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec, _ in inputs]

    @tf.function(autograph=False)
    def body(*args):
        # tf.identity captures the handle (import_graph_def takes graph tensors only).
        handles = {name: tf.identity(owner.handle if isinstance(owner, tf.Variable) else owner.resource_handle)
                   for name, owner in captured}
        return tf.graph_util.import_graph_def(graph_def, input_map={**dict(zip(feeds, args)), **handles},
                                              return_elements=[outputs[k] for k in fetch_keys], name="frozen")

    return body.get_concrete_function(*specs), specs


def remove_tree(directory) -> None:
    """Remove a temporary directory made by freeze_signatures (quietly: it is ours and only temporary)."""
    import shutil
    if directory and os.path.isdir(directory):
        shutil.rmtree(directory, ignore_errors=True)
