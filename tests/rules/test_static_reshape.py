"""`static_reshape` with shape_math: Keras' Tensordot targets (`Shape -> GatherV2 -> Prod -> Pack`, what a Dense on
3-D inputs reshapes by) become constants with -1 for the batch, so a call runs no int32 shape arithmetic; a target
that is not provably one constant up to the batch is left alone."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from rules_support import canonical, executed, keras, with_nonzero_biases
from mp_rewrite.rules.graph import EditableGraph
from mp_rewrite.rules.shape_math import constant_target

SHAPE_OPS = {"Shape", "GatherV2", "Prod", "Pack", "ConcatV2", "StridedSlice"}


def test_a_transformer_feed_forward_runs_no_shape_arithmetic():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    hidden = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(inp))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.LayerNormalization()(hidden + inp)))
    x = np.random.default_rng(0).normal(size=(2, 16, 32)).astype(np.float32)
    before, after, records, fetches = canonical(model, x)
    targets = [r.reason.rsplit("constant ", 1)[1] for r in records if r.rule == "static_reshape" and r.applied]
    assert {"[-1, 32]", "[-1, 64]", "[-1, 16, 64]", "[-1, 16, 32]"} <= set(targets)
    ran_before = collections.Counter(op for op, _ in executed(before, "x:0", fetches[0], x))
    ran_after = collections.Counter(op for op, _ in executed(after, "x:0", fetches[0], x))
    assert sum(ran_before[op] for op in SHAPE_OPS) >= 10
    # what is left counts the residual's rows from the MatMul's input (residual_rows: the add runs inside the MatMul)
    assert {op: ran_after[op] for op in SHAPE_OPS if ran_after[op]} == {"Shape": 1, "StridedSlice": 1, "ConcatV2": 1}
    assert not ran_after["AddV2"], ran_after


def _target_of(build) -> list | None:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 4, 6), name="x")
        target = build(tf.shape(x))
        tf.reshape(x, target, name="out")
    graph_def = graph.as_graph_def()
    reshape = next(n for n in graph_def.node if n.name == "out")
    return constant_target(EditableGraph(graph_def, ["out"]), reshape.input[1])


def test_only_targets_linear_in_the_batch_are_constants():
    assert _target_of(lambda s: tf.stack([s[0] * s[1], s[2]])) == [-1, 6]
    assert _target_of(lambda s: tf.stack([tf.reduce_prod(s[:2]), s[2]])) == [-1, 6]
    assert _target_of(lambda s: tf.concat([s[:1], [24]], 0)) == [-1, 24]
    assert _target_of(lambda s: tf.stack([s[0] * s[0], 24])) is None  # the batch twice: no -1 says that
    assert _target_of(lambda s: tf.stack([s[0], s[1] + 0, 6])) is None  # an Add is not one of its ops
    # the batch and a literal -1 (keras-hub's ViT: `reshape(x, (shape(x)[0], -1, C))`): two -1s would not run
    assert _target_of(lambda s: tf.stack([s[0], -1, s[2]])) is None
