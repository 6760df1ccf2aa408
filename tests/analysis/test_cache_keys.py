"""What a conversion keeps between runs (measured costs: analysis/profile_cache.py; split and dispatch timings:
savedmodel/timing_cache.py) is keyed on the graph's bytes, read the same whatever has run the graph before:
TensorFlow's import_graph_def writes default attrs into the GraphDef it is given, and reading an absent attr adds an
empty one."""

from __future__ import annotations

import tensorflow as tf

from mp_rewrite.analysis.profile_cache import graph_bytes


def _graph():
    @tf.function
    def f(x):
        return tf.matmul(x, tf.ones([4, 3])) + 1.0
    graph_def = f.get_concrete_function(tf.TensorSpec([None, 4], tf.float32)).graph.as_graph_def()
    for node in graph_def.node:  # as a rule's rewrite leaves it: no default attrs written
        for name in ("transpose_a", "transpose_b"):
            if node.op == "MatMul":
                del node.attr[name]
    return graph_def


def test_a_graph_reads_the_same_after_tensorflow_imported_it_or_an_absent_attr_was_read():
    given = _graph()
    key = graph_bytes(given)
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(given, name="")  # writes transpose_a/b: false into `given` itself
    [matmul] = [n for n in given.node if n.op == "MatMul"]
    assert matmul.attr["transpose_a"].WhichOneof("value") == "b"  # what TensorFlow did to the caller's proto
    assert graph_bytes(given) == key
    fresh = _graph()
    [matmul] = [n for n in fresh.node if n.op == "MatMul"]
    assert not matmul.attr["transpose_a"].b  # reading adds an empty AttrValue to the map
    assert "transpose_a" in matmul.attr and graph_bytes(fresh) == key


def test_a_graph_that_differs_reads_differently():
    other = _graph()
    [matmul] = [n for n in other.node if n.op == "MatMul"]
    matmul.attr["transpose_b"].b = True
    assert graph_bytes(other) != graph_bytes(_graph())
