"""Keras 3's training BatchNormalization fused in a traced step (rules.batchnorm_training): one step of the fused
body updates every variable as the traced body does (weights, gamma, beta, the moving mean and the moving variance,
whose Bessel correction the rule undoes); layers the rule does not match are left as traced; the training hook
fuses with assign="cost" only (Grappler's lists rewrite the step as traced)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from rules_support import keras
from mp_rewrite.core.assignment import CostTable
from mp_rewrite.core.functions import function_to_graph, graph_to_function
from mp_rewrite.core.op_support import Signatures
from mp_rewrite.rules.batchnorm_training import fuse_training_batch_norms
from mp_rewrite.training import api as training

UNFUSED_OPS = {"Rsqrt", "SquaredDifference", "StopGradient", "RsqrtGrad"}


def _model(flat_tail: bool):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 4))
    h = keras.layers.Conv2D(6, 3, padding="same", use_bias=False)(inp)
    h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
    h = keras.layers.Conv2D(6, 3, padding="same")(h)
    h = keras.layers.BatchNormalization(axis=3, epsilon=1.001e-5)(h)  # as Keras's ResNet-50 writes it
    h = keras.layers.GlobalAveragePooling2D()(h)
    if flat_tail:  # a BatchNormalization over (batch, features): not NHWC, left as traced
        h = keras.layers.BatchNormalization()(keras.layers.Dense(5)(h))
    return keras.Model(inp, keras.layers.Dense(2)(h))


def _step(model):
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss
    return step


def _ops(nodes) -> collections.Counter:
    return collections.Counter(node.op for node in nodes)


@pytest.mark.parametrize("flat_tail", [False, True])
def test_a_fused_step_updates_every_variable_as_the_traced_step_does(flat_tail):
    model = _model(flat_tail)
    step = _step(model)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 8, 8, 4)).astype("float32"), rng.normal(size=(4, 2)).astype("float32")
    concrete = step.get_concrete_function(x, y)
    fdef, signatures = concrete.function_def, Signatures(None)
    body = function_to_graph(fdef, signatures)
    snapshot = body.graph_def.SerializeToString(deterministic=True)
    graph_def, fused = fuse_training_batch_norms(body.graph_def, keep=(*body.retvals, *body.control_outputs))
    assert body.graph_def.SerializeToString(deterministic=True) == snapshot  # the input is never modified
    assert len(fused) == 2  # the NHWC layers; the flat one is left as traced
    after = _ops(graph_def.node)
    assert after["FusedBatchNormV3"] == after["FusedBatchNormGradV3"] == 2
    assert after["Rsqrt"] == after["SquaredDifference"] == (1 if flat_tail else 0)
    if not flat_tail:
        assert not UNFUSED_OPS & set(after)

    start = [v.numpy().copy() for v in model.variables]
    traced_loss = step(x, y).numpy()
    traced = [v.numpy().copy() for v in model.variables]
    for variable, value in zip(model.variables, start):
        variable.assign(value)
    ctx, name = context.context(), fdef.signature.name
    ctx.remove_function(name)
    ctx.add_function_def(graph_to_function(graph_def, fdef, signatures))
    concrete._inference_function._cached_definition = None  # pylint: disable=protected-access
    try:
        fused_loss = step(x, y).numpy()
        moved = [v.numpy() for v in model.variables]
    finally:
        ctx.remove_function(name)
        ctx.add_function_def(fdef)
    np.testing.assert_allclose(fused_loss, traced_loss, rtol=1e-5)
    for variable, a, b, s in zip(model.variables, traced, moved, start):
        # A bias right before a BatchNormalization has a gradient of zero (computed as ~1e-6 noise either way).
        assert "bias" in variable.path or not np.array_equal(a, s), variable.path  # moving statistics included
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=variable.path)


def test_the_hook_fuses_with_the_cost_assignment_only():
    x = np.random.default_rng(1).normal(size=(16, 8, 8, 4)).astype("float32")
    y = (x.sum(axis=(1, 2, 3)) > 0).astype("float32")[:, None].repeat(2, axis=1)
    seen = {}
    for assign in ("lists", "cost"):
        model = _model(False)
        # A table of no measured ops: the cut of the fused step at once, without this machine's measuring (which
        # races the fused step against the traced one's float32 and lists, and runs the lists until it is done).
        costs = {"costs": CostTable("bfloat16")} if assign == "cost" else {}
        opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.05), precision="bfloat16",
                                                            assign=assign, **costs)
        try:
            model.compile(optimizer=opt, loss="mse")
            history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
            assert np.all(np.isfinite(history.history["loss"]))
            names = [n for n in training.rewritten_functions() if "one_step_on_data" in n]
            seen[assign] = _ops(context.context().get_function_def(names[-1]).node_def)
        finally:
            training.disable_mixed_precision_graph_rewrite()
    assert seen["cost"]["FusedBatchNormV3"] == seen["cost"]["FusedBatchNormGradV3"] == 2
    assert seen["lists"]["FusedBatchNormV3"] == 0 and seen["lists"]["Rsqrt"] == 2
