"""ZeroPadding2D before a convolution: the convolution pads as it reads (SAME where the Pad is SAME's padding, as
Keras applications' `correct_pad` is; EXPLICIT for a Conv2D otherwise), no Pad kernel runs, the outputs are equal in
float32 and TF still fuses the convolution with its bias and activation. A depthwise convolution whose Pad is not
SAME's declines: TF 2.21 aborts the process on a DepthwiseConv2dNative with explicit padding."""

from __future__ import annotations

import numpy as np
import pytest

from rules_support import canonical, fused, keras, ops, runtime_graph, with_nonzero_biases

IMAGE = np.random.default_rng(3).normal(size=(2, 32, 32, 16)).astype(np.float32)


def _padded(layer, padding):
    keras.utils.set_random_seed(0)
    inp = keras.Input(IMAGE.shape[1:])
    out = keras.layers.ReLU(6.0)(layer(keras.layers.ZeroPadding2D(padding)(inp)))
    return with_nonzero_biases(keras.Model(inp, out))


@pytest.mark.parametrize("layer, padding, mode", [
    (lambda: keras.layers.Conv2D(24, 3, strides=2), ((1, 1), (1, 1)), "EXPLICIT"),
    (lambda: keras.layers.Conv2D(24, 7, strides=2), ((3, 3), (3, 3)), "EXPLICIT"),  # ResNet's stem
    (lambda: keras.layers.Conv2D(24, 3, strides=2), ((0, 1), (0, 1)), "SAME"),
    (lambda: keras.layers.DepthwiseConv2D(3, strides=2), ((0, 1), (0, 1)), "SAME")])  # MobileNetV2's correct_pad
def test_the_convolution_pads_itself_and_still_fuses(layer, padding, mode):
    before, after, records, fetches = canonical(_padded(layer(), padding), IMAGE)  # equal in float32
    applied = [r for r in records if r.rule == "explicit_padding"]
    assert [r.applied for r in applied] == [True] and f"padding {mode}" in applied[0].reason
    assert "Pad" in ops(runtime_graph(before, fetches))
    assert "Pad" not in ops(runtime_graph(after, fetches))
    assert [tuple(f) for _, f in fused(runtime_graph(after, fetches))] == [("BiasAdd", "Relu6")]


def test_a_depthwise_convolution_whose_pad_is_not_same_declines():
    _, after, records, fetches = canonical(_padded(keras.layers.DepthwiseConv2D(3, strides=2), ((1, 1), (1, 1))),
                                           IMAGE)
    declined = [r for r in records if r.rule == "explicit_padding"]
    assert declined and not declined[0].applied and "aborts" in declined[0].reason
    assert "Pad" in ops(runtime_graph(after, fetches))
