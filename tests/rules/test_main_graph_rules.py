"""The rules in a TF1 SavedModel's main graph (rules.main_graph, what the default in-place conversion runs there):
a TF1 Transformer block written with `tf.matmul(x, w) + b` on ref and resource variables gets its bias adds as
BiasAdds, its GELU and LayerNorm in the remapper's spellings and its residual adds inside the MatMul (TF1 BERT's
attention output on 2-D rows too), equal in float32, with every name the MetaGraph's other parts use kept
(signatures, variables, saver); a graph with TF1 control flow is left as it was, with the reason."""

from __future__ import annotations

import collections
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from rules_support import keep_the_cut
from mp_rewrite.analysis.execution import executed_nodes
from mp_rewrite.commands import cli
from mp_rewrite.rules.main_graph import canonicalize_main_graph

D, FF, T = 32, 64, 8


def _export(path, control_flow: bool = False) -> None:
    """Two layers (the first on ref variables, the second on resource ones), tagged serve and train."""
    rng = np.random.default_rng(0)

    def variable(name, shape, resource, scale=0.2, offset=0.0):
        value = (offset + rng.standard_normal(shape) * scale).astype("float32")
        return tf.compat.v1.get_variable(name, initializer=value, use_resource=resource)
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, T, D], name="x")
        h = x
        for i, resource in enumerate((False, True)):
            with tf.compat.v1.variable_scope(f"layer{i}"):
                rows = tf.reshape(h, [-1, D])
                inner = tf.nn.gelu(tf.matmul(rows, variable("w1", (D, FF), resource)) +
                                   variable("b1", (FF,), resource), approximate=False)
                out = tf.matmul(inner, variable("w2", (FF, D), resource)) + variable("b2", (D,), resource)
                out = tf.reshape(out, tf.shape(h)) + h
                mean, var = tf.nn.moments(out, axes=[-1], keepdims=True)
                h = (out - mean) * tf.math.rsqrt(var + 1e-6) * variable("gamma", (D,), resource, 0.1, 1.0) + \
                    variable("beta", (D,), resource, 0.1)
        with tf.compat.v1.variable_scope("attention_output"):  # TF1 BERT's: rows in, heads, rows out, + rows in
            rows = tf.reshape(h, [-1, D])
            heads = tf.transpose(tf.reshape(rows, [-1, T, 4, D // 4]), [0, 2, 1, 3])
            context = tf.reshape(tf.transpose(heads * 2.0, [0, 2, 1, 3]), [-1, D])  # a -1 of its own
            rows = tf.matmul(context, variable("w", (D, D), True)) + variable("b", (D,), True) + rows
            h = tf.reshape(rows, [-1, T, D])
        if control_flow:  # Switch/Merge, as TF1 wrote a cond (TF 2's graphs write a functional If)
            tf.compat.v1.disable_control_flow_v2()
            try:
                h = tf.cond(tf.reduce_sum(x) > 0, lambda: h * 2.0, lambda: h)
            finally:
                tf.compat.v1.enable_control_flow_v2()
        y = tf.identity(tf.reduce_mean(h, axis=1), name="y")
        signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
            builder.add_meta_graph(["train"], signature_def_map={"serving_default": signature})
            builder.save()


@pytest.fixture(scope="module")
def tf1_block(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf1") / "block"
    _export(path)
    return path


def _proto(path) -> saved_model_pb2.SavedModel:
    return saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())


def _session_outputs(path, x) -> np.ndarray:
    """What TF Serving does with a TF1 SavedModel: restore the serve MetaGraph and run the signature's tensors."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(path))
        signature = meta_graph.signature_def["serving_default"]
        return session.run(signature.outputs["y"].name, {signature.inputs["x"].name: x})


def test_a_tf1_block_fuses_in_its_main_graph_and_stays_equal(tf1_block, tmp_path):
    source = _proto(tf1_block)
    snapshot = source.SerializeToString(deterministic=True)
    written = saved_model_pb2.SavedModel()
    written.CopyFrom(source)
    for index, meta_graph in enumerate(source.meta_graphs):
        new, records = canonicalize_main_graph(meta_graph)
        applied = collections.Counter(r.rule for r in records if r.applied)
        assert applied["bias_add"] == 5 and applied["gelu"] == 2 and applied["layer_norm"] == 2, applied
        # two Dense on 3-D inputs, and the attention output's rows: each proven the residual's rows
        assert applied["residual_rows"] == 3 and not [r for r in records if not r.applied], records
        assert new.signature_def == meta_graph.signature_def and new.saver_def == meta_graph.saver_def
        written.meta_graphs[index].CopyFrom(new)
    assert source.SerializeToString(deterministic=True) == snapshot  # the input is never modified
    copy = tmp_path / "canonical"
    shutil.copytree(tf1_block, copy)
    (copy / "saved_model.pb").write_bytes(written.SerializeToString())

    x = np.random.default_rng(1).standard_normal((3, T, D)).astype("float32")
    before, after = _session_outputs(tf1_block, x), _session_outputs(copy, x)
    assert np.abs(before).max() > 0.1
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5 * np.abs(before).max())

    signature = tf.saved_model.load(str(copy), tags=["serve"]).signatures["serving_default"]
    kernels = collections.Counter((n.op, tuple(s.decode() for s in n.attr["fused_ops"].list.s))
                                  for n in executed_nodes(signature, x=tf.constant(x)))
    fused = collections.Counter({ops: n for (op, ops), n in kernels.items() if "FusedMatMul" in op})
    assert fused[("BiasAdd", "GeluExact")] == 2 and fused[("BiasAdd", "Add")] == 3, kernels
    assert kernels[("_MklLayerNorm", ())] == 2, kernels


def test_tf1_control_flow_is_left_as_it_was_with_the_reason(tmp_path):
    _export(tmp_path / "cond", control_flow=True)
    meta_graph = _proto(tmp_path / "cond").meta_graphs[0]
    new, records = canonicalize_main_graph(meta_graph)
    assert new is meta_graph
    assert [r.applied for r in records] == [False] and "TF1 control flow (Merge, Switch)" in records[0].reason


def test_the_default_conversion_prints_them_and_every_metagraph_loads(tf1_block, tmp_path, capsys, monkeypatch):
    keep_the_cut(monkeypatch)
    out = tmp_path / "out"
    assert cli.main(["convert", str(tf1_block), str(out), "--precision", "bfloat16", "--assign", "cost"]) == 0
    printed = capsys.readouterr().out
    assert "fusions enabled for TensorFlow's remapper: " in printed and "MatMul + BiasAdd + Add" in printed
    x = np.random.default_rng(1).standard_normal((2, T, D)).astype("float32")
    assert np.abs(_session_outputs(out, x) - _session_outputs(tf1_block, x)).max() < 0.1  # bfloat16 now
    for tags in (["serve"], ["train"]):
        tf.saved_model.load(str(out), tags=tags)
    assert (out / "variables" / "variables.index").read_bytes() == \
        (tf1_block / "variables" / "variables.index").read_bytes()


def test_a_bias_weight_of_another_shape_is_declined_with_the_reason():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, D], name="x")
        w = tf.compat.v1.get_variable("w", initializer=np.ones((D, FF), "float32"))
        b = tf.compat.v1.get_variable("b", initializer=np.ones((1, FF), "float32"))  # broadcasts like a bias
        tf.identity(tf.matmul(x, w) + b, name="y")
        meta_graph = tf.compat.v1.train.export_meta_graph()
    meta_graph.signature_def["serving_default"].outputs["y"].name = "y:0"
    _, records = canonicalize_main_graph(meta_graph)
    (record,) = [r for r in records if r.rule == "bias_add"]
    assert not record.applied and f"of shape (1, {FF}) is not one value per channel of {FF}" in record.reason


def test_the_cli_says_once_why_a_tf1_cond_graph_keeps_its_ops(tmp_path, capsys, monkeypatch):
    keep_the_cut(monkeypatch)
    _export(tmp_path / "cond", control_flow=True)
    assert cli.main(["convert", str(tmp_path / "cond"), str(tmp_path / "out"), "--precision", "bfloat16",
                     "--assign", "cost", "--tag-set", "serve"]) == 0
    printed = capsys.readouterr().out
    assert "fusions enabled for TensorFlow's remapper: none; 1 declined (1x the main graph has TF1 control flow" \
        in " ".join(printed.split()), printed
