"""Swish after a convolution, a residual add after a projection convolution and the squeeze-excite Reshape, as
Keras 3 writes them (EfficientNet, MobileNetV2): proven equal in float32 and fused by TF into the convolution in a
call (`executed`), where before they ran as a standalone `_MklSwish`, as a Conv2D + AddN + AddV2, and as
Shape + StridedSlice + Pack before each Reshape."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from rules_support import canonical, executed, frozen, keras, with_nonzero_biases
from mp_rewrite.rules import canonicalize, fusion_groups

FEED = "x:0"


def _applied(records) -> collections.Counter:
    return collections.Counter(r.rule for r in records if r.applied)


def _kernels(graph_def, fetches, x) -> collections.Counter:
    return collections.Counter(executed(graph_def, FEED, fetches[0], x))


def test_swish_after_a_folded_batch_norm_runs_inside_the_convolution():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 8))
    hidden = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inp)
    hidden = keras.layers.Activation("swish")(keras.layers.BatchNormalization()(hidden))
    out = keras.layers.Conv2D(16, 1, activation="silu")(hidden)
    model = with_nonzero_biases(keras.Model(inp, out))
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 8)).astype(np.float32)
    before, after, records, fetches = canonical(model, x)
    assert _applied(records) == {"batchnorm_fold": 1, "identity_n": 2, "swish": 2}
    assert {r.fusion for r in records if r.rule == "swish"} == {"Conv2D + BiasAdd + Swish"}
    swish_conv = ("_MklNativeFusedConv2D", ("BiasAdd", "_MklSwish"))
    assert _kernels(before, fetches, x)[("_MklSwish", ())] == 2
    assert _kernels(after, fetches, x) == {swish_conv: 2}
    assert [(g.op, g.fused_ops) for g in fusion_groups(after, fetches)] == [("_FusedConv2D", swish_conv[1])] * 2


def test_a_fetched_identity_n_stays():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 4))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.Conv2D(4, 1, activation="swish")(inp)))
    graph_def, fetches, _ = frozen(model, (2, 8, 8, 4))
    [identity_n] = [n.name for n in graph_def.node if n.op == "IdentityN"]
    new, records = canonicalize(graph_def, fetches + [identity_n])
    [record] = [r for r in records if r.rule == "identity_n"]
    assert not record.applied and "fetched" in record.reason
    assert identity_n in {n.name for n in new.node}


def test_a_computed_reshape_target_becomes_a_constant_when_shape_inference_knows_it():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 16))
    squeezed = keras.layers.Reshape((1, 1, 16))(keras.layers.GlobalAveragePooling2D()(inp))
    model = keras.Model(inp, keras.layers.Multiply()([inp, keras.layers.Conv2D(16, 1, activation="sigmoid")(
        squeezed)]))
    with_nonzero_biases(model)
    x = np.random.default_rng(4).normal(size=(2, 8, 8, 16)).astype(np.float32)
    before, after, records, fetches = canonical(model, x)
    [record] = [r for r in records if r.rule == "static_reshape"]
    assert record.applied and "[-1, 1, 1, 16]" in record.reason
    assert {"Shape", "StridedSlice", "Pack"} <= {op for op, _ in executed(before, FEED, fetches[0], x)}
    assert not {"Shape", "StridedSlice", "Pack"} & {op for op, _ in executed(after, FEED, fetches[0], x)}


def test_a_residual_sum_of_three_tensors_is_declined_with_its_reason():
    import tensorflow as tf
    rng = np.random.default_rng(2)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 8, 8, 8), name="x")
        conv = tf.nn.conv2d(x, tf.constant(rng.normal(size=(1, 1, 8, 8)).astype(np.float32)), 1, "SAME")
        total = tf.math.add_n([conv, x, tf.nn.relu(x)])
        tf.identity(total + tf.constant(rng.normal(size=8).astype(np.float32)), name="out")
    _, records = canonicalize(graph.as_graph_def(), ["out:0"])
    [record] = [r for r in records if r.rule == "residual_bias"]
    assert not record.applied and "adds 2 tensors besides the contraction" in record.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MobileNetV2", "EfficientNetB0"])
def test_keras_applications_run_no_standalone_bias_swish_or_residual_add(name):
    """Grappler's arithmetic optimizer regroups their projections' residual sums as AddN(conv, residual) + shift
    (a small Keras model of the same blocks keeps (conv + shift) + residual, which fuses already)."""
    model = with_nonzero_biases(getattr(keras.applications, name)(weights=None, input_shape=(64, 64, 3),
                                                                  include_top=False))
    x = np.random.default_rng(3).normal(size=(2, 64, 64, 3)).astype(np.float32)
    before, after, records, fetches = canonical(model, x, deep=True)
    assert ("AddN", ()) in executed(before, FEED, fetches[0], x)
    kernels = collections.Counter(executed(after, FEED, fetches[0], x))
    assert not {op for op, _ in kernels} & {"Pad", "AddN", "BiasAdd", "_MklNativeConv2D", "Relu6", "Shape"}, kernels
    residuals = _applied(records)["residual_bias"]
    assert residuals == {"MobileNetV2": 10, "EfficientNetB0": 9}[name]
    assert kernels[("_MklNativeFusedConv2D", ("BiasAdd", "Add"))] == residuals
    if name == "EfficientNetB0":  # the 16 left are after depthwise convolutions, which TF 2.21 does not fuse
        assert kernels[("_MklSwish", ())] == 16


@pytest.mark.slow
def test_fusion_groups_are_what_a_call_runs_on_mobilenet_v3():
    """MobileNetV3's hard swish (x * relu6(x + 3) / 6, recognized by evaluating it) after Conv2D and depthwise
    convolutions, its squeeze-excite hard sigmoid and its residual adds: the groups the precision pass keeps in one
    precision are the kernels TF runs."""
    model = with_nonzero_biases(keras.applications.MobileNetV3Small(weights=None, input_shape=(64, 64, 3),
                                                                    include_top=False))
    x = np.random.default_rng(5).normal(size=(2, 64, 64, 3)).astype(np.float32)
    _, after, _, fetches = canonical(model, x, deep=True)
    ran = collections.Counter((op.replace("_MklNative", "_"), fused) for op, fused in executed(after, FEED, fetches[0], x)
                              if op.startswith("_MklNativeFused"))
    groups = collections.Counter((g.op, g.fused_ops) for g in fusion_groups(after, fetches))
    assert groups == ran
    assert groups[("_FusedDepthwiseConv2dNative", ("BiasAdd", "_FusedHardSwish"))] > 0
