"""The default cost assignment on Keras 3 training steps as Keras traces them (a CPU with bfloat16 units)."""

import logging
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite.core.assign_env import ASSIGN_ENV
from mp_rewrite.analysis.op_costs import NATIVE_FLAGS, machine_facts
from mp_rewrite.training import api as training

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import parity_training  # noqa: E402

NATIVE_BF16 = bool(set(NATIVE_FLAGS["bfloat16"]) & set(machine_facts()["cpu_flags"]))


@pytest.fixture(autouse=True)
def rewrite_off():
    yield
    if training.is_enabled():
        training.disable_mixed_precision_graph_rewrite()


@pytest.mark.skipif(not NATIVE_BF16, reason="on a CPU without bfloat16 units the default keeps float32")
def test_a_step_traced_with_an_unknown_batch_size_is_still_rewritten(tmp_path, monkeypatch, caplog):
    # Keras traces its step so when the data end in a partial batch. Fusing Keras 3's BatchNorms in such a step left
    # a dead Shape node of the gradient reading a node the fusion removed, and the whole step ran float32.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(ASSIGN_ENV, raising=False)
    keras.utils.set_random_seed(0)
    model = parity_training.build_model()
    opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), precision="bfloat16")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    spec = (tf.TensorSpec([None, 16, 16, 1], tf.float32), tf.TensorSpec([None], tf.int32))

    @tf.function(input_signature=spec)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x, y = parity_training.synthetic_digits(64, seed=0)
    with caplog.at_level(logging.INFO, logger="mp_rewrite"):
        before = float(step(x, y))
        training.finish_measuring()
        after = [float(step(x, y)) for _ in range(3)]
    name = step.get_concrete_function().name.decode()
    assert name not in training.rewrite_failures(), training.rewrite_failures()[name]
    assert name in training.rewritten_functions() or "float32 as traced (it ran fastest)" in caplog.text
    assert np.isfinite([before, *after]).all() and after[-1] < before
    assert "without the fusion" not in caplog.text  # the fusion removes the dead nodes it leaves reading nothing
