"""The proto files a model is read from: a SavedModel directory's saved_model.pb (or .pbtxt), and GraphDef or
MetaGraphDef files (binary or text). Only protos are read; TensorFlow's runtime is not involved. The proto modules
are imported where they are used: the CLI checks paths with this module before TensorFlow starts."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelError

MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
TEXT_SUFFIXES = (".pbtxt", ".pbtext", ".txt", ".prototxt")
KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_>]*$")


def keras_file_hint(path) -> str:
    """For a Keras model file: how to get a SavedModel from it (commands take such a file as it is)."""
    return (f"'{path}' is a Keras model file; mp-rewrite reads it (exported as model.export does), or export it "
            "yourself with keras.models.load_model(path).export(directory)")


def saved_model_file(directory) -> Path:
    """Return the path of the SavedModel proto in `directory` (saved_model.pb, else saved_model.pbtxt).

    Raises:
        ModelError: the directory does not exist, is not a directory, or holds no SavedModel.
    """
    path = Path(directory)
    if not path.exists():
        raise ModelError(f"'{directory}' does not exist; give the path of a SavedModel directory")
    if not path.is_dir():
        if path.suffix.lower() in KERAS_SUFFIXES:
            raise ModelError(keras_file_hint(directory))
        raise ModelError(f"'{directory}' is not a directory; a SavedModel is a directory holding saved_model.pb")
    for name in MODEL_FILES:
        if (path / name).is_file():
            return path / name
    raise ModelError(f"'{directory}' is not a SavedModel: it has no saved_model.pb (or saved_model.pbtxt); "
                     "write one with tf.saved_model.save(obj, path) or model.export(path)")


def read_bytes(path) -> bytes:
    """The bytes of a file, with a one-line ModelError if it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read '{path}': {e.strerror}") from None


def read_saved_model(directory):
    """Parse a SavedModel directory's saved_model.pb (or .pbtxt).

    Raises:
        ModelError: no SavedModel there, an unreadable or corrupt file, or no MetaGraph in it.
    """
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2
    path = saved_model_file(directory)
    data = read_bytes(path)
    saved_model = saved_model_pb2.SavedModel()
    try:
        if path.suffix == ".pbtxt":
            text_format.Parse(data.decode("utf-8"), saved_model)
        else:
            saved_model.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"'{path}' is not a valid SavedModel proto (corrupt or truncated file?): {reason}") from None
    if not saved_model.meta_graphs:
        raise ModelError(f"'{path}' holds no MetaGraph (corrupt file, or not a SavedModel); re-export the model")
    return saved_model


def _plausible(graph_def) -> bool:
    """True if the nodes look like real NodeDefs (a proto of another type parses into nonsense or nothing)."""
    nodes = graph_def.node
    return len(nodes) > 0 and all(n.name and OP_NAME.match(n.op) for n in nodes[:200])


def _main_graph(proto):
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
    if isinstance(proto, saved_model_pb2.SavedModel):
        return proto.meta_graphs[0].graph_def if proto.meta_graphs else graph_pb2.GraphDef()
    return proto.graph_def if isinstance(proto, meta_graph_pb2.MetaGraphDef) else proto


def _parse(data: bytes, text: bool):
    """Parse the bytes as a SavedModel, a MetaGraphDef or a GraphDef (the first that looks real), or None."""
    from google.protobuf import message, text_format
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
    for cls in (saved_model_pb2.SavedModel, meta_graph_pb2.MetaGraphDef, graph_pb2.GraphDef):
        proto = cls()
        try:
            if text:
                text_format.Parse(data.decode("utf-8"), proto, allow_unknown_field=False)
            else:
                proto.ParseFromString(data)
        except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError):
            continue
        if _plausible(_main_graph(proto)):
            return proto
    return None


def read_model_file(path):
    """Read a SavedModel directory, a GraphDef file or a MetaGraphDef file into its proto.

    Returns:
        A SavedModel, MetaGraphDef or GraphDef proto.

    Raises:
        ModelError: the path does not exist, cannot be read, or holds none of these.
    """
    path = Path(path)
    if not path.exists():
        raise ModelError(f"no such file or directory: '{path}'")
    if path.is_dir():
        return read_saved_model(path)
    if path.suffix.lower() in KERAS_SUFFIXES:
        raise ModelError(keras_file_hint(path))
    data = read_bytes(path)
    text_first = path.name.endswith(TEXT_SUFFIXES)
    proto = _parse(data, text_first) or _parse(data, not text_first)
    if proto is None:
        raise ModelError(f"'{path}' is not a model: expected a SavedModel directory, a GraphDef (.pb binary or "
                         ".pbtxt text), a MetaGraphDef or a Keras .keras/.h5 file")
    return proto
