"""Loading a SavedModel in TensorFlow (`tf.saved_model.load`) for what has to run it -- freezing, verifying, the
accuracy guard -- with the MetaGraph chosen by tag-set and a one-line error when TensorFlow cannot load it."""

from __future__ import annotations

from ..errors import ModelError


def first_line(error: BaseException) -> str:
    """The line of a TensorFlow error that says why (its first line is often just "Graph execution error:")."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
    return next((line for line in lines if "is not in [0," in line), lines[0])


def load_saved_model(path, which: str = "original", tags=None, shown_as=None):
    """`tf.saved_model.load(path, tags=tags)`, with a one-line ModelError naming the model (`which`, at `shown_as`,
    default `path`: the user's path where a temporary copy is loaded) if TF cannot load it.

    Raises:
        ModelError: TensorFlow cannot load it (the line says why and which model).
    """
    import tensorflow as tf
    try:
        return tf.saved_model.load(str(path), tags=tags)
    except Exception as e:  # TF raises OSError, ValueError, OpError, RuntimeError, ... for unloadable models
        raise ModelError(f"TensorFlow cannot load the {which} SavedModel '{shown_as or path}': {first_line(e)}; "
                         "export the model again") from None
