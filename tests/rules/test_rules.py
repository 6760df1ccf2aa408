"""Every rule on real Keras 3 graphs: the rewrite computes the same in float32, and TensorFlow (the Grappler it runs
before every call, on this CPU) really fuses what the rule exposes; a rule that cannot apply says why."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from rules_support import (assert_same, canonical, dense_gelu, fused, keras, ops, run, runtime_graph,  # noqa: I001
                           with_nonzero_biases)
from mp_rewrite.rules import canonicalize, fusion_groups

X3 = np.random.default_rng(1).normal(size=(8, 16, 32)).astype(np.float32)


def _applied(records) -> list:
    """The rules applied, the constant Reshape targets left out (they are test_static_reshape.py's)."""
    return [r.rule for r in records if r.applied and r.rule != "static_reshape"]


@pytest.mark.parametrize("approximate, form", [(False, "GeluExact"), (True, "GeluApproximate")])
def test_dense_gelu_on_rank_3_becomes_one_fused_matmul(approximate, form):
    before, after, records, fetches = canonical(dense_gelu(approximate), X3)
    assert _applied(records) == ["dense_bias", "dense_activation", "gelu"]
    assert fused(runtime_graph(before, fetches)) == []
    assert fused(runtime_graph(after, fetches)) == [("_FusedMatMul", ["BiasAdd", form])]
    [group] = fusion_groups(after, fetches)
    assert group.fused_ops == ("BiasAdd", form) and len(group.nodes) >= 6


@pytest.mark.parametrize("activation, fused_op", [("relu", "Relu"), ("sigmoid", "Sigmoid")])
def test_dense_with_a_one_op_activation(activation, fused_op):
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.Dense(64, activation=activation)(inp)))
    before, after, records, fetches = canonical(model, X3)
    assert _applied(records) == ["dense_bias", "dense_activation"]
    assert fused(runtime_graph(after, fetches)) == [("_FusedMatMul", ["BiasAdd", fused_op])]
    assert [g.fused_ops for g in fusion_groups(after, fetches)] == [("BiasAdd", fused_op)]


def test_multi_head_attention_projections_become_fused_matmuls():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.MultiHeadAttention(4, 8)(inp, inp)))
    before, after, records, fetches = canonical(model, X3)
    assert _applied(records).count("batch_matmul") == 4 and _applied(records).count("dense_bias") == 4
    assert "BatchMatMulV2" in ops(before) and "BatchMatMulV2" not in ops(after)
    assert fused(runtime_graph(before, fetches)) == []
    assert fused(runtime_graph(after, fetches)) == [("_FusedMatMul", ["BiasAdd"])] * 4


@pytest.mark.parametrize("adjoint", [False, True])
def test_a_batched_matmul_by_a_weight_that_is_not_square_becomes_a_matmul(adjoint):
    # keras-hub Gemma 3's gating matmul ([?, 256] by a [256, 128] weight): the rule once reshaped the rows to the
    # weight's columns, TensorFlow refused the graph, and the safety net left the rule out of the whole model.
    weight = np.random.default_rng(0).normal(size=(48, 32) if adjoint else (32, 48)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 16, 32], name="x")])
    def matmul(x):
        return tf.identity(tf.raw_ops.BatchMatMulV2(x=x, y=tf.constant(weight), adj_y=adjoint), name="out")
    graph_def = matmul.get_concrete_function().graph.as_graph_def()
    new, records = canonicalize(graph_def, ["out"])
    assert _applied(records) == ["batch_matmul"], records
    assert "BatchMatMulV2" not in ops(new) and "MatMul" in ops(new)
    assert_same(run(graph_def, "x:0", "out:0", X3), run(new, "x:0", "out:0", X3))


def test_conv_batch_norm_relu_folds_and_fuses():
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 3, padding="same")(inp))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.ReLU()(x)))
    image = np.random.default_rng(2).normal(size=(2, 12, 12, 3)).astype(np.float32)
    before, after, records, fetches = canonical(model, image)
    [record] = [r for r in records if r.applied]
    assert record.rule == "batchnorm_fold" and record.fusion == "Conv2D + BiasAdd"
    assert ("_FusedConv2D", ["BiasAdd", "Relu"]) not in fused(runtime_graph(before, fetches))
    assert fused(runtime_graph(after, fetches)) == [("_FusedConv2D", ["BiasAdd", "Relu"])]
    assert [g.fused_ops for g in fusion_groups(after, fetches)] == [("BiasAdd", "Relu")]


def _tf_graph(body, shape):
    """A frozen graph of a plain tf.function (constants captured as Consts), its fetches and feed."""
    function = tf.function(body).get_concrete_function(tf.TensorSpec(shape, tf.float32, name="x"))
    from tensorflow.python.framework import convert_to_constants
    constant = convert_to_constants.convert_variables_to_constants_v2(function)
    return constant.graph.as_graph_def(), [t.name for t in constant.outputs], constant.inputs[0].name


RNG = np.random.default_rng(3)
W2, B2 = tf.constant(RNG.normal(size=(32, 64)), tf.float32), tf.constant(RNG.normal(size=(64,)), tf.float32)
K4, B4 = tf.constant(RNG.normal(size=(3, 3, 4, 8)), tf.float32), tf.constant(RNG.normal(size=(1, 1, 1, 8)), tf.float32)
CONV = lambda x: tf.nn.conv2d(x, K4, 1, "SAME")  # noqa: E731


@pytest.mark.parametrize("body, shape, fused_op", [
    (lambda x: tf.nn.relu(tf.matmul(x, W2) + B2), (8, 32), "_FusedMatMul"),
    (lambda x: tf.nn.relu(CONV(x) + B4), (2, 6, 6, 4), "_FusedConv2D"),
])
def test_an_add_of_a_per_channel_constant_becomes_a_bias_add(body, shape, fused_op):
    graph_def, fetches, feed = _tf_graph(body, shape)
    new, records = canonicalize(graph_def, fetches, fold_batch_norms=False)
    assert _applied(records) == ["bias_add"]
    x = RNG.normal(size=shape).astype(np.float32)
    assert_same(run(graph_def, feed, fetches[0], x), run(new, feed, fetches[0], x))
    assert "BiasAdd" not in ops(graph_def) and "BiasAdd" in ops(new)
    # TF's arithmetic optimizer makes the same BiasAdd at run time on its own; the rule makes it visible before
    # that (to fusion_groups, to the precision pass, to the Dense rules after a Reshape).
    assert fused(runtime_graph(graph_def, fetches)) == fused(runtime_graph(new, fetches)) == [
        (fused_op, ["BiasAdd", "Relu"])]


def test_an_add_that_differs_along_space_declines_with_the_reason():
    per_position = tf.constant(RNG.normal(size=(6, 6, 1)), tf.float32)
    graph_def, fetches, _ = _tf_graph(lambda x: tf.nn.relu(CONV(x) + per_position), (2, 6, 6, 4))
    new, records = canonicalize(graph_def, fetches)
    declined = {r.rule: r.reason for r in records if not r.applied}
    assert _applied(records) == []
    assert "not one value per channel" in declined["bias_add"]
    assert "not one value per output channel" in declined["batchnorm_fold"]


def test_a_shared_contraction_output_declines_with_the_reason():
    def body(x):
        conv = CONV(x)
        return conv + B4, conv * 2.0
    graph_def, fetches, _ = _tf_graph(body, (2, 6, 6, 4))
    graph_def = frozen_fold(graph_def, fetches)
    new, records = canonicalize(graph_def, fetches)
    assert _applied(records) == []
    reasons = {r.rule: r.reason for r in records}
    assert "read by 2 nodes" in reasons["bias_add"] and "read by 2 nodes" in reasons["batchnorm_fold"]


def frozen_fold(graph_def, fetches):
    from mp_rewrite.analysis.grappler import FOLDING, optimize_graph
    return optimize_graph(graph_def, fetches, FOLDING)


def test_a_dense_bias_that_differs_per_position_declines():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    offset = RNG.normal(size=(16, 64)).astype(np.float32)
    dense = keras.layers.Dense(64, use_bias=False)(inp)
    model = keras.Model(inp, keras.layers.Lambda(lambda t: tf.nn.relu(t + offset))(dense))
    _, after, records, fetches = canonical(model, X3)
    [record] = [r for r in records if r.rule == "dense_bias"]
    assert not record.applied and "not one value per channel" in record.reason
    assert str(record).startswith("dense_bias declined at ")


def test_tf_keras_multi_head_attention_einsums_become_fused_matmuls():
    import tf_keras
    tf_keras.utils.set_random_seed(0)
    inp = tf_keras.Input((16, 32))
    model = tf_keras.Model(inp, tf_keras.layers.MultiHeadAttention(4, 8)(inp, inp))
    for weight in model.weights:
        if "bias" in weight.name:
            weight.assign(RNG.normal(0, 0.3, weight.shape))
    before, after, records, fetches = canonical(model, X3)
    assert _applied(records).count("einsum") == 4 and _applied(records).count("dense_bias") == 4
    assert fused(runtime_graph(before, fetches)) == []
    assert fused(runtime_graph(after, fetches)) == [("_FusedMatMul", ["BiasAdd"])] * 4


def test_fusion_groups_are_what_tensorflow_fuses_in_a_transformer_block():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    x = keras.layers.LayerNormalization()(inp + keras.layers.MultiHeadAttention(4, 8)(inp, inp))
    hidden = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(x))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.LayerNormalization()(x + hidden)))
    before, after, records, fetches = canonical(model, X3)
    assert not [r for r in records if not r.applied]
    tf_fused = sorted(tuple(ops) for _, ops in fused(runtime_graph(after, fetches)))
    assert tf_fused == sorted(g.fused_ops for g in fusion_groups(after, fetches))
    # query, key and value; the attention output and the FFN's second Dense with their residual adds
    # (residual_rows); the FFN's first Dense and its GELU; the two LayerNorms (each one _MklLayerNorm)
    assert tf_fused == sorted([("BiasAdd",)] * 3 + [("BiasAdd", "Add")] * 2 + [("BiasAdd", "GeluExact")] + [()] * 2)
    assert [op for op, _ in fused(runtime_graph(after, fetches))].count("_MklLayerNorm") == 2
    assert len(fused(runtime_graph(before, fetches))) < len(tf_fused)


def test_conv1d_moves_its_squeeze_so_the_activation_fuses():
    keras.utils.set_random_seed(0)
    inp = keras.Input((20, 8))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.Conv1D(16, 3, activation="relu")(inp)))
    signal = np.random.default_rng(4).normal(size=(2, 20, 8)).astype(np.float32)
    before, after, records, fetches = canonical(model, signal)
    assert _applied(records) == ["conv1d_bias", "conv1d_activation"]
    assert fused(runtime_graph(before, fetches)) == [("_FusedConv2D", ["BiasAdd"])]  # Conv2D + Squeeze + BiasAdd
    assert fused(runtime_graph(after, fetches)) == [("_FusedConv2D", ["BiasAdd", "Relu"])]
    assert [g.fused_ops for g in fusion_groups(before, fetches)] == [("BiasAdd",)]
    assert [g.fused_ops for g in fusion_groups(after, fetches)] == [("BiasAdd", "Relu")]


@pytest.mark.parametrize("activation, groups", [
    ("silu", [("_FusedConv2D", ("BiasAdd", "_MklSwish"))]),  # rules/swish.py and identity.py make it one
    ("relu6", [("_FusedConv2D", ("BiasAdd", "Relu6"))])])
def test_fusion_groups_of_convolutions_match_tensorflow(activation, groups):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 16))
    conv = keras.layers.Conv2D(16, 3, activation=activation)(inp)
    model = with_nonzero_biases(keras.Model(inp, keras.layers.ReLU()(inp[:, 1:-1, 1:-1, :] + conv)))
    image = np.random.default_rng(5).normal(size=(2, 8, 8, 16)).astype(np.float32)
    _, after, _, fetches = canonical(model, image)
    assert [(op, tuple(ops)) for op, ops in fused(runtime_graph(after, fetches))] == groups
    assert [(g.op, g.fused_ops) for g in fusion_groups(after, fetches)] == groups
