"""A verification that can fail: outputs that do not depend on the inputs fed are found and said to prove nothing.

keras.applications.MobileNetV2(weights=None) at 96x96 outputs exactly 0.001 for every class on every input (its
random layers' activations die out, so the logits are all equal): comparing it with any conversion passes, whatever
the conversion did. verify must not say "passed" on it (issue 39, item 6).
"""

from __future__ import annotations

import numpy as np
import pytest

from mp_rewrite.analysis.compare import compare_outputs, rows_differ, unvarying
from mp_rewrite.commands import cli


def test_a_constant_output_is_unvarying_whatever_the_inputs():
    assert unvarying(np.full((2, 1000), 0.001, np.float32)) == "0.001 everywhere"
    assert unvarying(np.zeros((4, 3), np.int64)) == "0 everywhere"


def test_rows_alike_are_unvarying_only_where_the_inputs_rows_differ():
    same_rows = np.tile(np.arange(5, dtype=np.float32), (3, 1))
    assert unvarying(same_rows, inputs_differ=True) == "the same in every row of the batch"
    assert unvarying(same_rows, inputs_differ=False) == ""  # the same input in every row: nothing learned


def test_rows_within_the_tolerance_of_the_first_are_unvarying():
    """MobileNetV2 of random weights without its softmax: logits that differ by 5e-11 across inputs; a model that
    ignored its inputs would pass the comparison."""
    logits = np.float32(0.3) + np.random.default_rng(2).normal(0, 1e-6, (2, 1000)).astype(np.float32)
    assert unvarying(logits, inputs_differ=True, rtol=5e-2, atol=5e-2) == \
        "every row of the batch within the tolerance of the first"
    assert unvarying(logits, inputs_differ=True) == ""  # no tolerance given: only exact equality counts
    apart = np.stack([np.linspace(0, 1, 10), np.linspace(1, 0, 10)])
    assert unvarying(apart, inputs_differ=True, rtol=5e-2, atol=5e-2) == ""


def test_a_varying_output_and_a_single_value_are_not_flagged():
    assert unvarying(np.random.default_rng(0).normal(size=(2, 10)), inputs_differ=True) == ""
    assert unvarying(np.float32(3.0)) == ""


def test_compare_outputs_marks_only_the_unvarying_output():
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    assert rows_differ({"x": x}) and not rows_differ({"x": np.tile(x[:1], (2, 1))})
    ref = {"probs": np.full((2, 4), 0.25, np.float32), "logits": x * 2}
    checks = compare_outputs(ref, ref, 1e-2, 1e-2, inputs={"x": x})
    assert [(c.output, c.passed, c.unvarying) for c in checks] == [
        ("probs", True, "0.25 everywhere"), ("logits", True, "")]


@pytest.fixture(scope="module")
def dead_mobilenet(tmp_path_factory):
    """The README's MobileNetV2 (random weights, 96x96), exported; its outputs are 0.001 everywhere."""
    import keras
    path = tmp_path_factory.mktemp("dead") / "mobilenet"
    keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3)).export(str(path), verbose=False)
    return path


@pytest.mark.slow
def test_verify_of_the_readme_mobilenet_says_it_proved_nothing(dead_mobilenet, capsys):
    code = cli.main(["verify", str(dead_mobilenet), str(dead_mobilenet), "--precision", "bfloat16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verification proved nothing" in out and "verification passed" not in out, out
    assert "0.001 everywhere" in out and "--inputs" in out, out


@pytest.mark.slow
def test_verify_of_a_model_whose_outputs_vary_passes(small_cnn, capsys):
    code = cli.main(["verify", str(small_cnn), str(small_cnn), "--precision", "bfloat16"])
    out = capsys.readouterr().out
    assert code == 0 and "verification passed" in out and "proves nothing" not in out, out


@pytest.mark.slow
def test_tune_says_its_verification_proves_nothing_on_a_constant_output(tmp_path):
    import keras

    from mp_rewrite.savedmodel.tune import tune_saved_model
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,), name="x")
    hidden = keras.layers.Dense(16, activation="relu")(inp)
    keras.Model(inp, keras.layers.Dense(4, kernel_initializer="zeros")(hidden)).export(str(tmp_path / "m"),
                                                                                       verbose=False)
    result = tune_saved_model(tmp_path / "m", tmp_path / "tuned", "bfloat16", rounds=1, calls=1)
    assert "no output depends on the inputs fed" in result.summary(), result.summary()
