"""`residual_rows`: a Dense on 3-D inputs plus a residual runs as one `_FusedMatMul [BiasAdd, Add]` in a call,
equal in float32; an add whose residual's batch could broadcast over the Dense's is declined with its reason and
keeps running when it does broadcast; `row_origin` follows Reshapes by the factor they change the rows by."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

from rules_support import canonical, executed, keras, run, with_nonzero_biases
from mp_rewrite.analysis.grappler import FOLDING, optimize_graph
from mp_rewrite.rules import canonicalize
from mp_rewrite.rules.graph import EditableGraph
from mp_rewrite.rules.rows import row_origin

X3 = np.random.default_rng(3).normal(size=(4, 16, 32)).astype(np.float32)


def _feed_forward_block():
    """LayerNorm(x + Dense(GELU(Dense(x)))), a Transformer's feed-forward half."""
    keras.utils.set_random_seed(0)
    inp = keras.Input(X3.shape[1:])
    hidden = keras.layers.Dense(64, activation="gelu")(inp)
    out = keras.layers.LayerNormalization()(inp + keras.layers.Dense(32)(hidden))
    return with_nonzero_biases(keras.Model(inp, keras.layers.Dense(8)(out)))


def test_a_residual_add_after_a_dense_on_3d_inputs_runs_inside_the_matmul():
    before, after, records, fetches = canonical(_feed_forward_block(), X3)  # equal in float32 (checked there)
    assert [r.applied for r in records if r.rule == "residual_rows"] == [True], records
    ran_before = executed(before, "x:0", fetches[0], X3)
    ran_after = executed(after, "x:0", fetches[0], X3)
    fused = [ops for op, ops in ran_after if "FusedMatMul" in op]
    assert ("BiasAdd", "Add") in fused and ("BiasAdd", "Add") not in [ops for _, ops in ran_before], ran_after
    assert [op for op, _ in ran_after].count("AddV2") < [op for op, _ in ran_before].count("AddV2")


def test_a_residual_whose_batch_may_broadcast_is_declined_and_still_runs_broadcast():
    """The residual is a second input: at a call it may have batch 1 and broadcast over the Dense's batch, and the
    rows of the two would differ."""
    keras.utils.set_random_seed(0)
    x, residual = keras.Input(X3.shape[1:]), keras.Input(X3.shape[1:])
    model = with_nonzero_biases(keras.Model([x, residual], keras.layers.Dense(32)(x) + residual))
    spec = tf.TensorSpec((None,) + X3.shape[1:], tf.float32)
    function = tf.function(lambda a, b: model([a, b])).get_concrete_function(spec, spec)
    constant = convert_to_constants.convert_variables_to_constants_v2(function)
    fetches = [t.name for t in constant.outputs]
    graph_def, records = canonicalize(optimize_graph(constant.graph.as_graph_def(), fetches, FOLDING), fetches)
    declined = [r for r in records if r.rule == "residual_rows"]
    assert declined and not declined[0].applied and "not proven" in declined[0].reason, records

    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    feeds = [wrapped.graph.get_tensor_by_name(t.name) for t in constant.inputs]
    call = wrapped.prune(feeds, wrapped.graph.get_tensor_by_name(fetches[0]))
    out = call(tf.constant(X3), tf.constant(X3[:1]))  # the residual broadcasts over the batch
    assert out.shape == X3.shape
    np.testing.assert_allclose(out.numpy(), model([X3, np.broadcast_to(X3[:1], X3.shape)]).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_row_origin_follows_reshapes_by_their_factor():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 16, 32), name="x")
        rows = tf.reshape(x, [-1, 32], name="rows")  # 16 rows per batch row
        pairs = tf.reshape(tf.nn.relu(rows), [-1, 64], name="pairs")  # 8
        other = tf.compat.v1.placeholder(tf.float32, (None, 16, 32), name="other")
        tf.identity(pairs, name="out")
        tf.add(x, other, name="sum")
        tf.add(x, tf.ones((1, 16, 32)), name="biased")
    editable = EditableGraph(graph.as_graph_def())
    assert row_origin(editable, "rows") == ("x", Fraction(16))
    assert row_origin(editable, "out") == ("x", Fraction(8))
    assert row_origin(editable, "biased") == ("x", Fraction(1))  # the constant of batch 1 broadcasts
    assert row_origin(editable, "sum") == ("sum", Fraction(1))  # two batches that may differ: no proof


def test_the_rewritten_block_runs_at_other_batches():
    graph_def, after, _, fetches = canonical(_feed_forward_block(), X3)
    for batch in (1, 7):
        x = np.random.default_rng(batch).normal(size=(batch,) + X3.shape[1:]).astype(np.float32)
        np.testing.assert_allclose(run(after, "x:0", fetches[0], x), run(graph_def, "x:0", fetches[0], x),
                                   rtol=1e-5, atol=1e-5)
