"""A conversion never performs the model's effects (issue 41): what it runs to measure and check a model whose
serving signature writes a file, saves a checkpoint and writes a summary -- every mode of convert, verify, inspect's
measured costs, --tune -- leaves the file system and the source byte for byte as they were, names the effects, and
the written model still performs them when called."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2  # noqa: E402
from tensorflow.python.framework import op_def_registry  # noqa: E402

from mp_rewrite.commands import cli  # noqa: E402
from mp_rewrite.core.effects import effect_line, effect_table, find_effects, graph_effects  # noqa: E402
from mp_rewrite.core.stand_ins import (STOOD_IN, graph_without_effects, meta_graph_without_effects,  # noqa: E402
                                       saved_model_without_effects)
from mp_rewrite.model.files import read_saved_model  # noqa: E402

LINE = ("serving_default writes files (WriteFile), saves checkpoints (SaveV2), writes summaries (FlushSummaryWriter, "
        "WriteSummary); loading the model writes summaries (CreateSummaryFileWriter)")
WRITTEN = {"written.txt", "ckpt.index", "logs"}  # what one call of the model leaves in its side directory


class Effectful(tf.Module):
    """A Dense layer whose serving signature also writes a file, saves a checkpoint and writes a summary."""

    def __init__(self, side: Path):
        self.side = str(side)
        self.w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[1, 2]) * 0.1)
        self.writer = tf.summary.create_file_writer(str(side / "logs"), experimental_trackable=True)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        tf.io.write_file(self.side + "/written.txt", tf.strings.as_string(tf.reduce_sum(x)))
        # A checkpoint of the input (one of the variables is Saver's: freezing folds variables away).
        saved = tf.raw_ops.SaveV2(prefix=self.side + "/ckpt", tensor_names=["x"], shape_and_slices=[""], tensors=[x])
        with self.writer.as_default():
            tf.summary.write("total", tf.reduce_sum(x), step=1)
        self.writer.flush()
        with tf.control_dependencies([saved]):  # a SaveV2 nothing waits for is pruned from the function
            return {"y": tf.nn.relu(tf.matmul(x, self.w))}


class Saver(tf.Module):
    """A signature that saves its variables in a checkpoint, as tf.train.Checkpoint.write does."""

    def __init__(self, side: Path):
        self.side = str(side)
        self.w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[1, 2]) * 0.1)
        self.checkpoint = tf.train.Checkpoint(w=self.w)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        self.checkpoint.write(self.side + "/ckpt")
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}


class Writer(tf.Module):
    """A signature that writes a file and a checkpoint of its input, and captures no resource but its weight."""

    def __init__(self, side: Path):
        self.side = str(side)
        self.w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[5, 6]) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        tf.io.write_file(self.side + "/written.txt", tf.strings.as_string(tf.reduce_sum(x)))
        saved = tf.raw_ops.SaveV2(prefix=self.side + "/ckpt", tensor_names=["x"], shape_and_slices=[""], tensors=[x])
        with tf.control_dependencies([saved]):
            return {"y": tf.nn.relu(tf.matmul(x, self.w))}


class Plain(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[3, 4]) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(the SavedModel, its side directory), the side directory emptied of what building the model wrote."""
    root = tmp_path_factory.mktemp("effects")
    side, path = root / "side", root / "model"
    side.mkdir()
    module = Effectful(side)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    del module
    _empty(side)
    return path, side


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache of measured costs of this test's own, so that every measurement runs the model."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir():
            _empty(entry)
            entry.rmdir()
        else:
            entry.unlink()


def _tree(*paths) -> dict:
    """Every file and directory under `paths`: relative name -> sha256 of its bytes ("dir" for a directory)."""
    return {f"{p.name}/{f.relative_to(p)}": "dir" if f.is_dir() else hashlib.sha256(f.read_bytes()).hexdigest()
            for p in paths for f in sorted(p.rglob("*"))}


def _untouched(model, argv, capsys) -> str:
    """Run `mp-rewrite ARGV`; assert it exits 0 and leaves the source and the side directory as they were; return
    what it printed."""
    before = _tree(*model)
    assert cli.main(argv) == 0, capsys.readouterr()
    assert _tree(*model) == before
    out = capsys.readouterr()
    return out.out + out.err


def _performs_effects(output: Path, side: Path) -> None:
    """The written model, loaded and called as a user does, performs every effect of the source."""
    _empty(side)
    try:
        loaded = tf.saved_model.load(str(output))
        assert float(loaded.signatures["serving_default"](x=tf.ones([2, 64]))["y"].numpy().sum()) > 0
        assert WRITTEN <= {p.name for p in side.iterdir()}
        assert (side / "written.txt").read_text() == "128.000000"
        assert list((side / "logs").iterdir())  # the summary's events file
    finally:
        _empty(side)


# --------------------------------------------------------------------------------------------- the table


def test_every_op_of_the_table_is_registered_and_stateful():
    ops = [op for kind in effect_table().kinds for op in kind.ops]
    assert len(ops) == len(set(ops)) and "WriteFile" in ops and "SaveV2" in ops
    for op in ops:
        op_def = op_def_registry.get(op)
        assert op_def is not None and op_def.is_stateful, op


def test_the_effects_are_found_in_the_signature_and_in_loading(model):
    meta_graph = read_saved_model(model[0]).meta_graphs[0]
    given = meta_graph.SerializeToString()
    effects = find_effects(meta_graph)
    assert meta_graph.SerializeToString() == given  # only read
    assert effect_line(effects) == LINE
    # The saver's own SaveV2 and MergeV2Checkpoints (the __traced_save function) are not counted.
    assert not any("traced_save" in effect.function for effect in effects)
    copy, stand_ins = meta_graph_without_effects(meta_graph)
    assert stand_ins.stands and find_effects(copy) == ()
    assert sum(STOOD_IN in node.attr for f in copy.graph_def.library.function for node in f.node_def) == \
        len(effects)


def test_a_print_to_stderr_is_not_an_effect_but_one_to_a_file_is():
    def kind(stream: str):
        node = node_def_pb2.NodeDef(name="p", op="PrintV2")
        node.attr["output_stream"].s = stream.encode()
        return effect_table().kind_of(node)
    assert kind("file:///tmp/log.txt").says == "prints to a file"
    assert kind("stderr") is None and kind("log(info)") is None
    assert effect_table().kind_of(node_def_pb2.NodeDef(name="r", op="ReadVariableOp")) is None


def _graph(*nodes) -> graph_pb2.GraphDef:
    """A GraphDef of (name, op, inputs, {attr: AttrValue}) tuples."""
    graph_def = graph_pb2.GraphDef()
    for name, op, inputs, attrs in nodes:
        node = graph_def.node.add(name=name, op=op, input=inputs)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
    return graph_def


def test_stand_ins_keep_names_control_edges_and_pass_through_what_they_passed_through():
    float32 = attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT)
    graph_def = _graph(("x", "Placeholder", [], {"dtype": float32}),
                       ("name", "Placeholder", [], {"dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_STRING)}),
                       ("write", "WriteFile", ["name", "name", "^x"], {}),
                       ("debug", "DebugIdentityV2", ["x"], {"T": float32}),
                       ("y", "Identity", ["debug", "^write"], {"T": float32}))
    effects = graph_effects(graph_def, ["y"], "f")
    assert [(e.node, e.op) for e in effects] == [("debug", "DebugIdentityV2"), ("write", "WriteFile")]
    copy, stand_ins = graph_without_effects(graph_def, effects, ["y:0"])
    assert stand_ins.stands and graph_def.node[2].op == "WriteFile"  # the given graph is never modified
    nodes = {node.name: node for node in copy.node}
    assert (nodes["write"].op, list(nodes["write"].input)) == ("Timestamp", ["^x"])
    assert (nodes["debug"].op, list(nodes["debug"].input), nodes["debug"].attr["T"]) == ("Identity", ["x"], float32)
    assert graph_effects(copy, ["y"], "f") == ()
    tf.graph_util.import_graph_def(copy, name="")  # TensorFlow takes it as it is


def test_an_effect_whose_output_is_read_cannot_be_stood_in_for():
    graph_def = _graph(("d", "Placeholder", [], {"dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_VARIANT)}),
                       ("path", "Placeholder", [], {"dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_STRING)}),
                       ("save", "SaveDatasetV2", ["d", "path"], {}),
                       ("y", "Identity", ["save"], {}))
    stand_ins = graph_without_effects(graph_def, graph_effects(graph_def, ["y"], "f"), ["y:0"])[1]
    assert not stand_ins.stands and stand_ins.blocked == ("SaveDatasetV2 'save' (its output is read)",)


def test_a_tf1_main_op_that_writes_is_not_run_where_the_model_is_loaded_to_be_run(tmp_path):
    from mp_rewrite.model.runtime import load_saved_model
    marker = tmp_path / "loaded.txt"
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.identity(x * 2.0, name="y")
        builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "tf1"))
        signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
        builder.add_meta_graph_and_variables(session, ["serve"], {"serving_default": signature},
                                             main_op=tf.io.write_file(str(marker), "loaded"))
        builder.save()
    meta_graph = read_saved_model(tmp_path / "tf1").meta_graphs[0]
    given = meta_graph.SerializeToString()
    assert effect_line(find_effects(meta_graph)) == "loading the model writes files (WriteFile)"
    assert meta_graph.SerializeToString() == given  # only read: no collection added
    loaded = load_saved_model(tmp_path / "tf1", tags=["serve"])
    assert float(loaded.signatures["serving_default"](x=tf.ones([1, 4]))["y"].numpy().sum()) == 8.0
    assert not marker.exists()
    tf.saved_model.load(str(tmp_path / "tf1"), tags=["serve"])  # as it is: the main op writes
    assert marker.read_text() == "loaded"


# --------------------------------------------------------------------------------------------- every mode


# The CLI's default on a CPU measures costs (--assign cost; tests/conftest.py makes the lists every test's default).
@pytest.mark.parametrize("mode", [["--assign", "cost"], ["--freeze", "--assign", "cost"], ["--assign", "lists"]],
                         ids=["in-place", "freeze", "lists"])
def test_convert_leaves_the_world_as_it_was_and_the_written_model_keeps_the_effects(model, tmp_path, capsys, mode):
    output = tmp_path / "out"
    said = _untouched(model, ["convert", str(model[0]), str(output), "--precision", "bfloat16", *mode], capsys)
    assert f"{LINE}: not run during conversion" in said.replace("\n", " ")
    assert "the written copy ran 1 signature" in said  # the run check ran, on a copy
    if "--freeze" in mode:  # the frozen graph reads the summary writer (a captured resource): priced from the table
        assert "not measured in the graph: it reads tables or kept variables" in said
    elif "cost" in mode:  # the costs were measured, on a copy
        assert "measured on a copy in which the ops with effects do nothing" in said
    if "--freeze" not in mode:  # in place: every op with an effect written exactly as the source holds it
        assert _effect_nodes(output) == _effect_nodes(model[0])
    _performs_effects(output, model[1])


def _effect_nodes(path) -> dict:
    """{(function, node): serialized NodeDef} of the effects of the SavedModel at `path`."""
    meta_graph = read_saved_model(path).meta_graphs[0]
    bodies = {f.signature.name: {n.name: n for n in f.node_def} for f in meta_graph.graph_def.library.function}
    return {(e.function, e.node): bodies[e.function][e.node].SerializeToString(deterministic=True)
            for e in find_effects(meta_graph)}


def test_verify_and_convert_verify_leave_the_world_as_it_was(model, tmp_path, capsys):
    output = tmp_path / "out"
    said = _untouched(model, ["convert", str(model[0]), str(output), "--precision", "bfloat16", "--assign",
                              "lists", "--verify"], capsys)
    assert "verification passed" in said
    said = _untouched(model, ["verify", str(model[0]), str(output)], capsys)
    assert f"{LINE}: not run here" in said.replace("\n", " ")


def test_inspect_time_view_measures_a_copy_and_says_so(model, tmp_path, capsys):
    said = _untouched(model, ["inspect", str(model[0]), "--precision", "bfloat16", "--device", "cpu", "--assign",
                              "cost", "--format", "html", "--show", "time", "-o", str(tmp_path / "page.html")], capsys)
    assert (tmp_path / "page.html").is_file()
    assert "measured on a copy in which the ops with effects do nothing" in said
    assert LINE in said.replace("\n", " ")


def test_tune_leaves_the_world_as_it_was(model, tmp_path):
    from mp_rewrite.savedmodel.tune import tune_saved_model
    before = _tree(*model)
    tuned = tune_saved_model(model[0], tmp_path / "tuned", "bfloat16", rounds=1, calls=1)
    assert _tree(*model) == before
    assert any(note.startswith(LINE) for note in tuned.conversion.notes)
    _performs_effects(tmp_path / "tuned", model[1])


def test_run_effects_runs_the_model_as_it_is(model, tmp_path, capsys):
    argv = ["convert", str(model[0]), str(tmp_path / "out"), "--precision", "bfloat16", "--assign", "lists"]
    try:
        assert cli.main([*argv, "--run-effects"]) == 0
        assert WRITTEN <= {p.name for p in model[1].iterdir()}  # the run check called the model as it is
        assert f"{LINE}: run during conversion, as asked (--run-effects)" in capsys.readouterr().out.replace("\n", " ")
    finally:
        _empty(model[1])


def test_a_signature_saving_its_variables_converts_in_place_and_freeze_refuses_it_in_one_line(tmp_path, capsys):
    side, path = tmp_path / "side", tmp_path / "saver"
    side.mkdir()
    module = Saver(side)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    model = (path, side)
    argv = ["convert", str(path), str(tmp_path / "out"), "--precision", "bfloat16", "--assign", "lists"]
    said = _untouched(model, argv, capsys)
    assert "serving_default saves checkpoints (MergeV2Checkpoints, SaveV2): not run during conversion" in \
        said.replace("\n", " ")
    before = _tree(*model)
    assert cli.main([*argv[:2], str(tmp_path / "frozen"), *argv[3:], "--freeze"]) == 2
    err = capsys.readouterr().err.strip()
    assert "(DisableCopyOnRead)" in err and "cannot be frozen" in err and "\n" not in err
    assert _tree(*model) == before and not (tmp_path / "frozen").exists()


def test_a_frozen_graph_is_measured_and_guarded_without_its_effects(tmp_path, capsys):
    side, path = tmp_path / "side", tmp_path / "writer"
    side.mkdir()
    module = Writer(side)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    output = tmp_path / "out"
    said = _untouched((path, side), ["convert", str(path), str(output), "--precision", "bfloat16", "--freeze",
                                     "--assign", "cost"], capsys)
    assert "measured on a copy in which the ops with effects do nothing (serving_default writes files (WriteFile), " \
           "saves checkpoints (SaveV2))" in said
    said = _untouched((path, side), ["convert", str(path), str(tmp_path / "guarded"), "--precision", "bfloat16",
                                     "--guard", "--assign", "lists"], capsys)
    assert "accuracy guard" in said and "tolerance met" in said  # it ran the frozen signature, without its effects
    loaded = tf.saved_model.load(str(output))
    loaded.signatures["serving_default"](x=tf.ones([1, 64]))
    assert {"written.txt", "ckpt.index"} <= {p.name for p in side.iterdir()}


class Vocabulary(tf.Module):
    """A summary writer created on load and a table read from an asset (freezing copies it from where it loaded)."""

    def __init__(self, side: Path, vocabulary: Path):
        initializer = tf.lookup.TextFileInitializer(str(vocabulary), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                                    tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
        self.table = tf.lookup.StaticHashTable(initializer, -1)
        self.writer = tf.summary.create_file_writer(str(side / "logs"), experimental_trackable=True)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
    def serve(self, words):
        with self.writer.as_default():
            tf.summary.write("words", tf.size(words), step=1)
        return {"ids": self.table.lookup(words)}


def test_a_model_with_assets_freezes_from_a_copy_without_its_loading_effects(tmp_path, capsys):
    side, path, vocabulary = tmp_path / "side", tmp_path / "vocabulary", tmp_path / "words.txt"
    side.mkdir()
    vocabulary.write_text("a\nb\nc\n")
    module = Vocabulary(side, vocabulary)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    _empty(side)
    output = tmp_path / "out"
    said = _untouched((path, side), ["convert", str(path), str(output), "--precision", "bfloat16", "--freeze",
                                     "--assign", "lists"], capsys)
    assert "loading the model writes summaries (CreateSummaryFileWriter): not run" in said.replace("\n", " ")
    loaded = tf.saved_model.load(str(output))
    assert loaded.signatures["serving_default"](words=tf.constant(["b", "z"]))["ids"].numpy().tolist() == [1, -1]
    assert list((side / "logs").iterdir())  # the written model creates its writer on load, as the source did


# --------------------------------------------------------------------------------------------- no effects


def test_a_model_without_effects_is_run_as_it_is(tmp_path, capsys):
    module = Plain()
    tf.saved_model.save(module, str(tmp_path / "plain"), signatures={"serving_default": module.serve})
    saved_model = read_saved_model(tmp_path / "plain")
    assert saved_model_without_effects(saved_model)[0] is saved_model  # no copy: what runs is the model itself
    assert meta_graph_without_effects(saved_model.meta_graphs[0])[0] is saved_model.meta_graphs[0]
    results = []
    for run in (False, True):
        assert cli.main(["convert", str(tmp_path / "plain"), str(tmp_path / f"out{run}"), "--precision", "bfloat16",
                         "--assign", "lists", *["--run-effects"] * run]) == 0
        results.append(read_saved_model(tmp_path / f"out{run}").SerializeToString())
    assert results[0] == results[1]  # the same decisions, node for node
    assert "not run during conversion" not in capsys.readouterr().out
