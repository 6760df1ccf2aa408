"""The training hook with assign="cost": each traced step function is rewritten with costs measured by running the
step itself (forward, backward and update) in sessions with copies of its variables, cached; the caller's variables
are untouched by the measuring, the step runs, and every candidate's Reason carries the numbers. A step that cannot
run that way is priced from the op table, and the log says why."""

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite.analysis.op_costs import machine_facts
from mp_rewrite.training import api as training
from mp_rewrite.training import function_hook

NATIVE_BF16 = {"avx512_bf16", "amx_bf16"} & set(machine_facts()["cpu_flags"])


@pytest.mark.skipif(not NATIVE_BF16, reason="measuring bfloat16 costs needs a CPU with bfloat16 units")
def test_a_training_step_is_rewritten_by_measured_cost(cost_cache):
    keras.utils.set_random_seed(0)
    # Matmuls large enough that bfloat16 wins by a margin load on the machine cannot hide (at 256x512 by 128 rows a
    # loaded CI machine once timed them level, and a body the cut keeps all float32 is not rewritten at all).
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)])
    opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), precision="bfloat16",
                                                        assign="cost")
    try:
        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(256, 512)).astype("float32"), rng.normal(size=(256, 1)).astype("float32")
        before = [v.numpy().copy() for v in model.weights]
        name = step.get_concrete_function(x, y).name  # traced, rewritten, measured: not run
        assert all((b == v.numpy()).all() for b, v in zip(before, model.weights))
        losses = [float(step(x, y)) for _ in range(3)]
        assert all(np.isfinite(losses))
        name = name.decode() if isinstance(name, bytes) else name
        result = training.rewritten_functions().get(name)
        assert result is not None and result.assignment is not None and result.assignment.candidates
        assert "measured in this graph" in result.assignment.source, result.assignment.source
        assert all(result.coloring.for_node(n)[0].reason.stage == "assign_by_cost"
                   for n in result.assignment.candidates)
        assert name not in training.rewrite_failures()  # (other tests may leave failures of their own)
        assert os.listdir(os.path.join(cost_cache, "mp_rewrite"))  # measured once, cached for the next process
    finally:
        training.disable_mixed_precision_graph_rewrite()


@pytest.mark.skipif(not NATIVE_BF16, reason="measuring bfloat16 costs needs a CPU with bfloat16 units")
def test_a_step_that_reads_an_iterator_is_priced_from_the_op_table(cost_cache, caplog):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64)])
    data = iter(tf.data.Dataset.from_tensors(np.ones((8, 64), "float32")).repeat())
    opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), precision="bfloat16",
                                                        assign="cost")
    try:
        @tf.function
        def step(iterator):
            x = next(iterator)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        failed_before = dict(training.rewrite_failures())  # other tests may leave failures of their own
        with caplog.at_level(logging.INFO, logger="mp_rewrite"):
            assert np.isfinite(float(step(data)))
        assert any("costs from the op table: an argument is neither a number tensor nor a variable" in r.message
                   for r in caplog.records), [r.message for r in caplog.records]
        assert training.rewrite_failures() == failed_before
    finally:
        training.disable_mixed_precision_graph_rewrite()
