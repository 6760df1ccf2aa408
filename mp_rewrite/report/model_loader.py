"""Reading a MODEL path for `inspect` and `explain`: a SavedModel directory, a GraphDef (.pb binary or .pbtxt
text) or a MetaGraphDef (binary or text), into one GraphDef (with its function library) and its fetches.

Only protos are read (saved_model_pb2, meta_graph_pb2, graph_pb2); TensorFlow's runtime is not involved, and
variables are not loaded. (mp_rewrite.savedmodel converts SavedModels; the two readers can share this later.)
"""

from __future__ import annotations

import dataclasses
import os
import re

from google.protobuf import message, text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from ..core.meta_graph import functions_to_rewrite, nodes_to_preserve
from ..errors import ModelError

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
TEXT_SUFFIXES = (".pbtxt", ".pbtext", ".txt", ".prototxt")
OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_>]*$")
INIT_SIGNATURE = "__saved_model_init_op"


@dataclasses.dataclass
class LoadedModel:
    """A model read from disk.

    Attributes:
        path: the path given.
        kind: "saved_model", "meta_graph" or "graph_def".
        graph_def: the main graph, with its function library.
        fetches: tensor names the model's signatures return (kept float32 like a Session's fetches); [] for a
            bare GraphDef.
        signatures: signature name -> output tensor names (SavedModel / MetaGraphDef).
        function_names: for a SavedModel or MetaGraphDef, the functions its signatures and object graph run (the
            ones `convert` rewrites, so that both report the same); None for a bare GraphDef (those its nodes call).
        preserve: for a SavedModel or MetaGraphDef, node name -> why, for every node Grappler keeps when it is
            handed the MetaGraphDef (core.meta_graph.nodes_to_preserve: collections' node lists, saver ops, ...).
    """

    path: str
    kind: str
    graph_def: graph_pb2.GraphDef
    fetches: list
    signatures: dict = dataclasses.field(default_factory=dict)
    function_names: list | None = None
    preserve: dict = dataclasses.field(default_factory=dict)


def _plausible(graph_def: graph_pb2.GraphDef) -> bool:
    """True if the nodes look like real NodeDefs (a proto of another type parses into nonsense or nothing)."""
    nodes = graph_def.node
    return len(nodes) > 0 and all(n.name and OP_NAME.match(n.op) for n in nodes[:200])


def _meta_graph(saved: saved_model_pb2.SavedModel, path: str) -> meta_graph_pb2.MetaGraphDef:
    """The meta graph tagged "serve", else the first one."""
    if not saved.meta_graphs:
        raise ModelError(f"'{path}': the SavedModel has no meta graph")
    for meta in saved.meta_graphs:
        if "serve" in meta.meta_info_def.tags:
            return meta
    return saved.meta_graphs[0]


def _from_meta_graph(meta: meta_graph_pb2.MetaGraphDef, path: str, kind: str) -> LoadedModel:
    signatures = {name: [t.name for t in sig.outputs.values()]
                  for name, sig in meta.signature_def.items() if name != INIT_SIGNATURE}
    fetches = list(dict.fromkeys(t for outputs in signatures.values() for t in outputs if t))
    return LoadedModel(path, kind, meta.graph_def, fetches, signatures, functions_to_rewrite(meta),
                       nodes_to_preserve(meta))


def _parse(data: bytes, text: bool):
    """Parse the bytes as a SavedModel, a MetaGraphDef or a GraphDef (the first that looks real), or None."""
    for cls in (saved_model_pb2.SavedModel, meta_graph_pb2.MetaGraphDef, graph_pb2.GraphDef):
        proto = cls()
        try:
            if text:
                text_format.Parse(data.decode("utf-8"), proto, allow_unknown_field=False)
            else:
                proto.ParseFromString(data)
        except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError):
            continue
        graph = (proto.meta_graphs[0].graph_def if isinstance(proto, saved_model_pb2.SavedModel)
                 and proto.meta_graphs else proto.graph_def if isinstance(proto, meta_graph_pb2.MetaGraphDef)
                 else proto if isinstance(proto, graph_pb2.GraphDef) else graph_pb2.GraphDef())
        if _plausible(graph):
            return proto
    return None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ModelError(f"cannot read '{path}': {e.strerror}") from None


def _saved_model_file(directory: str) -> str:
    for name in SAVED_MODEL_FILES:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise ModelError(f"'{directory}' is a directory without saved_model.pb: give a SavedModel directory, a GraphDef "
                     "(.pb/.pbtxt) or a MetaGraphDef file")


def load_model(path: str) -> LoadedModel:
    """Read a SavedModel directory, a GraphDef file or a MetaGraphDef file.

    Returns:
        A LoadedModel; for a SavedModel the meta graph tagged "serve" (else the first) with its signatures'
        outputs as fetches.

    Raises:
        ModelError: the path does not exist, cannot be read, or holds none of these.
    """
    if not os.path.exists(path):
        raise ModelError(f"no such file or directory: '{path}'")
    file = _saved_model_file(path) if os.path.isdir(path) else path
    data = _read(file)
    text_first = file.endswith(TEXT_SUFFIXES)
    proto = _parse(data, text_first) or _parse(data, not text_first)
    if proto is None:
        raise ModelError(f"'{path}' is not a model: expected a SavedModel directory, a GraphDef (.pb binary or "
                         ".pbtxt text) or a MetaGraphDef")
    if isinstance(proto, saved_model_pb2.SavedModel):
        return _from_meta_graph(_meta_graph(proto, path), path, "saved_model")
    if isinstance(proto, meta_graph_pb2.MetaGraphDef):
        return _from_meta_graph(proto, path, "meta_graph")
    return LoadedModel(path, "graph_def", proto, [])


def rewrite_model(model: LoadedModel, precision: str = "float16", fetches=None, **options):
    """Rewrite a LoadedModel's graph (and its functions) with mp_rewrite.rewrite_graph_def.

    Args:
        fetches: node/tensor names to preserve; None uses the model's own (its signatures' outputs). The nodes
            Grappler keeps for a MetaGraphDef (model.preserve) are preserved either way.
        options: more rewrite_graph_def keyword arguments (device, lists, keep_fp32, force_low, level, preserve).

    Raises:
        MpRewriteError: as rewrite_graph_def.
    """
    from ..core.rewrite import rewrite_graph_def
    chosen = model.fetches if fetches is None else list(fetches)
    preserve = dict(model.preserve)
    extra = options.pop("preserve", ())
    preserve.update(extra if isinstance(extra, dict) else {name: "preserved by the caller" for name in extra})
    return rewrite_graph_def(model.graph_def, precision, chosen, function_names=model.function_names,
                             preserve=preserve, **options)
