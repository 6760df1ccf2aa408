"""One story across commands: inspect (model.loaded), convert and demo rewrite the same functions of a model
and report the same numbers (nodes now in low precision, casts in both directions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.savedmodel.convert import convert_saved_model


@pytest.fixture(scope="module")
def tf_keras_lstm(tmp_path_factory):
    """A tf_keras LSTM: its restored objects' functions are not called by the main graph, only by the object graph."""
    import tensorflow as tf
    import tf_keras
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((5, 4)), tf_keras.layers.LSTM(8), tf_keras.layers.Dense(3)])
    path = tmp_path_factory.mktemp("story") / "lstm"
    tf.saved_model.save(model, str(path))
    return path


def _totals(results) -> tuple:
    return (sum(len(r.converted_nodes) for r in results), sum(len(r.casts) for r in results))


def test_inspect_and_convert_rewrite_the_same_functions_with_the_same_counts(tf_keras_lstm, tmp_path):
    converted = convert_saved_model(tf_keras_lstm, tmp_path / "out", "bfloat16")
    inspected = rewrite_model(load_model(str(tf_keras_lstm)), "bfloat16")
    assert set(inspected.functions) == set(converted.functions)
    assert _totals([inspected, *inspected.functions.values()]) == (converted.converted_nodes, converted.casts)


def test_demo_explains_its_two_lines():
    proc = subprocess.run([sys.executable, "-m", "mp_rewrite", "demo"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    ours = next(line for line in lines if ": converted " in line)
    grappler = next(i for i, line in enumerate(lines) if line.strip().startswith("Converted "))
    assert "it counts type attributes, and only the casts into" in lines[grappler - 1]
    assert ours and grappler
