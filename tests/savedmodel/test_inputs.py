"""Made-up inputs for verification: dynamic shapes, ids inside the tables they index, masks, strings named, every
option checked before anything is converted."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.errors import ModelError, OptionError  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.inputs import (DEFAULT_ID_LIMIT, check_input_options, id_limit_from_error,  # noqa: E402
                                          parse_input_shapes, run_learning_id_limit, signature_inputs)
from mp_rewrite.savedmodel.verify import verify_saved_models  # noqa: E402


def _text_model():
    """A keras-hub-like text encoder: (None, None) token ids into a 30-row embedding, and a padding mask."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = keras.layers.Embedding(30, 16)(ids)
    x = keras.layers.Dense(16, activation="relu")(x)
    x = x * keras.ops.expand_dims(keras.ops.cast(mask, "float32"), -1)
    return keras.Model([ids, mask], keras.layers.Dense(4)(keras.ops.mean(x, axis=1)))


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    _text_model().export(str(root / "src"), verbose=False)
    convert_saved_model(root / "src", root / "bf16", "bfloat16")
    return root


def test_dynamic_text_inputs_need_no_file_ids_stay_inside_the_table(text_model):
    report = verify_saved_models(text_model / "src", text_model / "bf16")
    assert report.passed, report.summary()
    made = report.inputs["serving_default"]
    assert made["token_ids"] == "random 2x16 ids < 30"  # learned from the model's own out-of-range error
    assert made["padding_mask"].startswith("mask 2x16")


def test_ids_limit_is_read_from_tensorflows_error():
    assert id_limit_from_error("indices[0,3] = 997 is not in [0, 30) [Op:GatherV2]") == 30
    assert id_limit_from_error("some other failure") is None


def test_the_id_limit_is_learned_from_the_tables_a_call_indexes_and_other_failures_are_handed_back():
    small, large = tf.random.normal([30, 4]), tf.random.normal([500, 4])

    def lookup(limit: int):  # two tables: the larger's error comes first, then the smaller's
        ids = tf.constant(np.arange(limit - 5, limit))
        return tf.gather(large, ids) + tf.gather(small, ids)

    limit, result, error = run_learning_id_limit(lookup, tf.errors.OpError)
    assert (limit, error) == (30, None) and result.shape == (5, 4)

    def broken(limit: int):
        raise tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [2] vs. [3]")
    limit, result, error = run_learning_id_limit(broken, tf.errors.OpError)
    assert (limit, result) == (DEFAULT_ID_LIMIT, None) and "Incompatible shapes" in str(error)
    limit, result, error = run_learning_id_limit(lookup, tf.errors.OpError, tries=1)  # out of tries: the last error
    assert (limit, result) == (500, None) and "is not in [0, 500)" in str(error)


def test_masks_are_full_then_ragged_and_segments_binary():
    specs = {"padding_mask": tf.TensorSpec([None, None], tf.bool), "segment_ids": tf.TensorSpec([None, None], tf.int32)}
    arrays, made = signature_inputs("s", specs, {}, batch_size=3, seed=0, dim=8)
    mask = arrays["padding_mask"]
    assert mask[0].all() and not mask[2].all() and mask[:, 0].all()
    assert set(np.unique(arrays["segment_ids"])) <= {0, 1} and made["segment_ids"].endswith("ids < 2")


class Strings(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="query"),
                                  tf.TensorSpec([None], tf.string, name="document")])
    def __call__(self, query, document):
        return {"n": tf.strings.length(query) + tf.strings.length(document)}


def test_string_inputs_are_all_named_before_anything_is_written(tmp_path):
    tf.saved_model.save(Strings(), str(tmp_path / "src"), signatures=Strings().__call__)
    convert_saved_model(tmp_path / "src", tmp_path / "out", "bfloat16")
    # Both inputs named in one message (in the signature's order, which TF's SignatureDef map does not fix).
    with pytest.raises(ModelError, match=r"2 input\(s\) need data (?=.*serving_default/query \(string\))"
                                         r"(?=.*serving_default/document \(string\))"):
        verify_saved_models(tmp_path / "src", tmp_path / "out")
    given = {"query": np.array([b"a"]), "document": np.array([b"bcd"])}
    assert verify_saved_models(tmp_path / "src", tmp_path / "out", inputs=given).passed


@pytest.mark.parametrize("kwargs, message", [
    ({"rtol": -1.0}, "--rtol must be a finite number >= 0"),
    ({"atol": float("nan")}, "--atol must be a finite number >= 0"),
    ({"atol": float("inf")}, "--atol must be a finite number >= 0"),
    ({"seed": -1}, "--seed must be >= 0"),
    ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"input_shapes": "ids=2xk"}, "'ids=2xk' is not NAME=DIMxDIM"),
    ({"inputs": "missing.npz"}, "inputs file 'missing.npz' does not exist"),
])
def test_bad_verify_options_are_one_line_errors(kwargs, message):
    with pytest.raises(OptionError, match=message):
        check_input_options(**kwargs)


def test_unreadable_inputs_files(tmp_path):
    np.save(tmp_path / "one.npy", np.ones(3))
    (tmp_path / "empty.npz").write_bytes(b"")
    np.savez(tmp_path / "ok.npz", x=np.ones(3))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "ok.npz").read_bytes()[:40])
    for name in ("one.npy", "empty.npz", "cut.npz"):
        with pytest.raises(OptionError, match="cannot read inputs file .* as an .npz"):
            check_input_options(inputs=str(tmp_path / name))
    assert parse_input_shapes("a=2x128, b=4") == {"a": (2, 128), "b": (4,)}


def test_convert_checks_verify_options_before_writing(text_model, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "mp_rewrite", "convert", str(text_model / "src"), str(out),
                           "--verify", "--rtol", "-1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--rtol must be a finite number >= 0" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
