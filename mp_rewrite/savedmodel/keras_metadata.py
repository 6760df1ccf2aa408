"""tf_keras SavedModels: `tf_keras.models.load_model` rebuilds the layers from keras_metadata.pb, so it would run the
float32 layers and never the converted functions. The conversion says so, and can leave the metadata out."""

from __future__ import annotations

from pathlib import Path

from ..errors import OptionError

METADATA_FILE = "keras_metadata.pb"
MODES = ("keep", "drop")


def check_mode(mode: str) -> None:
    """Raises OptionError for a mode other than "keep" and "drop"."""
    if mode not in MODES:
        raise OptionError(f"unknown --keras-metadata {mode!r}: use 'keep' or 'drop'")


def has_keras_metadata(source) -> bool:
    """True for a SavedModel written by tf_keras's model.save (it carries keras_metadata.pb)."""
    return (Path(source) / METADATA_FILE).is_file()


def metadata_note(output, mode: str) -> str:
    """What a tf_keras user must know about loading the converted model."""
    if mode == "drop":
        return (f"tf_keras model: {METADATA_FILE} was left out, so tf_keras.models.load_model('{output}') refuses "
                f"it instead of rebuilding float32 layers; load it with tf.saved_model.load('{output}'), whose "
                "signatures and __call__ run mixed precision")
    return (f"tf_keras model: tf_keras.models.load_model('{output}') rebuilds the layers from {METADATA_FILE} and "
            f"runs float32, not the converted functions; load it with tf.saved_model.load('{output}') (signatures "
            "and __call__ run mixed precision), or convert with --keras-metadata drop so that load_model refuses it")
