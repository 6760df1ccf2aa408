"""`scale_into_weights`: Keras 3 MultiHeadAttention's score scale (a Mul over [batch, heads, T, S]) goes into the
query projection's weights; proven equal in float32 and gone from what a call runs."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from rules_support import canonical, executed, keras, with_nonzero_biases
from mp_rewrite.rules import canonicalize


def test_the_attention_scale_runs_inside_the_query_projection():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.MultiHeadAttention(4, 8)(inp, inp)))
    x = np.random.default_rng(0).normal(size=(2, 16, 32)).astype(np.float32)
    before, after, records, fetches = canonical(model, x)
    [record] = [r for r in records if r.rule == "scale_into_weights"]
    assert record.applied and "0.353553" in record.reason and "query" in record.reason  # 1 / sqrt(8)
    muls = [collections.Counter(op for op, _ in executed(g, "x:0", fetches[0], x))["Mul"] for g in (before, after)]
    assert muls[1] == muls[0] - 1


def test_a_product_of_a_projection_with_itself_is_left_alone():
    """einsum(q, q) * c: scaling q's weights would scale the product by c squared."""
    rng = np.random.default_rng(1)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (4, 8), name="x")
        q = tf.matmul(x, tf.constant(rng.normal(size=(8, 8)).astype(np.float32)))
        tf.identity(tf.einsum("ij,kj->ik", q, q) * 0.5, name="out")
    new, records = canonicalize(graph.as_graph_def(), ["out:0"])
    assert not [r for r in records if r.rule == "scale_into_weights"]
    assert "Mul" in {n.op for n in new.node}
