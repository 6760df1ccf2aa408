"""The accuracy guard says where its tolerance proves nothing: an output that does not depend on the calibration
inputs (issue 39, item 6)."""

from __future__ import annotations

import keras

from mp_rewrite.guard.accuracy_guard import guard
from mp_rewrite.testing import examples


def two_heads() -> keras.Model:
    """A Dense body with two heads: `scores` varies with the input, `prior` (zero kernel, a bias) does not."""
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(7)
    x = inp = keras.Input((32,), name="features")
    x = keras.layers.Dense(64, activation="relu", name="body")(x)
    scores = keras.layers.Dense(8, name="scores")(x)
    prior = keras.layers.Dense(8, kernel_initializer="zeros", bias_initializer="ones", name="prior")(x)
    return keras.Model(inp, [scores, prior], name="two_heads")


def test_the_guard_names_the_output_that_does_not_depend_on_its_inputs():
    g = examples.inference_graph(two_heads(), batch=4)
    result = guard(g.graph_def, g.fetches, g.inputs, "bfloat16")
    assert result.met
    assert list(result.analysis.unvarying.values()) == ["1 everywhere"], result.analysis.unvarying
    assert "do not depend on the calibration inputs" in result.summary()
    assert "proves nothing" in result.summary()
