"""Grouped convolutions Keras 3 compiles with XLA (`_conv_xla` calls) become TF's native kernels: a depthwise one
(groups = channels, as ConvNeXt writes it) one DepthwiseConv2dNative that TF fuses with its bias; other groups a
Conv2D per group; equal in float32, no XLA function left in the graph."""

from __future__ import annotations

import numpy as np
import pytest

from rules_support import canonical, fused, keras, ops, runtime_graph, with_nonzero_biases

IMAGE = np.random.default_rng(9).normal(size=(2, 16, 16, 32)).astype(np.float32)


@pytest.mark.parametrize("groups, multiplier, kernel", [(32, 1, "DepthwiseConv2dNative"), (32, 2, "DepthwiseConv2dNative"),
                                                         (4, 1, "Conv2D")])
def test_an_xla_grouped_convolution_becomes_native(groups, multiplier, kernel):
    keras.utils.set_random_seed(0)
    inp = keras.Input(IMAGE.shape[1:])
    out = keras.layers.Conv2D(32 * multiplier, 7 if groups == 32 else 3, padding="same", groups=groups)(inp)
    model = with_nonzero_biases(keras.Model(inp, keras.layers.ReLU()(out)))
    before, after, records, fetches = canonical(model, IMAGE)  # equal in float32
    assert [r.rule for r in records if r.applied][:1] == ["grouped_conv"]
    assert "StatefulPartitionedCall" in ops(before) and before.library.function
    assert "StatefulPartitionedCall" not in ops(after) and not after.library.function
    executed = ops(runtime_graph(after, fetches))
    if kernel == "DepthwiseConv2dNative":
        assert fused(runtime_graph(after, fetches)) == [("_FusedDepthwiseConv2dNative", ["BiasAdd", "Relu"])]
    else:
        assert executed.count("Conv2D") == groups
