"""Records and conditions on small graphs: what a rule leaves alone, what it declines and says, what it returns."""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

from rules_support import assert_same, ops, run
from mp_rewrite.rules import RULES, Record, canonicalize, fusion_groups

RNG = np.random.default_rng(7)
# The records of the Dense rules alone (the constant Reshape targets are test_static_reshape.py's).
DENSE_RULES = tuple(rule for rule in RULES if rule.name != "static_reshape")
W = tf.constant(RNG.normal(size=(32, 64)), tf.float32)
B = tf.constant(RNG.normal(size=(64,)), tf.float32)


def _graph(body, shape=(None, 16, 32)):
    function = tf.function(body).get_concrete_function(tf.TensorSpec(shape, tf.float32, name="x"))
    constant = convert_to_constants.convert_variables_to_constants_v2(function)
    return constant.graph.as_graph_def(), [t.name for t in constant.outputs], constant.inputs[0].name


def _dense(x):
    """Keras' rank-3 Dense, as tf.tensordot writes it."""
    return tf.nn.bias_add(tf.tensordot(x, W, 1), B)


def test_a_graph_without_the_patterns_comes_back_unchanged():
    graph_def, fetches, _ = _graph(lambda x: tf.nn.relu(x) * 2.0)
    new, records = canonicalize(graph_def, fetches)
    assert records == [] and ops(new) == ops(graph_def)


def test_a_fetched_reshape_declines_and_the_record_says_so():
    graph_def, fetches, _ = _graph(_dense)
    reshape = [n.name for n in graph_def.node if n.op == "Reshape"][-1]  # the one after the MatMul
    _, records = canonicalize(graph_def, fetches + [reshape], rules=DENSE_RULES)
    [record] = records
    assert (record.rule, record.status) == ("dense_bias", "declined") and "fetched" in record.reason
    assert json.loads(json.dumps(record.as_dict()))["reason"] == record.reason
    assert str(record) == f"dense_bias declined at '{reshape}': {record.reason}"


def test_an_elementwise_function_that_is_not_gelu_is_not_rewritten_as_one():
    sigmoid_gelu = lambda x: (lambda y: y * tf.sigmoid(1.702 * y))(_dense(x))  # noqa: E731 (close to GELU, not it)
    graph_def, fetches, feed = _graph(sigmoid_gelu)
    new, records = canonicalize(graph_def, fetches)
    assert "gelu" not in [r.rule for r in records]
    x = RNG.normal(size=(4, 16, 32)).astype(np.float32)
    assert_same(run(graph_def, feed, fetches[0], x), run(new, feed, fetches[0], x))


def test_the_records_name_the_fusion_and_fusion_groups_leave_the_input_alone():
    graph_def, fetches, _ = _graph(lambda x: tf.nn.gelu(_dense(x), approximate=False))
    new, records = canonicalize(graph_def, fetches, rules=DENSE_RULES)
    assert [(r.rule, r.fusion) for r in records] == [
        ("dense_bias", "MatMul + BiasAdd"), ("dense_activation", "MatMul + BiasAdd + GeluExact"),
        ("gelu", "MatMul + BiasAdd + GeluExact")]
    assert all(isinstance(r, Record) and r.applied and r.nodes for r in records)
    snapshot = new.SerializeToString(deterministic=True)
    [group] = fusion_groups(new, fetches)
    assert new.SerializeToString(deterministic=True) == snapshot
    assert group.op == "_FusedMatMul" and all(name in {n.name for n in new.node} for name in group.nodes)
