"""The written copy runs before it is moved into place (mp_rewrite/savedmodel/run_check.py).

Faults are made for real in the written graph: the proto `convert` hands to the writer gets an attr emptied after the
rewrite (what the fuzz test once saw pass: TensorFlow loads such a model and fails only when it is called, "Failed to
bind all placeholders"). Each strategy is tried: in place, --freeze, and --freeze with the weights kept as variables.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from mp_rewrite import convert_saved_model
from mp_rewrite.commands import cli
from mp_rewrite.savedmodel import convert
from users import entries, load_and_run, one_line_error, tree_hash

STRATEGIES = {"in-place": [], "frozen": ["--freeze"], "frozen variables": ["--freeze", "--freeze-weights", "variables"]}
# Attrs the loader does not look at, but the function runtime binds when the function is called.
RUN_TIME_ATTRS = ("_user_specified_name", "_collective_manager_ids")


@pytest.fixture
def faulty_writer(monkeypatch):
    """Make `convert` write its copy with the run-time attrs of every function body emptied."""
    write = convert.write_model_dir

    def write_emptied(files, output, saved_model, *args, **kwargs):
        model = saved_model_pb2.SavedModel.FromString(saved_model.SerializeToString())
        emptied = 0
        for fdef in model.meta_graphs[0].graph_def.library.function:
            for node in fdef.node_def:
                for key in set(RUN_TIME_ATTRS) & set(node.attr):
                    node.attr[key].Clear()
                    emptied += 1
        assert emptied, "nothing to empty: the fault would not be made"
        return write(files, output, model, *args, **kwargs)
    monkeypatch.setattr(convert, "write_model_dir", write_emptied)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_output_that_fails_to_run_is_refused_in_one_line(source, tmp_path, capsys, faulty_writer, strategy):
    before = tree_hash(source)
    out = tmp_path / "out"
    assert cli.main(["convert", str(source), str(out), "--precision", "bfloat16", *STRATEGIES[strategy]]) == 2
    line = one_line_error(capsys.readouterr().err, "failed to run signature 'serving_default': Failed to bind")
    assert "the source runs it: this is an mp_rewrite bug, please report it" in line and "nothing was written" in line
    assert entries(tmp_path) == [] and tree_hash(source) == before


def test_no_run_check_writes_what_the_check_would_refuse(source, tmp_path, faulty_writer):
    result = convert_saved_model(source, tmp_path / "out", "bfloat16", run_check=False)
    assert result.ran is None and (tmp_path / "out" / "saved_model.pb").is_file()
    with pytest.raises(tf.errors.InvalidArgumentError, match="Failed to bind"):
        load_and_run(tmp_path / "out")


class Broken(tf.Module):
    """Loads, and fails on any input but large ones (an assertion): the source is the user's to fix."""

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def __call__(self, x):
        with tf.control_dependencies([tf.debugging.assert_greater(x, 100.0, message="x must exceed 100")]):
            return {"y": tf.matmul(x, tf.ones([4, 4]))}


def test_a_source_that_fails_to_run_is_the_users_to_fix(tmp_path, capsys):
    src = tmp_path / "broken"
    tf.saved_model.save(Broken(), str(src))
    for strategy in STRATEGIES.values():
        assert cli.main(["convert", str(src), str(tmp_path / "out"), "--precision", "bfloat16", *strategy]) == 2
        line = one_line_error(capsys.readouterr().err, "failed to run signature 'serving_default'")
        assert f"the source '{src}' fails " in line and "--no-run-check" in line and "mp_rewrite bug" not in line
        assert "on these made-up inputs: give inputs it runs on (--inputs FILE.npz" in line  # they fail it here
        assert entries(tmp_path) == ["broken"]
    assert cli.main(["convert", str(src), str(tmp_path / "out"), "--precision", "bfloat16", "--no-run-check"]) == 0
    assert "the written copy ran" not in capsys.readouterr().out


class Texts(tf.Module):
    """A string input: no random data can stand for it."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def __call__(self, text):
        numbers = tf.strings.to_number(text)[:, None]
        return {"y": tf.matmul(numbers, tf.ones([1, 4]))}


def test_a_signature_whose_inputs_cannot_be_made_is_said_not_run(tmp_path, capsys):
    src = tmp_path / "texts"
    tf.saved_model.save(Texts(), str(src))
    assert cli.main(["convert", str(src), str(tmp_path / "out"), "--precision", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "signature 'serving_default' was not run before writing: serving_default/text (string) cannot be made " \
           "up" in out and "the written copy ran" not in out
    np.savez(tmp_path / "texts.npz", text=np.array([b"1.5", b"2"]))
    assert cli.main(["convert", str(src), str(tmp_path / "given"), "--precision", "bfloat16", "--inputs",
                     str(tmp_path / "texts.npz")]) == 0
    out = capsys.readouterr().out
    assert "the written copy ran 1 signature once before it was moved into place (serving_default)" in out
    assert "was not run" not in out


@pytest.mark.parametrize("freeze, form", [(False, "auto"), (True, "constants"), (True, "variables")])
def test_every_signature_runs_once_in_each_strategy(looper, tmp_path, freeze, form):
    result = convert_saved_model(looper, tmp_path / "out", "bfloat16", freeze=freeze, freeze_weights=form)
    assert result.ran == ("serving_default",) and load_and_run(tmp_path / "out")["y"].shape == (2, 16)


def test_a_keras_exports_twin_signatures_both_count_as_run(small_cnn, tmp_path):
    result = convert_saved_model(small_cnn, tmp_path / "out", "bfloat16", freeze=True)
    assert result.ran == ("serve", "serving_default")  # one function, called once


def test_tensorflows_words_are_the_line_after_the_graph_execution_preamble():
    from mp_rewrite.analysis.graph_runs import Runner
    from mp_rewrite.errors import tf_reason

    @tf.function
    def eager(x):
        tf.debugging.assert_greater(x, 100.0, message="x must exceed 100")
        return x
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        with tf.control_dependencies([tf.debugging.assert_greater(x, 100.0, message="x must exceed 100")]):
            tf.identity(x, name="y")
    session = Runner.of_graph(graph.as_graph_def(), {"x:0": np.ones(2, np.float32)}, ["y:0"])
    for call in (lambda: eager(tf.ones([2])), session.run):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            call()
        assert str(raised.value).startswith("Graph execution error:")
        assert tf_reason(raised.value).startswith("assertion failed: [x must exceed 100]")
    session.close()


@pytest.fixture
def float32_writer(monkeypatch):
    """Make `convert` write its copy with every bfloat16 type attr set back to float32 (a save that drops the
    rewrite: the copy loads and runs, its Casts cast float32 to float32)."""
    from tensorflow.core.framework import types_pb2
    write = convert.write_model_dir

    def write_float32(files, output, saved_model, *args, **kwargs):
        model = saved_model_pb2.SavedModel.FromString(saved_model.SerializeToString())
        for fdef in model.meta_graphs[0].graph_def.library.function:
            for value in (v for node in fdef.node_def for v in node.attr.values()):
                if value.type == types_pb2.DT_BFLOAT16:
                    value.type = types_pb2.DT_FLOAT
        return write(files, output, model, *args, **kwargs)
    monkeypatch.setattr(convert, "write_model_dir", write_float32)


def test_the_summary_counts_what_the_written_copy_holds(source, tmp_path, capsys, float32_writer):
    assert cli.main(["convert", str(source), str(tmp_path / "out"), "--precision", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert "0 nodes converted to bfloat16 in the main graph and 4 functions, 0 casts in the written copy of the 8 " \
        "the rewrite inserted" in said
    result = convert_saved_model(source, tmp_path / "again", "bfloat16")
    assert result.written == (0, 0) and (result.converted_nodes, result.casts) == (8, 8)  # the records say otherwise


@pytest.mark.parametrize("freeze", [False, True])
def test_the_written_counts_match_the_records_of_an_honest_save(source, tmp_path, freeze):
    result = convert_saved_model(source, tmp_path / "out", "bfloat16", freeze=freeze)
    assert result.written[0] == result.converted_nodes > 0
    # A frozen graph's Cast after a constant weight is folded into a bfloat16 constant after the rewrite recorded it.
    assert result.written[1] == result.casts - (1 if freeze else 0)


class TwoHeads(tf.Module):
    """Two signatures of one structure that read different variables: not twins, each must be called."""

    def __init__(self):
        self.a = tf.Variable(tf.ones([4, 4]))
        self.b = tf.Variable(2 * tf.ones([4, 4]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def first(self, x):
        return {"y": tf.matmul(x, self.a)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def second(self, x):
        return {"y": tf.matmul(x, self.b)}


def _runs(source, output, **kwargs) -> tuple:
    """Convert with the run check's calls kept, as `convert --verify` keeps them: (result, runs)."""
    from mp_rewrite.savedmodel.verify import tags_key
    runs = {}
    result = convert_saved_model(source, output, "bfloat16",
                                 on_run=lambda tags, key, run: runs.__setitem__((tags_key(tags), key), run), **kwargs)
    return result, runs


@pytest.mark.parametrize("freeze", [False, True])
def test_verify_compares_the_run_checks_calls_without_loading_the_copy_again(source, tmp_path, freeze):
    from mp_rewrite.errors import ModelError
    from mp_rewrite.savedmodel.verify import verify_saved_models
    out = tmp_path / "out"
    result, runs = _runs(source, out, freeze=freeze, freeze_weights="variables")
    assert [key for _, key in runs] == list(result.ran) == ["serving_default"]
    for data in (out / "variables").glob("variables.data-*"):
        data.write_bytes(b"")  # the copy can no longer be loaded: a verify that loads it fails
    with pytest.raises(ModelError, match="cannot load the converted SavedModel"):
        verify_saved_models(source, out)
    report = verify_saved_models(source, out, converted_runs=runs)
    assert report.passed and len(report.checks) == 1 and report.checks[0].max_abs > 0  # bfloat16, compared
    run = runs[next(iter(runs))]
    wrong = dataclasses.replace(run, outputs={k: v + 1 for k, v in run.outputs.items()})
    assert not verify_saved_models(source, out, converted_runs={next(iter(runs)): wrong}).passed


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_signatures_alike_but_for_their_variables_are_each_called_and_verified(tmp_path, capsys, strategy):
    """Each is called with its own weights and verified with its own outputs (a twin is only a signature that calls
    the same function with the same captured tensors)."""
    src = tmp_path / "heads"
    heads = TwoHeads()
    tf.saved_model.save(heads, str(src), signatures={"first": heads.first, "second": heads.second})
    freeze = {"freeze": bool(STRATEGIES[strategy]), "freeze_weights": STRATEGIES[strategy][-1] if
              "--freeze-weights" in STRATEGIES[strategy] else "auto"}
    result, runs = _runs(src, tmp_path / "out", **freeze)
    assert result.ran == ("first", "second")
    for (_, key), run in runs.items():  # each ran with its own weights
        weight = {"first": 1, "second": 2}[key]
        np.testing.assert_allclose(run.outputs["y"], run.arrays["x"] @ (weight * np.ones([4, 4])), rtol=2e-2, atol=0.1)
    assert cli.main(["convert", str(src), str(tmp_path / "cli"), "--precision", "bfloat16", "--verify",
                     *STRATEGIES[strategy]]) == 0
    assert "verification passed: 2 outputs of 2 signatures" in capsys.readouterr().out
