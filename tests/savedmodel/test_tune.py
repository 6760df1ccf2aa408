"""`convert --tune`: three candidates converted, timed here and verified; the fastest that verifies is written."""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

from mp_rewrite.savedmodel.tune import CANDIDATES, ORIGINAL, TUNING_FILE, tune_saved_model  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402


def test_tune_writes_the_fastest_verified_candidate_and_records_why(tmp_path):
    example_models.cnn_bn(image_size=16).export(str(tmp_path / "cnn"), verbose=False)
    result = tune_saved_model(tmp_path / "cnn", tmp_path / "tuned", "bfloat16", freeze=True, rounds=3, calls=2)
    assert set(result.milliseconds) == {*CANDIDATES, ORIGINAL} == set(result.passed)
    assert result.passed[result.chosen]
    fastest = min((n for n in result.milliseconds if result.passed[n]), key=result.milliseconds.get)
    assert result.chosen == fastest
    assert result.milliseconds[result.chosen] <= result.milliseconds[ORIGINAL]  # never slower than the model here
    record = json.loads((tmp_path / "tuned" / "assets" / TUNING_FILE).read_text())
    assert record["chosen"] == result.chosen and record["median_cpu_ms_per_call"] == result.milliseconds
    loaded = tf.saved_model.load(str(tmp_path / "tuned"))
    assert set(loaded.signatures) == set(tf.saved_model.load(str(tmp_path / "cnn")).signatures)
    assert "chose '" in result.summary()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn", "tuned"]  # no candidate left behind
