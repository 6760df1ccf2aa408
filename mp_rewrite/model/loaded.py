"""A model read for inspection (`inspect`, `explain`, `view`): a SavedModel directory (one MetaGraph of it), a
GraphDef file or a MetaGraphDef file, or a Keras .keras/.h5 file, as one MetaGraphDef or GraphDef, rewritten
through the core's one MetaGraph rewrite -- so what `inspect` shows is what `convert` writes."""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from ..core.meta_graph import INTERNAL_PREFIX, functions_to_rewrite, nodes_to_preserve
from ..core.rewrite import rewrite_graph_def, rewrite_meta_graph_def
from .files import read_model_file
from .keras_file import saved_model_of
from .tags import inspected_meta_graph


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
            ones `convert` rewrites); None for a bare GraphDef (those its nodes call).
        preserve: for a SavedModel or MetaGraphDef, node name -> why, for every node Grappler keeps for it.
        meta_graph: the MetaGraphDef (None for a bare GraphDef).
    """

    path: str
    kind: str
    graph_def: graph_pb2.GraphDef
    fetches: list
    signatures: dict = dataclasses.field(default_factory=dict)
    function_names: list | None = None
    preserve: dict = dataclasses.field(default_factory=dict)
    meta_graph: object = None


def _from_meta_graph(meta: meta_graph_pb2.MetaGraphDef, path: str, kind: str) -> LoadedModel:
    signatures = {name: [t.name for t in sig.outputs.values()]
                  for name, sig in meta.signature_def.items() if not name.startswith(INTERNAL_PREFIX)}
    fetches = list(dict.fromkeys(t for outputs in signatures.values() for t in outputs if t))
    return LoadedModel(path, kind, meta.graph_def, fetches, signatures, functions_to_rewrite(meta),
                       nodes_to_preserve(meta), meta)


def load_model(path: str, tag_set=None, on_note=None) -> LoadedModel:
    """Read a SavedModel directory, a GraphDef file, a MetaGraphDef file or a Keras .keras/.h5 file.

    Args:
        tag_set: for a SavedModel, the MetaGraph to read (see tags.inspected_meta_graph for the default).
        on_note: optional callable(str), told when a Keras file is exported to be read.

    Raises:
        ModelError: the path does not exist, cannot be read, holds none of these, or has no such tag-set.
    """
    with saved_model_of(path, on_note) as readable:
        proto = read_model_file(readable)
    if isinstance(proto, saved_model_pb2.SavedModel):
        return _from_meta_graph(inspected_meta_graph(proto, tag_set), path, "saved_model")
    if isinstance(proto, meta_graph_pb2.MetaGraphDef):
        return _from_meta_graph(proto, path, "meta_graph")
    return LoadedModel(path, "graph_def", proto, [])


def rewrite_model(model: LoadedModel, precision: str = "float16", fetches=None, **options):
    """Rewrite a LoadedModel: a SavedModel's or MetaGraphDef's through rewrite_meta_graph_def (what `convert`
    does), a bare GraphDef through rewrite_graph_def.

    Args:
        fetches: node/tensor names to preserve as fetched; None uses the model's own (its signatures' outputs).
        options: more keyword arguments of those functions (device, lists, keep_fp32, options, ...).

    Raises:
        MpRewriteError: as rewrite_graph_def.
    """
    if model.meta_graph is not None:
        return rewrite_meta_graph_def(model.meta_graph, precision, fetches, **options)
    return rewrite_graph_def(model.graph_def, precision, [] if fetches is None else list(fetches), **options)
