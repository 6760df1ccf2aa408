"""Inspection reports on real Keras graphs: FLOP estimates, text and JSON counts against the RewriteResult, the SVG,
the TensorBoard log, dumps, and the CLI's error paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import mp_rewrite.testing.examples as ex
from mp_rewrite import rewrite_graph_def
from mp_rewrite.analysis import flops
from mp_rewrite.commands.cli import main as cli_main
from mp_rewrite.report.dump import ENV_VAR, dump_rewrite
from mp_rewrite.errors import OptionError
from mp_rewrite.report import dot, json_report, tensorboard, text
from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.report.palette import FILL

SVG = "{http://www.w3.org/2000/svg}"


def _rewrite(name):
    graph = ex.EXAMPLES[name]()
    return graph, rewrite_graph_def(graph.graph_def, fetches=graph.fetches)


@pytest.fixture(scope="module")
def cnn_train():
    return _rewrite("cnn_bn/train")


@pytest.fixture(scope="module")
def transformer_train():
    return _rewrite("transformer/train")


@pytest.fixture(scope="module")
def cnn_saved_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sm") / "cnn")
    ex.cnn_bn().export(path, verbose=False)
    return path


def _traced_train_step(model, batch=2):
    """A training step traced with shapes recorded (as_graph_def(add_shapes=True))."""
    import keras
    opt = keras.optimizers.SGD()
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    specs = [tf.TensorSpec([batch, *model.inputs[0].shape[1:]], tf.float32), tf.TensorSpec([batch], tf.int32)]

    def step(x, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(x, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss
    cf = tf.function(step).get_concrete_function(*specs)
    return cf.graph.as_graph_def(add_shapes=True), [t.op.name for t in cf.outputs]


# --------------------------------------------------------------------------------------------- FLOPs


def test_flops_of_cnn_inference_from_shapes():
    graph, result = _rewrite("cnn_bn/inference")
    per_node = flops.result_flops(result)[""]
    # 2 * output elements * kernel volume * input channels: [2,16,16,8] x 3*3*3, [2,8,8,16] x 3*3*8; 2*2*10*256.
    assert sorted(per_node.values()) == [10240, 221184, 294912]
    share = flops.low_precision_flop_share(result)
    assert (share.low, share.total, share.unknown, share.nodes) == (526336, 526336, 0, 3)


def test_backprop_flops_equal_forward_with_recorded_shapes():
    graph_def, fetches = _traced_train_step(ex.cnn_bn())
    result = rewrite_graph_def(graph_def, fetches=fetches)
    per_node = flops.result_flops(result)[""]
    assert None not in per_node.values() and len(per_node) == 9
    forward = {n: v for n, v in per_node.items() if n.endswith("/convolution")}
    for name, value in forward.items():
        assert per_node[f"gradient_tape/{name}/Conv2DBackpropInput"] == value
        assert per_node[f"gradient_tape/{name}/Conv2DBackpropFilter"] == value


def test_function_bodies_get_shapes_from_their_callers():
    graph, result = _rewrite("lstm_functional/inference")
    body = next(name for name in result.functions if "body" in name)
    # x [2,8] @ W [8,64] and h [2,16] @ U [16,64] inside the While body.
    assert sorted(v for v in flops.result_flops(result)[body].values()) == [2048, 4096]


def test_saved_model_variables_shape_the_function_bodies(cnn_saved_model):
    result = rewrite_model(load_model(cnn_saved_model))
    share = flops.low_precision_flop_share(result)
    # The batch dimension is unknown: counted per example, half of the batch-2 inference graph's 526336.
    assert (share.total, share.unknown, share.nodes) == (263168, 0, 3)


def test_saved_model_picture_and_explain_go_to_the_model_function(cnn_saved_model, capsys):
    result = rewrite_model(load_model(cnn_saved_model))
    drawn = dot.picture(result).source
    assert "___call___" in drawn and "signature_wrapper" not in drawn
    assert cli_main(["explain", cnn_saved_model, "cnn_bn_1/conv2d_1/convolution"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"in function {drawn}:\ncnn_bn_1/conv2d_1/convolution: float16 — allow list")


def test_arg_output_shapes_attr_shapes_a_bare_body():
    body = graph_pb2.GraphDef()
    arg = body.node.add(name="x", op="_Arg")
    arg.attr["T"].type = tf.float32.as_datatype_enum
    arg.attr["index"].i = 0
    arg.attr["_output_shapes"].list.shape.add().CopyFrom(tf.TensorShape([4, 8]).as_proto())
    const = tf.constant(0.5, shape=[8, 3]).numpy()
    w = body.node.add(name="w", op="Const")
    w.attr["dtype"].type = tf.float32.as_datatype_enum
    w.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(const))
    mm = body.node.add(name="mm", op="MatMul", input=["x", "w"])
    mm.attr["T"].type = tf.float32.as_datatype_enum
    shapes = flops.node_shapes(body)
    assert shapes["mm"] == [(4, 3)]
    assert flops.flops_by_node(body, shapes) == {"mm": 2 * 4 * 3 * 8}
    assert flops.node_shapes(body, arg_shapes={"x": (6, 8)})["mm"] == [(6, 3)]


def test_einsum_batch_matmul_depthwise_and_conv3d():
    g = tf.Graph()
    with g.as_default():
        a, b = tf.zeros([2, 3, 4]), tf.zeros([2, 4, 5])
        tf.raw_ops.Einsum(inputs=[a, b], equation="bij,bjk->bik", name="einsum")
        tf.raw_ops.BatchMatMulV2(x=a, y=b, name="bmm")
        tf.raw_ops.DepthwiseConv2dNative(input=tf.zeros([1, 8, 8, 3]), filter=tf.zeros([3, 3, 3, 2]),
                                         strides=[1, 1, 1, 1], padding="SAME", name="depthwise")
        tf.raw_ops.Conv3D(input=tf.zeros([1, 4, 4, 4, 2]), filter=tf.zeros([3, 3, 3, 2, 5]),
                          strides=[1, 1, 1, 1, 1], padding="SAME", name="conv3d")
    graph_def = g.as_graph_def()
    got = flops.flops_by_node(graph_def, flops.node_shapes(graph_def))
    assert got == {"einsum": 2 * 2 * 3 * 5 * 4, "bmm": 2 * 2 * 3 * 5 * 4,
                   "depthwise": 2 * (8 * 8 * 6) * 9, "conv3d": 2 * (4 * 4 * 4 * 5) * 27 * 2}


def test_flop_estimates_leave_the_result_untouched(cnn_train):
    _, result = cnn_train
    before = result.graph_def.SerializeToString()
    flops.result_flops(result)
    assert result.graph_def.SerializeToString() == before


# --------------------------------------------------------------------------------------------- text and JSON


@pytest.mark.parametrize("fixture", ["cnn_train", "transformer_train"])
def test_json_matches_the_rewrite(fixture, request):
    _, result = request.getfixturevalue(fixture)
    report = json.loads(json_report.to_json(result))
    assert report["schema_version"] == 1 and report["precision"] == "float16"
    (main,) = report["graphs"]
    assert [n["name"] for n in main["nodes"]] == [n.name for n in result.graph_def.node]
    for node in main["nodes"]:
        decisions = result.coloring.for_node(node["name"])
        assert [(a["attr"], a["color"], a["dtype_after"], a["reason"]["rule"]) for a in node["attrs"]] == \
            [(d.attr, d.color, d.dtype_after, d.reason.rule) for d in decisions]
    summary = report["summary"]
    assert summary["attrs_converted"] == len(result.retyped)
    assert summary["casts"] == len(result.casts) == len(main["casts"])
    assert summary["casts_to_low"] == sum(c.to_low for c in result.casts)
    assert summary["nodes_by_class"]["allow"] == len({n for n, _ in result.retyped} |
                                                      {d.node for d in result.coloring.values() if d.color == "allow"})
    assert summary["nodes_by_class"]["cast"] == len(result.casts)
    assert main["grappler_line"] == result.grappler_line() == summary["grappler_line"]


@pytest.mark.parametrize("fixture", ["cnn_train", "transformer_train"])
def test_text_counts_match_the_json(fixture, request):
    _, result = request.getfixturevalue(fixture)
    report = json_report.to_dict(result)
    out = text.to_text(result)
    assert result.grappler_line() in out
    assert f"casts inserted: {len(result.casts)} " in out
    assert f"float32 type attributes converted: {len(result.retyped)} of " in out
    table = out.split("nodes per color:")[1].split("\n\n")[0].splitlines()[2:]
    assert {line.split()[0]: int(line.split()[1]) for line in table} == report["summary"]["nodes_by_class"]


def test_text_names_the_reasons_that_kept_compute_in_float32(cnn_train):
    graph, _ = cnn_train
    result = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, keep_fp32=["cnn_bn_1/dense_1/MatMul"])
    out = text.to_text(result)
    section = out.split("why compute-heavy ops stayed float32")[1]
    assert "kept float32 by the user (keep_fp32)" in section and "cnn_bn_1/dense_1/MatMul" in section


def test_unknown_function_is_an_option_error(cnn_train):
    with pytest.raises(OptionError, match="no rewritten function named 'nope'"):
        text.to_text(cnn_train[1], function="nope")


# --------------------------------------------------------------------------------------------- pictures


def _svg_nodes(svg: str) -> dict:
    """title -> fill of every graph node of an SVG (legend entries left out)."""
    root = ET.fromstring(svg)
    found = {}
    for g in root.iter(f"{SVG}g"):
        classes = g.get("class", "").split()
        if "node" not in classes or "mp-legend" in classes:
            continue
        title = g.find(f"{SVG}title").text
        shape = next(e for e in g.iter() if e.tag in (f"{SVG}path", f"{SVG}polygon", f"{SVG}ellipse"))
        found[title] = shape.get("fill")
    return found


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed "
                               "(apt-get install graphviz)")
# The pure-Python layout runs everywhere (no skip); Graphviz's only where it is installed.
ENGINES = [pytest.param("python", id="python"), pytest.param("graphviz", id="graphviz", marks=needs_dot)]


@pytest.mark.parametrize("engine", ENGINES)
def test_svg_has_every_node_with_its_fill(cnn_train, engine):
    _, result = cnn_train
    svg = dot.to_svg(result, collapse_scopes=False, engine=engine)
    nodes = _svg_nodes(svg)
    classes = {n["name"]: n["class"] for n in json_report.to_dict(result, with_flops=False)["graphs"][0]["nodes"]}
    assert set(nodes) == {n.name for n in result.graph_def.node} == set(classes)
    assert all(nodes[name] == FILL[cls] for name, cls in classes.items())
    assert {c.name for c in result.casts} <= {n for n, fill in nodes.items() if fill == FILL["cast"]}


@pytest.mark.parametrize("engine", ENGINES)
def test_svg_around_a_node_and_collapsed_scopes(transformer_train, engine):
    _, result = transformer_train
    center = "transformer_encoder_1/multi_head_attention_1/Softmax"
    near = _svg_nodes(dot.to_svg(result, around=center, depth=1, collapse_scopes=False, engine=engine))
    assert center in near and 2 <= len(near) < 10
    collapsed = dot.to_svg(result, collapse_scopes=True, max_nodes=40, engine=engine)
    boxes = _svg_nodes(collapsed)
    assert 1 < len(boxes) <= 40 + 1 and any(name.endswith("/") for name in boxes)


def test_dot_around_an_unknown_node_is_an_option_error(cnn_train):
    with pytest.raises(OptionError, match="--around: no node named 'nope'"):
        dot.to_dot(cnn_train[1], around="nope")


# --------------------------------------------------------------------------------------------- TensorBoard, dumps


def _graph_events(logdir: str) -> list:
    """GraphDefs of the graph events in a log directory, read with TensorBoard's reader if it is installed."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        graphs = []
        for name in os.listdir(logdir):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
                if event.HasField("graph_def"):
                    graphs.append(graph_pb2.GraphDef.FromString(event.graph_def))
        return graphs
    acc = EventAccumulator(logdir)
    acc.Reload()
    return [acc.Graph()]


def test_tensorboard_log_records_the_decisions(cnn_train, tmp_path):
    _, result = cnn_train
    tensorboard.write_tensorboard(result, str(tmp_path))
    (graph,) = _graph_events(str(tmp_path))
    colors = {n.name: n.attr["_mp_color"].s.decode() for n in graph.node}
    expected = {n["name"]: n["class"] for n in json_report.to_dict(result, with_flops=False)["graphs"][0]["nodes"]}
    assert colors == expected
    reasons = {n.name: n.attr["_mp_reason"].s.decode() for n in graph.node}
    assert reasons["cnn_bn_1/conv2d_1/convolution"] == "allow list"


def test_dump_is_off_without_a_directory(cnn_train, monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    graph, result = cnn_train
    assert dump_rewrite(result, graph.graph_def, "step") is None
    assert os.listdir(tmp_path) == []


def test_dump_writes_graphs_and_decisions(cnn_train, monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "dumps"))
    graph, result = cnn_train
    before, after, decisions = dump_rewrite(result, graph.graph_def, "train step/1")
    assert graph_pb2.GraphDef.FromString(open(before, "rb").read()) == graph.graph_def
    assert graph_pb2.GraphDef.FromString(open(after, "rb").read()) == result.graph_def
    report = json.load(open(decisions))
    assert report["schema_version"] == 1 and report["summary"]["casts"] == len(result.casts)
    assert "train_step_1" in os.path.basename(before)


def test_every_rewrite_is_dumped_when_the_env_var_is_set(monkeypatch, tmp_path):
    """rewrite_graph_def dumps the main graph and each function body (the training hook goes the same way)."""
    import mp_rewrite
    from mp_rewrite.testing.examples import EXAMPLES
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    example = EXAMPLES["lstm_functional/inference"]()
    result = mp_rewrite.rewrite_graph_def(example.graph_def, "bfloat16", example.fetches, device="cpu")
    names = os.listdir(tmp_path)
    assert len(names) == 3 * (1 + len(result.functions))
    assert any(next(iter(result.functions)).replace("/", "_") in n for n in names)


# --------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def cnn_pb(cnn_train, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "cnn_train.pb"
    path.write_bytes(cnn_train[0].graph_def.SerializeToString())
    return str(path)


def test_graph_def_text_and_meta_graph_files_load_alike(cnn_train, tmp_path):
    from google.protobuf import text_format
    from tensorflow.core.protobuf import meta_graph_pb2
    graph, _ = cnn_train
    (tmp_path / "g.pbtxt").write_text(text_format.MessageToString(graph.graph_def))
    meta = meta_graph_pb2.MetaGraphDef(graph_def=graph.graph_def)
    meta.signature_def["serving_default"].outputs["loss"].name = "Identity:0"
    (tmp_path / "m.meta").write_bytes(meta.SerializeToString())
    text_model, meta_model = load_model(str(tmp_path / "g.pbtxt")), load_model(str(tmp_path / "m.meta"))
    assert text_model.kind == "graph_def" and text_model.graph_def == graph.graph_def and text_model.fetches == []
    assert meta_model.kind == "meta_graph" and meta_model.graph_def == graph.graph_def
    assert meta_model.fetches == ["Identity:0"]


def _cli_error(argv, capsys) -> str:
    code = cli_main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("mp-rewrite: error: ")
    return err


def test_cli_unknown_function_and_node(cnn_pb, capsys):
    assert "no rewritten function named 'f'" in _cli_error(["inspect", cnn_pb, "--function", "f"], capsys)
    err = _cli_error(["explain", cnn_pb, "dense_1/MatMull"], capsys)
    assert "closest: cnn_bn_1/dense_1/MatMul" in err


def test_cli_unwritable_output(cnn_pb, capsys, tmp_path):
    target = str(tmp_path / "no" / "such" / "dir" / "report.json")
    assert f"cannot write '{target}'" in _cli_error(["inspect", cnn_pb, "--format", "json", "-o", target], capsys)


def test_cli_writes_json_and_tensorboard(cnn_pb, cnn_train, tmp_path, capsys):
    assert cli_main(["inspect", cnn_pb, "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    assert json.load(open(tmp_path / "r.json"))["schema_version"] == 1
    assert cli_main(["inspect", cnn_pb, "--format", "tensorboard", "-o", str(tmp_path / "tb")]) == 0
    assert len(_graph_events(str(tmp_path / "tb"))) == 1


def test_cli_subprocess_not_a_model(tmp_path):
    junk = tmp_path / "junk.pb"
    junk.write_text("not a graph")
    run = [sys.executable, "-m", "mp_rewrite"]
    bad = subprocess.run(run + ["inspect", str(junk)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [f"mp-rewrite: error: '{junk}' is not a model: expected a SavedModel "
                                               "directory, a GraphDef (.pb binary or .pbtxt text) or a MetaGraphDef"]


def test_cli_text_report(cnn_pb, cnn_train, capsys):
    assert cli_main(["inspect", cnn_pb]) == 0
    out = capsys.readouterr().out
    assert "nodes per color" in out and "Converted " in out
