"""Bad input: a clear error of the package's own type, saying what and where; nothing half-written."""

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

import mp_rewrite
from chains import chain
from mp_rewrite.errors import GraphError, MpRewriteError, OptionError


def _graph(*nodes):
    g = graph_pb2.GraphDef()
    g.node.extend(nodes)
    return g


def _node(name, op, inputs=(), **type_attrs):
    n = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))
    for k, v in type_attrs.items():
        n.attr[k].type = v
    return n


def test_missing_input_node_names_node_and_input():
    g = _graph(_node("relu", "Relu", ["nowhere:0"], T=1))
    with pytest.raises(GraphError, match=r"node 'relu' has input 'nowhere:0', but no node is named 'nowhere'"):
        mp_rewrite.rewrite_graph_def(g)


def test_unknown_op_names_node_and_op():
    g = _graph(_node("x", "NoSuchOpAnywhere"))
    with pytest.raises(GraphError, match=r"node 'x' uses op 'NoSuchOpAnywhere'"):
        mp_rewrite.rewrite_graph_def(g)


def test_wrong_input_count():
    g = _graph(_node("a", "Placeholder", dtype=1), _node("m", "MatMul", ["a"], T=1))
    with pytest.raises(GraphError, match=r"expected MatMul node 'm' to have 2 data input\(s\), but got 1"):
        mp_rewrite.rewrite_graph_def(g)


def test_unknown_fetch():
    graph_def, _, _ = chain("MatMul")
    with pytest.raises(GraphError, match="fetch or preserved node 'loss' is not in the graph"):
        mp_rewrite.rewrite_graph_def(graph_def, fetches=["loss:0"])


def test_wrong_precision_device_and_type():
    graph_def, _, _ = chain("MatMul")
    with pytest.raises(OptionError, match="unknown precision 'half'"):
        mp_rewrite.rewrite_graph_def(graph_def, precision="half")
    with pytest.raises(OptionError, match="unknown device 'tpu'"):
        mp_rewrite.rewrite_graph_def(graph_def, device="tpu")
    with pytest.raises(GraphError, match="expected a tf GraphDef, got bytes"):
        mp_rewrite.rewrite_graph_def(graph_def.SerializeToString())


def test_duplicate_node_names():
    g = _graph(_node("a", "Placeholder", dtype=1), _node("a", "Placeholder", dtype=1))
    with pytest.raises(GraphError, match="two nodes are named 'a'"):
        mp_rewrite.rewrite_graph_def(g)


def test_all_errors_share_one_base_class():
    for cls in (GraphError, OptionError, mp_rewrite.ListError, mp_rewrite.StageError, mp_rewrite.ModelError):
        assert issubclass(cls, MpRewriteError)


def test_next_iteration_not_feeding_merge_is_a_stage_error():
    g = tf.Graph()
    with g.as_default():
        x = tf.constant(1.0, shape=[4, 4], name="x")
        m = tf.raw_ops.MatMul(a=x, b=x, name="m")
        nxt = tf.raw_ops.NextIteration(data=m, name="nxt")
        tf.raw_ops.Relu(features=nxt, name="r")
    with pytest.raises(mp_rewrite.StageError, match=r"stage 'match_recurrent_edges' failed on node 'nxt'"):
        mp_rewrite.rewrite_graph_def(g.as_graph_def(), device="cpu")
