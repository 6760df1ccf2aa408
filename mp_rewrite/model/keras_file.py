"""Keras model files: a Keras 3 `.keras` file (what `model.save` writes) or a tf_keras `.h5`, loaded with the library
that wrote it and exported the way `model.export(directory)` does (a SavedModel with the `serve` and
`serving_default` signatures), so every command takes the file a Keras user has."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from ..errors import ModelError
from .files import KERAS_SUFFIXES


def is_keras_file(path) -> bool:
    """True for an existing file ending in .keras, .h5 or .hdf5."""
    path = Path(path)
    return path.is_file() and path.suffix.lower() in KERAS_SUFFIXES


def _load(path: Path):
    """The model, loaded by the library that wrote it: Keras 3 for .keras; tf_keras (then Keras 3) for .h5."""
    errors = []
    loaders = ("keras",) if path.suffix.lower() == ".keras" else ("tf_keras", "keras")
    for name in loaders:
        try:
            library = __import__(name)
        except ImportError:
            errors.append(f"{name} is not installed")
            continue
        try:
            return library.models.load_model(str(path), compile=False)
        except Exception as e:  # Keras raises ValueError, TypeError, OSError, ... for files it cannot read
            errors.append(f"{name}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    raise ModelError(f"cannot load the Keras model '{path}' ({'; '.join(errors)}); export it to a SavedModel with "
                     "model.export(directory) and give that directory")


def export_keras_file(path, directory) -> None:
    """Load a .keras/.h5 file and export its serving signature as a SavedModel in `directory`.

    Raises:
        ModelError: the file cannot be loaded or exported (one line, with what to do instead).
    """
    model = _load(Path(path))
    try:
        model.export(str(directory), verbose=False) if _takes_verbose(model) else model.export(str(directory))
    except Exception as e:  # export fails with ValueError/TypeError for models without known input shapes
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot export the Keras model '{path}' to a SavedModel: {line}; build the model on "
                         "known input shapes, or export it yourself with model.export(directory)") from None


def _takes_verbose(model) -> bool:
    import inspect
    return "verbose" in inspect.signature(model.export).parameters


@contextlib.contextmanager
def saved_model_of(path, on_note=None):
    """Yield a SavedModel directory for `path`: the path itself, or for a Keras file a temporary export (removed
    afterwards); `on_note` hears one line saying that the file was exported."""
    if not is_keras_file(path):
        yield path
        return
    directory = Path(tempfile.mkdtemp(prefix="mp_rewrite-keras-")) / "saved_model"
    try:
        export_keras_file(path, directory)
        if on_note is not None:
            on_note(f"read the Keras model '{path}' as a SavedModel exported with model.export (its serving "
                    "signature)")
        yield str(directory)
    finally:
        shutil.rmtree(directory.parent, ignore_errors=True)
