"""Is a SavedModel whole? Checks of the source before it is converted, and of the written copy before it is moved
into place, so that a conversion never exits 0 with a model TensorFlow cannot load.

The source checks are static and cheap, and say exactly what is wrong: its files (symbolic links are followed; a
dangling link or a loop is refused), its variables (the index and every tensor of the data files readable, as the
loader will read them), and its references (every op a node uses is a TensorFlow op or a library function, every
function an attribute or the object graph names exists, every input names a node that exists, every dtype is one
TensorFlow knows). The written copy is then loaded with `tf.saved_model.load`, the loader's own verdict; when it
fails, the source is loaded too, to say whose fault it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ..core import dtypes

from ..core.graph_view import parse_input
from ..errors import GraphError, ModelError, tf_reason
from ..model.runtime import runnable_directory
from ..model.tags import load_tags

VARIABLES_INDEX = Path("variables") / "variables.index"
KNOWN_DTYPES = dtypes.KNOWN


def check_source(directory, saved_model) -> None:
    """Refuse a source SavedModel that cannot be converted into a loadable model.

    Args:
        directory: the SavedModel directory.
        saved_model: its parsed SavedModel proto.

    Raises:
        ModelError: a dangling or looping symbolic link, missing or corrupt variables.
        GraphError: an unknown op or dtype, a function or input that does not exist, two nodes with one name.
    """
    directory = Path(directory)
    check_files(directory)
    check_variables(directory, saved_model)
    for meta_graph in saved_model.meta_graphs:
        check_references(meta_graph)


def check_files(directory: Path) -> None:
    """Follow every symbolic link under `directory`; refuse dangling ones and loops (the copy follows them)."""
    seen = set()
    for root, dirs, files in os.walk(directory, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            raise ModelError(f"'{root}' is a symbolic link back into the SavedModel (a loop); replace it with "
                             "the directory it should point to")
        seen.add(real)
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path) and not os.path.exists(path):
                raise ModelError(f"'{path}' is a symbolic link to '{os.readlink(path)}', which does not exist; "
                                 "fix the link or copy the files into the SavedModel")


def check_variables(directory: Path, saved_model) -> None:
    """Read the variables index and every tensor of the data files, as the loader will.

    Raises:
        ModelError: the model has variables but no index, or the index or data files are missing, truncated or
            corrupt.
    """
    index = directory / VARIABLES_INDEX
    if not index.exists():
        if any(node.WhichOneof("kind") == "variable" for mg in saved_model.meta_graphs
               for node in mg.object_graph_def.nodes):
            raise ModelError(f"'{directory}' has variables but no {VARIABLES_INDEX}; the SavedModel is incomplete, "
                             "export it again")
        return
    from tensorflow.python.training import py_checkpoint_reader
    prefix = str(index.with_suffix(""))
    try:
        reader = py_checkpoint_reader.NewCheckpointReader(prefix)
        for name in sorted(reader.get_variable_to_dtype_map()):
            reader.get_tensor(name)
    except Exception as e:  # TF raises DataLossError, NotFoundError, OutOfRangeError, ... for damaged files
        raise ModelError(f"the variables of '{directory}' are incomplete or corrupt ({tf_reason(e)}); export the "
                         "model again") from None


def check_references(meta_graph) -> None:
    """Every op, function, input and dtype a MetaGraph names exists.

    Raises:
        GraphError: naming the node (and function) at fault.
    """
    from tensorflow.python.framework import op_def_registry
    graph = meta_graph.graph_def
    library = [f.signature.name for f in graph.library.function]
    functions = set(library)
    if len(functions) != len(library):
        dup = next(n for n in library if library.count(n) > 1)
        raise GraphError(f"two functions of the SavedModel's library are named {dup!r}; export the model again")

    def known(op: str) -> bool:
        return op in functions or op_def_registry.get(op) is not None
    _check_body(graph.node, "the main graph", set(), known)
    for fdef in graph.library.function:
        args = {a.name for a in fdef.signature.input_arg}
        _check_body(fdef.node_def, f"function {fdef.signature.name!r}", args, known)
    for key, sig in meta_graph.signature_def.items():
        names = {n.name for n in graph.node}
        for info in list(sig.inputs.values()) + list(sig.outputs.values()):
            if info.name and parse_input(info.name)[0] not in names:
                raise GraphError(f"signature {key!r} names tensor {info.name!r}, which is not in the graph")
            if info.dtype not in KNOWN_DTYPES:
                raise GraphError(f"signature {key!r}: tensor {info.name!r} has dtype enum {info.dtype}, which "
                                 "TensorFlow does not know")
    _check_object_graph(meta_graph.object_graph_def, functions)


def _check_body(nodes, where: str, args: set, known) -> None:
    names = set()
    for node in nodes:
        if node.name in names:
            raise GraphError(f"two nodes of {where} are named {node.name!r}; node names must be unique")
        names.add(node.name)
    for node in nodes:
        if not known(node.op):
            raise GraphError(f"node {node.name!r} of {where} uses op {node.op!r}, which is neither a TensorFlow op "
                             "nor a function of the SavedModel")
        for name in node.input:
            source = name.lstrip("^").split(":")[0]
            if source not in names and source not in args:
                raise GraphError(f"node {node.name!r} of {where} has input {name!r}, which is not in {where}")
        for key, value in node.attr.items():
            _check_attr(node.name, key, value, where, known)


def _check_attr(node: str, key: str, value, where: str, known) -> None:
    kind = value.WhichOneof("value")
    if kind is None:  # TensorFlow loads it, then fails when the function runs ("Failed to bind all placeholders")
        raise GraphError(f"node {node!r} of {where}: attr {key!r} has no value (a corrupt model?); export the model "
                         "again")
    types = [value.type] if kind == "type" else list(value.list.type) if kind == "list" else []
    bad = [d for d in types if d not in KNOWN_DTYPES]
    if bad:
        raise GraphError(f"node {node!r} of {where}: attr {key!r} has dtype enum {bad[0]}, which TensorFlow does not "
                         "know (a corrupt or newer model?)")
    called = [value.func.name] if kind == "func" else [f.name for f in value.list.func] if kind == "list" else []
    for name in called:
        if not known(name):
            raise GraphError(f"node {node!r} of {where}: attr {key!r} calls function {name!r}, which is not in the "
                             "SavedModel's library")


def _check_object_graph(object_graph, functions: set) -> None:
    names = set(object_graph.concrete_functions)
    missing = sorted(names - functions)
    for node in object_graph.nodes:
        kind = node.WhichOneof("kind")
        if kind == "function":
            missing += [n for n in node.function.concrete_functions if n not in names]
        elif kind == "bare_concrete_function" and node.bare_concrete_function.concrete_function_name not in names:
            missing.append(node.bare_concrete_function.concrete_function_name)
    if missing:
        raise GraphError(f"the object graph restores function {missing[0]!r}, which is not in the SavedModel's "
                         "library")


def check_written_attrs(saved_model) -> None:
    """Every attr of every node we are about to write holds a value (main graphs and function bodies): TensorFlow
    loads a graph with an empty AttrValue and fails only when it runs ("Failed to bind all placeholders in <Unknown
    AttrValue type>"), and reading an absent attr with `node.attr[key]` inserts one. Called on the rewritten
    SavedModel before the first byte of the output is written. A function's own attrs are not nodes' and may be
    empty: TensorFlow itself saves a restored function with an empty '_input_shapes', and runs it.

    Raises:
        GraphError: "internal error: ... (our bug)", naming the node, the graph and the attr.
    """
    for meta_graph in saved_model.meta_graphs:
        graph = meta_graph.graph_def
        bodies = [("the main graph", graph.node)] + [(f"function {f.signature.name!r}", f.node_def)
                                                     for f in graph.library.function]
        for where, nodes in bodies:
            for node in nodes:
                for key, value in node.attr.items():
                    if value.WhichOneof("value") is None:
                        _internal_empty_attr(f"node {node.name!r} of {where}", key)


def _internal_empty_attr(where: str, key: str) -> None:
    raise GraphError(f"internal error: {where}: attr {key!r} has no value after the rewrite (our bug: TensorFlow "
                     "would load the model and fail when it runs); nothing was written. Please report it with the "
                     "model")


def node_names(saved_model, functions) -> list[str]:
    """Node names of every main graph and of the bodies of the named library functions."""
    names = []
    for meta_graph in saved_model.meta_graphs:
        names += [node.name for node in meta_graph.graph_def.node]
        for fdef in meta_graph.graph_def.library.function:
            if fdef.signature.name in functions:
                names += [node.name for node in fdef.node_def]
    return names


# --------------------------------------------------------------------------------------------- the written copy


def load_error(directory, saved_model) -> str | None:
    """Load every MetaGraph of the SavedModel at `directory` as `tf.saved_model.load` would; return the first line
    of its error, or None when it loads."""
    return next((loaded for _, loaded in loaded_meta_graphs(directory, saved_model) if isinstance(loaded, str)),
                None)


def loaded_meta_graphs(directory, saved_model):
    """Yield (tags, the loaded object or the first line of the loader's error) for every MetaGraph of the
    SavedModel at `directory`, one at a time (a model is dropped before the next one is loaded)."""
    import tensorflow as tf
    with runnable_directory(directory, saved_model) as runnable:  # loading must not write what the model writes
        for tags in [load_tags(mg) for mg in saved_model.meta_graphs]:
            with _tf_warnings_off():
                try:
                    loaded = tf.saved_model.load(runnable, tags=tags)
                except Exception as e:  # TF raises ValueError, KeyError, OpError, ... for a model it cannot load
                    loaded = tf_reason(e)
            yield tags, loaded
            loaded = None


@contextlib.contextmanager
def _tf_warnings_off():
    """The loader logs warnings (untraced functions, ...) that are noise here: the verdict is what counts."""
    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_written(source, source_model, written, written_model, run=None) -> None:
    """Load the written copy before it is moved into place (and, given `run`, call it); when it does not load, tell
    whether the source does.

    Args:
        source, source_model: the source SavedModel directory and its proto.
        written, written_model: the written copy and its proto.
        run: optional callable(loaded, tags), called on each loaded MetaGraph (run_check.RunCheck); it raises an
            MpRewriteError when the copy fails to run.

    Raises:
        ModelError: the copy does not load (the reason says whether the source is at fault).
    """
    for tags, loaded in loaded_meta_graphs(written, written_model):
        if isinstance(loaded, str):
            _blame_load(source, source_model, loaded)
        if run is not None:
            run(loaded, tags)


def _blame_load(source, source_model, reason: str) -> None:
    """The written copy does not load (`reason`): raise the error that says whether the source does."""
    source_reason = load_error(source, source_model)
    if source_reason is not None:
        raise ModelError(f"the source SavedModel '{source}' does not load in TensorFlow ({source_reason}); nothing "
                         "was written: export the model again, then convert it")
    raise ModelError(f"the converted model does not load in TensorFlow ({reason}) although the source does; "
                     "nothing was written. This is a bug in mp_rewrite: please report it with the model")
