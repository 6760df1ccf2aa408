"""`convert --freeze`: an inference SavedModel whose signatures run frozen, folded, mixed precision graphs.

For each signature: TensorFlow's variable folding turns the variables it reads into constants; Grappler's constant
folding and arithmetic optimizer (`tf_optimizer.OptimizeGraph`) fold what that makes foldable; per-channel scales and
shifts after a convolution or matmul (BatchNormalization) are folded into its filter and bias (fold.py); the pass
rewrites the frozen graph; the Casts it puts after constants are folded, so a weight consumed only in low precision
is stored in low precision (cast offline, not at every run; the file is about half the size). Each signature is
written back with its name, input names, output keys, dtypes and shapes, as a `tf.function` of a module that holds
no variables, only the lookup tables the signatures read (the frozen functions capture the restored tables).

What freezing drops, by design (an inference artifact): variables (and so training and fine-tuning), the restored
Keras objects and any other function or attribute of the original object graph; only the signatures remain.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import tempfile
import time

from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2

from ..core.body import Options
from ..core.rewrite import rewrite_graph_def
from ..errors import ModelError
from ..rules import check_weights_low, fold_batch_norms, fold_constant_casts

# Ops that change state: a signature running one cannot be frozen (its effect would be lost or wrong).
MUTATING_OPS = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign", "AssignAdd", "AssignSub",
    "ResourceScatterUpdate", "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterNdUpdate", "ResourceScatterNdAdd", "ScatterUpdate",
    "ScatterAdd", "ScatterNdUpdate", "DestroyResourceOp", "LookupTableInsertV2", "LookupTableRemoveV2"})
FOLDING = ("constfold", "arithmetic", "constfold")
LOW_DTYPES = (19, 14)  # types_pb2.DT_HALF, DT_BFLOAT16
_IMPORTS = itertools.count()  # a fresh suffix per imported graph, unique in the process
DROPPED = ("variables (the model can no longer be trained or fine-tuned)", "the restored Keras objects and every "
           "function or attribute of the object graph other than the signatures")


def freeze_signatures(source_dir, keys, opts: Options, progress=None, weights: str = "keep") -> tuple[str, dict]:
    """Freeze, fold and rewrite every signature of a SavedModel and save them as a new SavedModel.

    Args:
        source_dir: the SavedModel directory (only read).
        keys: the signature keys to keep; None keeps every signature.
        opts: the rewrite options (core.body.make_options).
        progress: optional callable (done, total, signature key).
        weights: "keep" stores a weight read in low precision and in float32 in both; "low" refuses it
            (check_weights_low).

    Returns:
        (a temporary directory holding the new SavedModel, which the caller removes with remove_tree;
        {"signature KEY (frozen)": RewriteResult}).

    Raises:
        ModelError: the model has no signature, or a signature changes state (the op is named).
    """
    import tensorflow as tf

    staging = _loadable_copy(source_dir)
    try:  # kept until saved: the assets of a restored table are copied from where it was loaded
        loaded = tf.saved_model.load(staging or str(source_dir))
        module, functions, results = _frozen_module(loaded, source_dir, keys, opts, progress, weights)
        directory = tempfile.mkdtemp(prefix="mp_rewrite-frozen-")
        # An inference artifact needs no gradients; saving custom gradients (Keras' swish) fails on frozen graphs.
        options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
        try:
            tf.saved_model.save(module, directory, options=options,
                                signatures={k: f.get_concrete_function() for k, f in functions.items()})
        except (ValueError, TypeError, tf.errors.OpError) as e:
            remove_tree(directory)
            raise ModelError(f"TensorFlow cannot save the frozen signatures: {str(e).splitlines()[0]}") from None
    finally:
        remove_tree(staging)
    return directory, results


def _frozen_module(loaded, source_dir, keys, opts: Options, progress, weights: str):
    """(a module tracking the frozen functions and the tables they read, {key: function}, {name: RewriteResult})."""
    import tensorflow as tf

    chosen = list(keys or loaded.signatures.keys())
    if not chosen:
        raise ModelError(f"'{source_dir}' has no signatures to freeze; export the model with signatures "
                         "(model.export(path) or tf.saved_model.save(obj, path, signatures=...))")
    module, results = tf.Module(), {}
    functions, seen, traced, module.resources = {}, {}, {}, []
    for done, key in enumerate(chosen, 1):
        signature = loaded.signatures[key]
        # Signatures of one function (Keras exports "serve" and "serving_default") are frozen once and share one
        # graph, so the work is done and the weights are stored once.
        same = traced.setdefault(_traced_identity(signature), key)
        if same != key:
            functions[key] = functions[same]
            results[f"signature {key} (frozen)"] = results[f"signature {same} (frozen)"]
        else:
            function, result, identity = _frozen_signature(signature, key, opts, weights, loaded, module.resources)
            functions[key] = seen.setdefault(identity, function)
            results[f"signature {key} (frozen)"] = result
        if progress is not None:
            progress(done, len(chosen), key)
    module.frozen = functions  # tracked, so the functions' graphs (and constants) are saved with the module
    return module, functions, results


def _loadable_copy(source_dir) -> str | None:
    """A temporary copy of a TF2 SavedModel (variables and assets linked) without the functions only its v1 saver
    calls (`__traced_save`, `__traced_restore`): tf.saved_model.load makes a Python graph of every function, and
    these are most of the nodes (ResNet-50: load 1.8 s -> 0.9 s). None where that does not apply (TF1 models)."""
    from tensorflow.core.protobuf import saved_model_pb2
    model, path = saved_model_pb2.SavedModel(), pathlib.Path(source_dir)
    try:
        model.ParseFromString((path / "saved_model.pb").read_bytes())
    except (OSError, ValueError):
        return None  # a saved_model.pbtxt: the loader reads it
    if not all(m.HasField("object_graph_def") for m in model.meta_graphs):
        return None  # TF1: loaded through its graph and saver
    for meta in model.meta_graphs:
        library = meta.graph_def.library
        used = _called(library, [*meta.object_graph_def.concrete_functions, *(g.gradient_func for g in
                                 [*library.gradient, *library.registered_gradients])])
        kept = [f for f in library.function if f.signature.name in used]
        del library.function[:]
        library.function.extend(kept)
        # The saver's nodes go (they call what was dropped); the others stay (the object graph names constants).
        nodes = [n for n in meta.graph_def.node if all(name in used for name in _calls(n))]
        del meta.graph_def.node[:]
        meta.graph_def.node.extend(nodes)
        meta.ClearField("saver_def")
    directory = pathlib.Path(tempfile.mkdtemp(prefix="mp_rewrite-load-"))
    try:
        (directory / "saved_model.pb").write_bytes(model.SerializeToString())
        for name in [n for n in ("variables", "assets") if (path / n).exists()]:
            (directory / name).symlink_to((path / name).resolve(), target_is_directory=True)
        return str(directory)
    except OSError:
        return remove_tree(str(directory))  # None: load the original


def _called(library, names: list) -> set:
    """The names of the library functions `names` are, or call (through any function attribute)."""
    bodies = {f.signature.name: f for f in library.function}
    found, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name in bodies and name not in found:
            found.add(name)
            stack += [called for node in bodies[name].node_def for called in _calls(node)]
    return found


def _calls(node) -> list:
    """The names of the functions a node calls (through any function attribute)."""
    return [f.name for v in node.attr.values() for f in ([v.func] if v.HasField("func") else []) + list(v.list.func)]


def _frozen_signature(signature, key: str, opts: Options, weights: str, loaded, resources: list):
    """(a tf.function with the signature's interface running the rewritten frozen graph, its RewriteResult, a key
    equal for signatures whose frozen graphs and interfaces are the same). The resources (tables) it captures are
    appended to `resources`, which the saved module tracks."""
    import tensorflow as tf

    check_stateless(signature.graph.as_graph_def(), key)
    graph_def, feeds = frozen_graph_def(signature, key)
    captured = captured_resources(signature, key, feeds, loaded)
    resources.extend(owner for _, owner in captured if all(owner is not r for r in resources))
    check_stateless(graph_def, key)
    # A signature returns a dict; its tensors are the function's outputs in tf.nest order (sorted keys).
    outputs = {name: tensor.name for name, tensor in zip(sorted(signature.structured_outputs), signature.outputs)}
    fetches = list(dict.fromkeys(outputs.values()))
    specs = tf.nest.flatten(signature.structured_input_signature, expand_composites=True)
    inputs = list(zip(specs, feeds))
    folded, _ = fold_batch_norms(optimize_graph(graph_def, fetches, FOLDING), fetches)
    folded = prune(folded, fetches)
    result = rewrite_graph_def(folded, opts.precision, fetches, device=opts.device, lists=opts.lists,
                               keep_fp32=opts.keep_fp32, force_low=opts.force_low)
    if weights == "low":
        check_weights_low(result.graph_def, key)
    result.graph_def = _compact(fold_constant_casts(result.graph_def, fetches)[0], fetches)
    identity = (result.graph_def.SerializeToString(deterministic=True), repr(inputs), repr(sorted(outputs.items())),
                *(id(owner) for _, owner in captured))
    return _as_function(result.graph_def, inputs, outputs, captured), result, identity


def frozen_graph_def(signature, key: str):
    """The signature's graph with every variable it reads folded into a constant, and the names of the tensors
    that feed its arguments.

    TensorFlow's `convert_variables_to_constants_v2` does the folding, then builds a ConcreteFunction of the result
    (10 of 11 s on ResNet-50), which is thrown away here: the graph is rewritten and imported again. So its two
    steps are called without the last one.

    The feeds: the arguments' placeholders, then those of the captures that are not variables (captured_resources).

    Raises:
        ModelError: the signature cannot be frozen (TensorFlow's folding refuses it).
    """
    from tensorflow.python.framework import convert_to_constants as freezing

    try:
        # Functional control flow stays functional: lowered v1 loops do not survive re-import into a tf.function.
        data = freezing._FunctionConverterDataInEager(func=signature, lower_control_flow=False,
                                                      aggressive_inlining=False)
        graph_def, converted = freezing._replace_variables_by_constants(converter_data=data)
    except (ValueError, TypeError) as e:
        raise ModelError(f"signature '{key}' cannot be frozen: {e}") from None
    captures = signature.graph.internal_captures
    folded = {id(captures[index]) for index in converted}
    return graph_def, [t.name for t in signature.inputs if id(t) not in folded]


def captured_resources(signature, key: str, feeds: list, loaded) -> list:
    """[(placeholder name, the restored object owning the resource)] for the captures freezing left (lookup tables,
    whose contents are not constants): the frozen function captures the same object, which is saved with it.

    Raises:
        ModelError: a capture that no object of the loaded model owns (it could not be saved), naming its reader.
    """
    from tensorflow.python.checkpoint import graph_view

    arguments = len(signature.inputs) - len(signature.graph.internal_captures)
    left = feeds[arguments:]
    if not left:
        return []
    objects = graph_view.ObjectGraphView(loaded).breadth_first_traversal()[0]
    owners = {id(getattr(obj, "resource_handle", None)): obj for obj in reversed(objects)}  # the first owner wins
    external = {internal.name: capture for capture, internal in signature.graph.captures}
    found = [(name, owners.get(id(external.get(name)))) for name in left]
    for name, owner in found:
        if owner is None:
            readers = [n.name for n in signature.graph.as_graph_def().node if name.split(":")[0] in n.input]
            raise ModelError(f"signature '{key}' cannot be frozen: it captures {name} (read by "
                             f"{', '.join(readers) or 'nothing'}), a resource no object of the model owns; "
                             "convert without --freeze")
    return found


def _traced_identity(signature) -> tuple:
    """Equal for two signatures that run the same function with the same interface."""
    calls = [n.attr["f"].func.name for n in signature.graph.as_graph_def().node if n.attr["f"].func.name]
    return (tuple(calls), repr(signature.structured_input_signature), repr(sorted(signature.structured_outputs)))


def check_stateless(graph_def, key: str) -> None:
    """Refuse a signature whose graph (or a function it calls) changes state.

    Raises:
        ModelError: naming the first state-changing op and where it is.
    """
    places = [("", graph_def.node)] + [(f.signature.name, f.node_def) for f in graph_def.library.function]
    for function, nodes in places:
        for node in nodes:
            if node.op in MUTATING_OPS:
                where = f" in function '{function}'" if function else ""
                raise ModelError(f"signature '{key}' cannot be frozen: node '{node.name}' ({node.op}){where} changes "
                                 "state, which a frozen graph cannot do; convert without --freeze")


def optimize_graph(graph_def, fetches, optimizers) -> object:
    """Run Grappler's named optimizers (only those) on a GraphDef whose `fetches` are preserved; return the result."""
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(dict.fromkeys(f.split(":")[0] for f in fetches))
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(optimizers)
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    rewrite.use_plugin_optimizers = rewriter_config_pb2.RewriterConfig.OFF
    try:
        return tf_optimizer.OptimizeGraph(config, meta)
    except Exception as e:  # Grappler's C++ errors arrive as several exception types
        raise ModelError(f"TensorFlow's graph optimizer failed on the frozen graph: {e}") from None


def _compact(graph_def, fetches):
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
        if tensor is not None and tensor.dtype in LOW_DTYPES and not tensor.tensor_content:
            # TensorFlow's parser reads the varints in C++ (numpy's fromiter over them took 2.7 s on ResNet-50).
            values = tf.io.parse_tensor(tensor.SerializeToString(), tf.dtypes.as_dtype(tensor.dtype)).numpy()
            tensor.ClearField("half_val")
            tensor.tensor_content = values.tobytes()
    return graph_def


def prune(graph_def, fetches):
    """Remove, in place, every node the fetches do not depend on (through data or control inputs); return it."""
    inputs = {node.name: node.input for node in graph_def.node}
    needed, stack = set(), [f.split(":")[0] for f in fetches]
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in inputs.get(name, ()))
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


def _as_function(graph_def, inputs, outputs: dict, captured=()):
    """A tf.function with the signature's input names and specs that runs `graph_def` and returns `outputs`, its
    `captured` placeholders fed with the resource handles of their owners."""
    import tensorflow as tf

    feeds = [name for _, name in inputs]
    fetch_keys = list(outputs)
    graph_def = _renamed_functions(graph_def, f"_mp_rewrite_{next(_IMPORTS)}")
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec, _ in inputs]

    @tf.function(autograph=False)
    def body(*args):
        # tf.identity captures the handle (import_graph_def takes graph tensors only).
        handles = {name: tf.identity(owner.resource_handle) for name, owner in captured}
        return tf.graph_util.import_graph_def(graph_def, input_map={**dict(zip(feeds, args)), **handles},
                                              return_elements=[outputs[k] for k in fetch_keys], name="frozen")

    # The graph is imported once, into one concrete function; `run` only calls it, so that saving (which traces
    # `run` again) stores the weights once.
    imported = body.get_concrete_function(*specs)

    @tf.function(input_signature=specs, autograph=False)
    def run(*args):
        return dict(zip(fetch_keys, imported(*args)))

    return run


def remove_tree(directory) -> None:
    """Remove a temporary directory made by freeze_signatures (quietly: it is ours and only temporary)."""
    import shutil
    if directory and os.path.isdir(directory):
        shutil.rmtree(directory, ignore_errors=True)


def convert_frozen(source, output, source_dir, output_dir, saved_model, keys, opts, overwrite, flops, progress,
                    start, weights="keep"):
    """The freeze=True path of convert_saved_model, called holding the output lock after the source checks."""
    from .convert import ConversionResult, estimate_flops, read_saved_model, signature_keys
    from .model_dir import write_model_dir
    from .source_check import check_written
    staging, graphs = freeze_signatures(source_dir, keys, opts, progress, weights)
    try:
        new = read_saved_model(staging)
        share, per_function, per_graph = estimate_flops(graphs) if flops else (None, {}, {})
        write_model_dir(pathlib.Path(staging), output_dir, new, overwrite,
                        check=lambda written: check_written(source_dir, saved_model, written, new))
    finally:
        remove_tree(staging)
    return ConversionResult(str(source), str(output), opts.precision, opts.device,
                            keys or tuple(signature_keys(saved_model)), graphs, {}, share, per_function,
                            per_graph, time.perf_counter() - start, frozen=True,
                            notes=[f"frozen inference model: every signature is kept; dropped: {'; '.join(DROPPED)}. "
                                   f"Load it with tf.saved_model.load('{output}')"])
