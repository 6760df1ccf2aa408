"""A SavedModel that `tf.saved_model.load` reads faster: a temporary copy (variables and assets linked) without the
functions only its v1 saver calls."""

from __future__ import annotations

import pathlib
import tempfile

from .frozen_function import remove_tree


def loadable_copy(source_dir, model) -> str | None:
    """A temporary copy of a TF2 SavedModel (variables and assets linked) without the functions only its v1 saver
    calls (`__traced_save`, `__traced_restore`): tf.saved_model.load makes a Python graph of every function, and
    these are most of the nodes (ResNet-50: load 1.8 s -> 0.9 s). None where that does not apply (TF1 models)."""
    from tensorflow.core.protobuf import saved_model_pb2
    path = pathlib.Path(source_dir)
    if not (path / "saved_model.pb").is_file():
        return None  # a saved_model.pbtxt: the loader reads it
    if not all(m.HasField("object_graph_def") for m in model.meta_graphs):
        return None  # TF1: loaded through its graph and saver
    model = saved_model_pb2.SavedModel.FromString(model.SerializeToString())  # ours to edit
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
        remove_tree(str(directory))
        return None  # load the original


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
