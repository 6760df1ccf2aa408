"""The picture and the time view of a frozen output (`convert --freeze`), inspected: a MobileNetV2 block in small
(convolution, BatchNorm, ReLU6 layers; a depthwise one; a projection and a residual add), with non-zero BatchNorm
statistics so that freezing leaves a bias for TF to fuse (with `weights=None`'s zero statistics TF's constant
folding drops every bias, and TF runs no fused kernel at all: 35 Conv2D and 35 Relu6 kernels of their own).

In a model converted before, every op already computes in bfloat16 and is "untouched" by the rewrite; the picture
folded such boxes into the box they feed as if they computed nothing (masks, shapes), so each ReLU6 layer joined
the convolution after it, and with it the fused kernel TF names after the ReLU6. TF's fused kernel is the
convolution's: its time and name belong in the box of the convolution it starts from."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.report.layer_times import time_label
from mp_rewrite.report.node_table import build_tables
from mp_rewrite.report.whole_model import layer_picture, picture_times

CONTRACTIONS = {"Conv2D", "DepthwiseConv2dNative"}


def _block(path: str) -> str:
    """Export MobileNetV2's stem and one inverted residual block (its layer names) at 32x32, BatchNorm statistics
    made up (non-zero)."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    from keras import layers
    keras.utils.clear_session()
    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False, name="Conv1")(inputs)
    x = layers.BatchNormalization(name="bn_Conv1")(x)
    x = stem = layers.ReLU(6.0, name="Conv1_relu")(x)
    x = layers.Conv2D(48, 1, use_bias=False, name="block_1_expand")(x)
    x = layers.BatchNormalization(name="block_1_expand_BN")(x)
    x = layers.ReLU(6.0, name="block_1_expand_relu")(x)
    x = layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="block_1_depthwise")(x)
    x = layers.BatchNormalization(name="block_1_depthwise_BN")(x)
    x = layers.ReLU(6.0, name="block_1_depthwise_relu")(x)
    x = layers.Conv2D(16, 1, use_bias=False, name="block_1_project")(x)
    x = layers.BatchNormalization(name="block_1_project_BN")(x)
    x = layers.Add(name="block_1_add")([stem, x])
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(inputs, layers.Dense(10, name="predictions")(x))
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            shape = layer.get_weights()[0].shape
            layer.set_weights([rng.uniform(0.5, 1.5, shape), rng.normal(0, 0.1, shape), rng.normal(0, 0.1, shape),
                               rng.uniform(0.5, 1.5, shape)])
    model.export(path, verbose=False)
    return path


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    from mp_rewrite.savedmodel.convert import convert_saved_model
    root = tmp_path_factory.mktemp("frozen_block")
    out = str(root / "frozen")
    convert_saved_model(_block(str(root / "source")), out, "bfloat16", freeze=True, flops=False)
    return out


def _picture(path: str, options=None):
    result = rewrite_model(load_model(path), "bfloat16", options=options)
    tables = build_tables(result, with_flops=False)
    graph, _, _ = layer_picture(result, None, 150, tables)
    return result, tables, graph


def _label_of(graph, op: str) -> list:
    return sorted(graph.layers[graph.box_of[n]].label for n, row in graph.table.rows.items()
                  if row.op == op and n in graph.box_of)


def test_each_activation_of_a_frozen_output_is_its_own_box(frozen):
    _, _, graph = _picture(frozen)
    # Every op of the frozen output already computes in bfloat16 (untouched by this rewrite): the ReLU6 layers
    # compute, so none of them is folded into the convolution it feeds.
    assert _label_of(graph, "Relu6") == ["Conv1_relu", "block_1_depthwise_relu", "block_1_expand_relu"]
    assert set(_label_of(graph, "DepthwiseConv2dNative")) == {"block_1_depthwise"}


def _has_bf16_units() -> bool:
    from mp_rewrite.analysis.op_costs import NATIVE_FLAGS, machine_facts
    return bool(set(NATIVE_FLAGS["bfloat16"]) & set(machine_facts()["cpu_flags"]))


@pytest.mark.slow
@pytest.mark.skipif(not _has_bf16_units(), reason="no bfloat16 units: nothing is measured")
def test_a_fused_kernel_is_in_the_box_of_the_convolution_it_starts_from(frozen, tmp_path, monkeypatch):
    from mp_rewrite.analysis.op_costs import this_machine
    from mp_rewrite.core.options import make_options
    from mp_rewrite.savedmodel.measured_costs import in_place_costs
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = load_model(frozen)
    options = in_place_costs(make_options("bfloat16", assign="cost", costs=this_machine("bfloat16")), model.path,
                             model.meta_graph)
    result, tables, graph = _picture(frozen, options)
    view = picture_times(graph, tables, options.costs, result)
    by_label = {graph.layers[key].label: (key, t) for key, t in view.layers.items()}
    fused = {label: t.kernels[0][0] for label, (_, t) in by_label.items() if t.kernels}
    # TF ran the stem, the expansion and the depthwise convolution with their bias and ReLU6, and the projection
    # with its bias and the residual add, each one kernel: named in the box holding its convolution.
    assert len(fused) >= 3 and all(k.endswith(("BiasAdd+Relu6", "BiasAdd+Add", "BiasAdd")) for k in fused.values())
    for label, kernel in fused.items():
        ops = {graph.table.rows[n].op for n in graph.layers[by_label[label][0]].members}
        assert ops & CONTRACTIONS, (label, kernel, ops)
        assert by_label[label][1].timed and by_label[label][1].ms > 0
    relus = [label for label in by_label if label.endswith("_relu")]
    assert relus and all(not by_label[label][1].kernels for label in relus)
    said = {label: time_label(by_label[label][1], view.complete) for label in relus}
    assert any(text.startswith("ran in block_1_") and text.endswith("'s kernel") for text in said.values()), said
