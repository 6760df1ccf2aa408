"""tf_keras SavedModels: no silent float32. load_model would rebuild float32 layers from keras_metadata.pb, so the
conversion says how to load the converted functions, and can leave the metadata out so that load_model refuses."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite.errors import OptionError
from mp_rewrite.savedmodel.convert import convert_saved_model


@pytest.fixture(scope="module")
def tf_keras_model(tmp_path_factory):
    import tf_keras
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Dense(64, activation="relu"),
                                 tf_keras.layers.Dense(3)])
    path = tmp_path_factory.mktemp("tf_keras") / "model"
    model.save(str(path), save_format="tf")
    return path, model


def test_keep_warns_with_the_loading_call_that_runs_the_converted_functions(tf_keras_model, tmp_path):
    import tf_keras
    source, model = tf_keras_model
    result = convert_saved_model(source, tmp_path / "out", "bfloat16")
    (note,) = result.notes
    assert "tf_keras.models.load_model" in note and f"tf.saved_model.load('{tmp_path / 'out'}')" in note
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    reference = model(x).numpy()
    assert np.abs(tf_keras.models.load_model(str(tmp_path / "out"))(x).numpy() - reference).max() == 0  # float32
    converted = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    outputs = list(converted(tf.constant(x)).values())[0].numpy()
    assert 0 < np.abs(outputs - reference).max() < 0.1  # what the note's call runs is the bfloat16 model


def test_drop_makes_load_model_refuse_instead_of_running_float32(tf_keras_model, tmp_path):
    import tf_keras
    source, _ = tf_keras_model
    result = convert_saved_model(source, tmp_path / "out", "bfloat16", keras_metadata="drop")
    assert not (tmp_path / "out" / "keras_metadata.pb").exists() and "left out" in result.notes[0]
    with pytest.raises(ValueError, match="lacks the TF-Keras metadata"):
        tf_keras.models.load_model(str(tmp_path / "out"))
    assert (source / "keras_metadata.pb").exists()  # the source is only read
    with pytest.raises(OptionError, match="--keras-metadata 'lose'"):
        convert_saved_model(source, tmp_path / "bad", "bfloat16", keras_metadata="lose")
