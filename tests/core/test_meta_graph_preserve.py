"""A MetaGraphDef's collections: Grappler keeps every node a collection's node_list names (GrapplerItem keep_ops),
so TF's pass leaves it float32; our MetaGraphDef entry points (core.rewrite.rewrite_meta_graph_def, and the model
loader behind `inspect`/`explain`) do the same. Differential against TF's own pass given the same MetaGraphDef."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from mp_rewrite.core.meta_graph import nodes_to_preserve
from mp_rewrite.core.rewrite import rewrite_meta_graph_def
from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.testing.oracle import grappler_rewrite_meta_graph
from test_grappler_conformance import diff_graphs, fail_on

HALF, FLOAT = types_pb2.DT_HALF, types_pb2.DT_FLOAT


def _meta_graph(collection: str | None) -> meta_graph_pb2.MetaGraphDef:
    """x -> MatMul -> Relu 'kept' -> MatMul -> Relu -> Identity 'fetch', all on the CPU; 'fetch' is the train_op and
    'kept' (a clear op between two allow ops, so converted unless kept) is in `collection` when given."""
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:CPU:0"):
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.full((8, 8), 0.1, np.float32), name="w")
        kept = tf.raw_ops.Relu(features=tf.raw_ops.MatMul(a=x, b=w, name="allow1"), name="kept")
        out = tf.raw_ops.Relu(features=tf.raw_ops.MatMul(a=kept, b=w, name="allow2"), name="clr2")
        fetch = tf.raw_ops.Identity(input=out, name="fetch")
        graph.add_to_collection("train_op", fetch.op)
        if collection:
            graph.add_to_collection(collection, kept)  # a Tensor: the node_list holds "kept:0"
    return tf.compat.v1.train.export_meta_graph(graph_def=graph.as_graph_def(add_shapes=True), graph=graph)


def _dtype(graph_def, name):
    return next(n for n in graph_def.node if n.name == name).attr["T"].type


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_collection_node_stays_as_tensorflow_keeps_it(precision, tmp_path):
    meta = _meta_graph("my_kept_ops")
    assert "kept:0" in meta.collection_def["my_kept_ops"].node_list.value
    theirs = grappler_rewrite_meta_graph(meta, precision)
    assert _dtype(theirs, "kept") == FLOAT and _dtype(theirs, "allow1") != FLOAT  # TF keeps it, converts around it
    ours = rewrite_meta_graph_def(meta, precision, device="cpu")
    fail_on(diff_graphs(f"MetaGraphDef ({precision})", theirs, ours.graph_def))
    path = tmp_path / "model.meta"
    path.write_bytes(meta.SerializeToString())
    model = load_model(str(path))
    assert "collection 'my_kept_ops'" in model.preserve["kept"]
    inspected = rewrite_model(model, precision, device="cpu")
    fail_on(diff_graphs(f"loaded .meta ({precision})", theirs, inspected.graph_def))
    assert "my_kept_ops" in inspected.coloring[("kept", "T")].reason.detail


def test_without_the_collection_both_convert_the_node():
    """The control: the same graph without the collection has 'kept' converted by TF and by us."""
    meta = _meta_graph(None)
    theirs = grappler_rewrite_meta_graph(meta, "float16")
    ours = rewrite_meta_graph_def(meta, "float16", device="cpu")
    assert _dtype(theirs, "kept") == _dtype(ours.graph_def, "kept") == HALF
    fail_on(diff_graphs("MetaGraphDef without collection", theirs, ours.graph_def))


def test_emulated_meta_graph_keeps_collection_node_outside_the_round_trips():
    meta = _meta_graph("my_kept_ops")
    theirs = grappler_rewrite_meta_graph(meta, "float16", emulate_fp16=True)
    ours = rewrite_meta_graph_def(meta, "float16", device="cpu", emulate=True)
    assert ("kept", "T") not in ours.emulated and ("allow1", "T") in ours.emulated
    fail_on(diff_graphs("emulated MetaGraphDef", theirs, ours.graph_def))


def test_nodes_to_preserve_reads_what_grappler_reads():
    meta = _meta_graph("my_kept_ops")
    meta.saver_def.filename_tensor_name = "x:0"
    meta.saver_def.restore_op_name = "w"
    meta.collection_def["other"].node_list.value.append("no_such_node")
    why = nodes_to_preserve(meta)
    assert set(why) == {"fetch", "kept", "x", "w"}  # train_op, the collection, the placeholder and the saver
    assert "saver" in why["w"] and "collection 'train_op'" in why["fetch"]
