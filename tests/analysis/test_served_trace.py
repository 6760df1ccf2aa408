"""Node times as TF2 serves a model (analysis.served_trace, graph_runs.SignatureRunner): one call traced by TF's
profiler gives each kernel's time under the name a TF1 session would give its node, the signature's call node
found in the main graph (analysis.call_names); the kernels are those TF2 runs, fused as TF2 fuses them; a TF1
export, whose signatures TF2 prunes from the main graph, is left to a session."""

from __future__ import annotations

import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.analysis.call_names import call_nodes, executed_names, inlined_prefixes  # noqa: E402
from mp_rewrite.analysis.execution import executed_nodes, ran_nodes  # noqa: E402
from mp_rewrite.analysis.run_times import counted_once  # noqa: E402
from mp_rewrite.analysis.served_trace import SignatureRunner, traced_call  # noqa: E402
from mp_rewrite.model.files import read_saved_model  # noqa: E402


def test_a_traced_call_names_each_kernel_and_times_it():
    w = tf.constant(np.random.default_rng(0).random((512, 512), np.float32))

    @tf.function
    def f(x):
        return tf.nn.relu(tf.matmul(tf.matmul(x, w, name="first"), w, name="second"), name="out")

    x = tf.constant(np.ones((256, 512), np.float32))
    f(x)
    begin = time.perf_counter()
    stats, ms = traced_call(lambda: f(x), "call/")
    assert 0 < ms <= (time.perf_counter() - begin) * 1e3  # the call alone, not the profiler's start and export
    nodes = {s.node_name: s for device in stats.dev_stats for s in device.node_stats}
    assert all(name.startswith("call/") for name in nodes)
    assert "call/first" in nodes and "call/second" in nodes, sorted(nodes)
    assert "MatMul" in nodes["call/first"].timeline_label
    assert nodes["call/first"].op_end_rel_nanos > 0 and nodes["call/first"].all_start_nanos > 0
    assert nodes["call/second"].all_start_nanos >= nodes["call/first"].all_start_nanos  # it reads the first's output
    assert 0 < counted_once(stats)["call/first"] < ms


def _signature(path):
    meta = read_saved_model(path).meta_graphs[0]
    signature = meta.signature_def["serving_default"]
    return meta, {"serving_default": {arg: info.name for arg, info in signature.inputs.items()}}


def test_the_nodes_that_ran_leave_out_the_side_of_a_switch_not_taken():
    """A routed model (a split's batch 1, a batch dispatch) holds both sides in the graphs TF runs; only one runs.
    The benchmark's Cast and kernel counts read the nodes that ran (it counted both sides until 2026-12-03)."""
    w = tf.Variable(np.random.default_rng(0).random((64, 64), np.float32))

    def routed():  # a fresh function: TF records its graphs at its first call only
        return tf.function(lambda x: tf.cond(
            tf.shape(x)[0] > 1, lambda: tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16)),
                                                tf.float32),
            lambda: tf.matmul(x, w)), input_signature=[tf.TensorSpec([None, 64], tf.float32)])

    for batch, casts in ((1, 0), (4, 3)):
        x = tf.constant(np.ones((batch, 64), np.float32))
        assert sum(n.op == "Cast" for n in executed_nodes(routed(), x)) == 3  # both sides are in the graphs
        ran = ran_nodes(routed(), x)
        assert sum(n.op == "Cast" for n in ran) == casts
        assert sum("MatMul" in n.op for n in ran) == 1


def test_a_tf2_exports_signature_runs_under_the_names_a_session_gives_its_nodes(small_cnn):
    meta, called = _signature(small_cnn)
    calls = call_nodes(meta, called)
    assert list(calls) == ["serving_default"] and calls["serving_default"].endswith("/")
    names = executed_names(meta.graph_def, inlined_prefixes(meta.graph_def))
    feeds = {name: np.random.default_rng(0).random((2, 16, 16, 3), np.float32)
             for name in called["serving_default"].values()}
    runner = SignatureRunner(str(small_cnn), ["serve"], called, feeds, calls)
    try:
        runner.run()
        metadata = tf.compat.v1.RunMetadata()
        runner.run(metadata)
        timed = counted_once(metadata.step_stats)
        known = {name: ms for name, ms in timed.items() if name in names}
        ops = {names[name][2] for name in known}
        # The convolutions' kernels carry their fused ops' names (the BiasAdd or Relu they end in), under the
        # body's own nodes; nearly all the call's time lands on nodes of the graph.
        assert known and sum(known.values()) >= 0.8 * sum(timed.values()), sorted(set(timed) - set(names))
        assert ops & {"Relu", "BiasAdd", "Conv2D", "AddV2"}, ops
        kernels = runner.kernels()
        assert any("Conv2D" in label for name, label in kernels.items() if name in names), kernels
    finally:
        runner.close()


def test_a_tf1_export_is_not_served_under_session_names(tmp_path):
    path = tmp_path / "tf1"
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.nn.relu(tf.matmul(x, tf.ones([4, 4])), name="y")
        with tf.compat.v1.Session() as session:
            builder = tf.compat.v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(
                session, ["serve"],
                signature_def_map={"serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x},
                                                                                                      {"y": y})})
            builder.save()
    meta, called = _signature(path)
    assert call_nodes(meta, called) == {}
