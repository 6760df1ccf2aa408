"""`convert`'s default assignment: for a CPU, the cost assignment with costs measured in the model on this machine
(never slower than float32 here); for a GPU, Grappler's lists; MP_REWRITE_ASSIGN overrides it (the rest of the
suite sets it to lists, so that what a conversion writes is the same on every machine)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.analysis.op_costs import this_machine  # noqa: E402
from mp_rewrite.commands import cli  # noqa: E402

UNITS = this_machine("bfloat16").low_units


@pytest.fixture(autouse=True)
def default_assignment(tmp_path, monkeypatch):
    monkeypatch.delenv("MP_REWRITE_ASSIGN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class Parser(tf.Module):
    """A string input (no random data makes it) parsed into numbers, then a matmul."""

    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[1, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.string, name="text")])
    def __call__(self, text):
        return {"y": tf.matmul(tf.strings.to_number(text), self.w)}


def test_the_default_for_a_cpu_is_the_cost_assignment_measured_here(small_cnn, tmp_path, capsys):
    argv = ["convert", str(small_cnn), str(tmp_path / "out"), "--precision", "bfloat16", "--batch-size", "4"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    if UNITS:
        line = next(line for line in out.splitlines() if line.startswith("cost assignment of serve:"))
        assert "costs measured in this graph on this machine" in line and "candidates kept float32" in line
    else:  # one line says why nothing is converted, and how to convert by the lists anyway
        assert "every op stays float32" in err and "--assign lists" in err
    assert set(tf.saved_model.load(str(tmp_path / "out")).signatures) == {"serve", "serving_default"}


def test_the_default_for_a_gpu_and_the_override_are_the_lists(small_cnn, tmp_path, capsys, monkeypatch):
    assert cli.main(["convert", str(small_cnn), str(tmp_path / "gpu"), "--precision", "float16"]) == 0
    assert "cost assignment" not in capsys.readouterr().out
    monkeypatch.setenv("MP_REWRITE_ASSIGN", "lists")
    assert cli.main(["convert", str(small_cnn), str(tmp_path / "lists"), "--precision", "bfloat16"]) == 0
    assert "cost assignment" not in capsys.readouterr().out


def test_a_bad_override_is_a_one_line_error_and_nothing_is_written(small_cnn, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MP_REWRITE_ASSIGN", "fastest")
    assert cli.main(["convert", str(small_cnn), str(tmp_path / "out"), "--precision", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MP_REWRITE_ASSIGN='fastest'" in err[0] and "'lists' or 'cost'" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not UNITS, reason="without bfloat16 units nothing is measured, so there is no fallback to see")
def test_a_model_random_data_cannot_run_falls_back_to_the_op_table_and_says_so(tmp_path, capsys):
    module = Parser()
    tf.saved_model.save(module, str(tmp_path / "parser"), signatures=module.__call__)
    assert cli.main(["convert", str(tmp_path / "parser"), str(tmp_path / "out"), "--precision", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "not measured in the graph: no signature has inputs random data can make" in out


class Sequence(tf.Module):
    """Token ids of unknown batch and length (a keras-hub backbone's export), embedded, then two matmuls."""

    def __init__(self):
        self.table = tf.Variable(tf.random.stateless_normal([50, 64], seed=[1, 2]))
        self.w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[3, 4]))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")])
    def __call__(self, token_ids):
        x = tf.gather(self.table, token_ids)
        return {"y": tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, self.w)), self.w))}


@pytest.mark.skipif(not UNITS, reason="without bfloat16 units nothing is measured")
@pytest.mark.parametrize("freeze", [["--freeze"], []], ids=["frozen", "in place"])
def test_a_model_of_unknown_sequence_length_is_measured_at_seq_len_not_priced_from_zero(tmp_path, capsys, freeze):
    """Issue 27: `--freeze` priced such a model from the op table ("shapes unknown", "predicted 0.00 ms") and kept
    every op float32 on that. Its sequence is now as long as --seq-len says (the made-up inputs' length), and the
    line says so."""
    module = Sequence()
    tf.saved_model.save(module, str(tmp_path / "seq"), signatures=module.__call__)
    argv = ["convert", str(tmp_path / "seq"), str(tmp_path / "out"), "--precision", "bfloat16", *freeze,
            "--batch-size", "4", "--seq-len", "32"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(line for line in out if line.startswith("cost assignment"))
    assert "costs measured in this graph on this machine" in line and "not measured in the graph" not in line
    assert "unknown dimensions other than the batch measured as 32 (--seq-len)" in line
    first = next(line for line in out if line.startswith("wrote ") and "measured" in line)  # the decision, first
    assert first.endswith("(a length the model leaves unknown measured as 32: --seq-len sets the length served)")
