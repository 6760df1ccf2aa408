"""`convert --tune`: the candidates converted, timed here and verified; the fastest that verifies is written,
and each step is told as it begins."""

from __future__ import annotations

import json
import os
import re

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

from mp_rewrite.errors import OptionError  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.tune import CANDIDATES, ORIGINAL, TUNING_FILE, _candidate_lists, tune_saved_model  # noqa: E402,E501
from mp_rewrite.core.oplists import load_lists  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402
from mp_rewrite.analysis.op_costs import this_machine  # noqa: E402

# The cost candidate is tried where the CPU computes bfloat16 natively (elsewhere it would be the float32 one).
TRIED = set(CANDIDATES) - (set() if this_machine("bfloat16").low_units else {"cost"})


def test_tune_writes_the_fastest_verified_candidate_and_records_why(tmp_path):
    example_models.cnn_bn(image_size=16).export(str(tmp_path / "cnn"), verbose=False)
    result = tune_saved_model(tmp_path / "cnn", tmp_path / "tuned", "bfloat16", freeze=True, rounds=3, calls=2)
    # No depthwise convolution in this model, so no candidate that only differs there.
    assert set(result.milliseconds) == {*TRIED, ORIGINAL} - {"no-depthwise"} == set(result.passed)
    assert result.passed[result.chosen]
    fastest = min((n for n in result.milliseconds if result.passed[n]), key=result.milliseconds.get)
    # The fastest, or one that ties with it inside the noise, earlier in the candidates' order (and said).
    assert result.chosen == fastest or (f"a tie with the fastest, '{fastest}'" in result.tie and
                                        list(result.milliseconds).index(result.chosen) <
                                        list(result.milliseconds).index(fastest))
    record = json.loads((tmp_path / "tuned" / "assets" / TUNING_FILE).read_text())
    assert record["chosen"] == result.chosen and record["median_cpu_ms_per_call"] == result.milliseconds
    loaded = tf.saved_model.load(str(tmp_path / "tuned"))
    assert set(loaded.signatures) == set(tf.saved_model.load(str(tmp_path / "cnn")).signatures)
    assert "chose '" in result.summary()
    assert result.conversion.output == str(tmp_path / "tuned")
    assert not any("mp_rewrite-tune-" in note for note in result.conversion.notes), result.conversion.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn", "tuned"]  # no candidate left behind


def test_the_candidates_are_verified_at_the_tolerance_given(tmp_path):
    # At 1e-6 only a candidate computing in float32 agrees with the original: tune writes it, and says the others
    # failed (before, tune verified at the precision's defaults whatever --rtol/--atol said).
    example_models.cnn_bn(image_size=16).export(str(tmp_path / "cnn"), verbose=False)
    with pytest.raises(OptionError, match="rtol"):  # checked before any candidate is converted
        tune_saved_model(tmp_path / "cnn", tmp_path / "tuned", "bfloat16", rtol=-1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn"]
    result = tune_saved_model(tmp_path / "cnn", tmp_path / "tuned", "bfloat16", rounds=2, calls=1, rtol=1e-6,
                              atol=1e-6)
    # The lists' candidates compute in bfloat16 and fail; the cost candidate may keep all float32 where its
    # measured costs say so (a busy machine), and then passes.
    assert result.passed["float32"] and not result.passed["grappler"] and not result.passed["matmul-conv"]
    assert result.passed[result.chosen]
    assert "verified at rtol=1e-06, atol=1e-06 (as given)" in result.summary()


def test_a_model_with_depthwise_convolutions_also_tries_them_in_float32(tmp_path):
    import keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 8), name="image")
    x = keras.layers.DepthwiseConv2D(3, padding="same")(keras.layers.Conv2D(8, 1)(inp))
    keras.Model(inp, keras.layers.Conv2D(4, 1)(x)).export(str(tmp_path / "dw"), verbose=False)
    result = tune_saved_model(tmp_path / "dw", tmp_path / "tuned", "bfloat16", rounds=1, calls=1)
    assert set(result.milliseconds) == TRIED
    # The candidate itself: convolutions in bfloat16, the depthwise convolution float32.
    lists = _candidate_lists("no-depthwise", load_lists("bfloat16"))
    assert "Conv2D" in lists.allow and "DepthwiseConv2dNative" not in lists.allow and not lists.infer
    convert_saved_model(tmp_path / "dw", tmp_path / "no_dw", "bfloat16", lists=lists)
    ops = {(n.op, n.attr["T"].type) for f in tf.saved_model.load(str(tmp_path / "no_dw")).signatures[
        "serving_default"].graph.as_graph_def().library.function for n in f.node_def}
    assert ("DepthwiseConv2dNative", tf.float32.as_datatype_enum) in ops
    assert ("Conv2D", tf.bfloat16.as_datatype_enum) in ops


def test_ids_are_drawn_inside_a_small_vocabulary(tmp_path):
    # Made-up ids default to < 1000; a 50-token table must be learned (as verify does) before timing, or TF fails.
    import keras
    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 8)(tokens))
    keras.Model(tokens, keras.layers.Dense(4)(x)).export(str(tmp_path / "emb"), verbose=False)
    result = tune_saved_model(tmp_path / "emb", tmp_path / "tuned", "bfloat16", rounds=1, calls=1)
    assert result.passed[result.chosen] and all(ms > 0 for ms in result.milliseconds.values())


def test_progress_names_each_candidate_its_place_and_the_time_left(tmp_path):
    import keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,), name="x")
    keras.Model(inp, keras.layers.Dense(4)(keras.layers.Dense(8, activation="relu")(inp))).export(
        str(tmp_path / "mlp"), verbose=False)
    told = []
    result = tune_saved_model(tmp_path / "mlp", tmp_path / "tuned", "bfloat16", rounds=2, calls=1,
                              progress=lambda done, total, step: told.append((done, total, step)))
    names = list(result.milliseconds)
    total = 3 * len(names) + 2
    assert [done for done, _, _ in told] == list(range(total + 1)) and {t for _, t, _ in told} == {total}
    steps = [step for _, _, step in told]
    for phase in ("converting", "verifying", "loading"):
        assert [s.split(",")[0] for s in steps if s.startswith(phase)] == [
            f"{phase} '{name}' (candidate {i} of {len(names)})" for i, name in enumerate(names, 1)]
    assert [s.split(",")[0] for s in steps if s.startswith("timing")] == [
        "timing round 1 of 2 (every candidate", "timing round 2 of 2 (every candidate"]
    # Once a step has been timed, every step says roughly how long is left.
    assert "left" not in steps[0] and all(re.search(r", about \d+ (s|min) left$", s) for s in steps[1:-1])
    assert steps[-1] == f"writing '{result.chosen}', " + ("a tie with the fastest" if result.tie else
                                                          "the fastest candidate that verifies")
