"""The rules on a traced Keras 3 training step (forward and backward in one graph, weights are variables): with the
variables' shapes given, the Dense Reshapes move and TF fuses each forward MatMul with its BiasAdd; the activation
cannot fuse in training (its gradient reads the activation's inner values), and the rule says so."""

from __future__ import annotations

import tensorflow as tf

from rules_support import fused, keras, runtime_graph, with_nonzero_biases
from mp_rewrite.rules import canonicalize


def _training_step():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    hidden = keras.layers.Dense(64, activation="gelu")(inp)
    model = with_nonzero_biases(keras.Model(inp, keras.layers.Dense(32)(hidden)))
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    function = step.get_concrete_function(tf.TensorSpec((8, 16, 32)), tf.TensorSpec((8, 16, 32)))
    # The variables' shapes, keyed by the placeholders that carry their handles into the traced graph.
    variables = {id(v.value.handle): tuple(v.shape) for v in model.variables}
    shapes = {internal.op.name: variables[id(external)] for external, internal in function.graph.captures
              if id(external) in variables}
    return function.graph.as_graph_def(), [t.name for t in function.outputs], shapes, model


def test_training_step_fuses_matmul_and_bias_but_not_the_activation():
    graph_def, fetches, shapes, model = _training_step()
    _, records = canonicalize(graph_def, fetches, fold_batch_norms=False)
    # without shapes, channel counts are unknown: only the IdentityN pass-throughs (which need none) go
    assert {r.rule for r in records if r.applied} <= {"identity_n"}
    assert all("weight is not a constant" in r.reason for r in records if r.rule == "dense_bias")
    new, records = canonicalize(graph_def, fetches, fold_batch_norms=False, shapes=shapes)
    assert [r.rule for r in records if r.applied and r.rule != "identity_n"] == ["dense_bias", "dense_bias"]
    [activation] = [r for r in records if r.rule == "dense_activation"]
    assert not activation.applied and "gradient_tape" in activation.reason
    assert fused(runtime_graph(graph_def, fetches)) == []
    assert fused(runtime_graph(new, fetches)) == [("_FusedMatMul", ["BiasAdd"])] * 2
