"""Per-core branches in place (issue 40): `convert --split` without --freeze splits each signature's wrapper
(savedmodel/split_wrapper.py, split_in_place.py) where the batch-rows analysis accepts the signature's frozen graph
and the split copy equals the unsplit one; every rewritten function body is written as it is; a model that mixes
samples is written whole with the reason; `--tune --split` races the winner's split and records what it chose."""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.tune import TUNING_FILE, tune_saved_model  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("mlp") / "model"
    example_models.mlp().export(str(path), verbose=False)
    return path


@pytest.fixture(scope="module")
def converted(mlp, tmp_path_factory):
    """(the mlp converted in place to bfloat16 whole, the same split in 3, the split's ConversionResult)."""
    out = tmp_path_factory.mktemp("out")
    convert_saved_model(mlp, out / "whole", "bfloat16")
    result = convert_saved_model(mlp, out / "split", "bfloat16", split=3)
    return out / "whole", out / "split", result


def _functions(path) -> dict:
    return {f.signature.name: f for f in read_saved_model(path).meta_graphs[0].graph_def.library.function}


def test_in_place_split_equals_the_unsplit_model_at_an_uneven_batch_and_below_n(converted):
    whole, split, result = converted
    assert result.split and all("split in 3 branches, as asked" in line for line in result.split), result.split
    assert any("TF_NUM_INTRAOP_THREADS=1" in line for line in result.split)
    unsplit, sliced = tf.saved_model.load(str(whole)), tf.saved_model.load(str(split))
    rng = np.random.default_rng(0)
    for key in ("serving_default", "serve"):
        for batch in (5, 2):  # 2 + 2 + 1 (uneven); fewer samples than branches: run whole
            x = tf.constant(rng.normal(size=[batch, 32]).astype(np.float32))
            want, got = unsplit.signatures[key](features=x), sliced.signatures[key](features=x)
            for name in want:
                assert got[name].shape == want[name].shape == (batch, 10)
                np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-2, atol=1e-2)


def test_the_split_only_wraps_the_signatures_every_rewritten_body_is_kept(converted):
    whole, split, _ = converted
    before, after = _functions(whole), _functions(split)
    wrappers = {name for name in before if "signature_wrapper" in name}
    assert wrappers and wrappers <= set(after)
    for name, function in before.items():
        if name not in wrappers:  # Grappler's rewrite of each body, node for node
            assert after[name] == function, name
    added = set(after) - set(before)
    assert sum(name.startswith("__inference_split_batch_in_3_") for name in added) == len(wrappers)
    assert sum(name.startswith("__inference_whole_batch_") for name in added) == len(wrappers)
    for name in wrappers:  # the wrapper dispatches on the batch size to its body, whole or per slice
        assert [n.op for n in after[name].node_def if n.op == "If"] == ["If"]
    split_body = next(f for n, f in after.items() if n.startswith("__inference_split_batch_in_3_"))
    assert sum(n.op == "StatefulPartitionedCall" for n in split_body.node_def) == 3


def test_a_wrapper_split_from_a_larger_batch_runs_the_smaller_ones_whole(tmp_path, capsys):
    import shutil

    from mp_rewrite.savedmodel.model_dir import serialize
    from mp_rewrite.savedmodel.split_option import split_branches
    from mp_rewrite.savedmodel.split_wrapper import output_shapes, signature_wrapper, split_wrapper
    module = tf.Module()
    module.f = tf.function(lambda x: {"y": x * tf.cast(tf.shape(x)[0], tf.float32)},  # tells how it was called
                           input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    tf.saved_model.save(module, str(tmp_path / "counted"), signatures={"serving_default": module.f})
    saved_model = read_saved_model(tmp_path / "counted")
    meta_graph = saved_model.meta_graphs[0]
    wrapper, positions = signature_wrapper(meta_graph, "serving_default")
    carried = [i == positions["x"] for i in range(len(positions))]
    meta_graph.CopyFrom(split_wrapper(meta_graph, wrapper, carried, 2, output_shapes(meta_graph, "serving_default"),
                                      least=6))
    assert split_branches(f.signature.name for f in meta_graph.graph_def.library.function) == (2, 6)
    shutil.copytree(tmp_path / "counted", tmp_path / "split")
    (tmp_path / "split" / "saved_model.pb").write_bytes(serialize(saved_model))
    signature = tf.saved_model.load(str(tmp_path / "split")).signatures["serving_default"]
    assert (signature(x=tf.ones([5, 3]))["y"].numpy() == 5).all()  # below 6: whole
    got = signature(x=tf.ones([7, 3]))["y"].numpy()
    assert (got[:4] == 4).all() and (got[4:] == 3).all()  # 4 + 3
    from mp_rewrite.commands import cli
    assert cli.main(["inspect", str(tmp_path / "split"), "--precision", "bfloat16"]) == 0
    assert "split each batch of 6 or more into 2 concurrent branches" in capsys.readouterr().err


def test_a_model_that_mixes_samples_is_written_whole_with_the_reason(tmp_path):
    import keras
    inp = keras.Input((6,), name="x")
    dense = keras.layers.Dense(4)(inp)
    centred = keras.layers.Lambda(lambda t: t - keras.ops.mean(t, axis=0, keepdims=True))(dense)
    keras.Model(inp, centred).export(str(tmp_path / "mixing"), verbose=False)
    result = convert_saved_model(tmp_path / "mixing", tmp_path / "out", "bfloat16", split=2)
    assert result.split and all("not split" in line and "axis 0, the batch" in line for line in result.split), \
        result.split
    assert not any("split_batch" in name for name in _functions(tmp_path / "out"))


def test_the_cli_splits_in_place_and_inspect_says_how_to_serve_it(mlp, tmp_path, capsys):
    from mp_rewrite.commands import cli
    out = tmp_path / "split"
    assert cli.main(["convert", str(mlp), str(out), "--precision", "bfloat16", "--split", "2"]) == 0
    said = capsys.readouterr().out
    assert "split: signature serve, signature serving_default: split in 2 branches" in said or \
        ("split: signature serve: split in 2 branches" in said and
         "split: signature serving_default: split in 2 branches" in said), said
    assert "warning:" not in said.split("split: ")[-1].split("\n")[0]
    assert cli.main(["inspect", str(out), "--precision", "bfloat16"]) == 0
    assert "split each batch into 2 concurrent branches" in capsys.readouterr().err


def test_tune_split_races_the_winners_split_and_records_the_choice(mlp, tmp_path):
    result = tune_saved_model(mlp, tmp_path / "tuned", "bfloat16", rounds=2, calls=1, split=2)
    record = json.loads((tmp_path / "tuned" / "assets" / TUNING_FILE).read_text())
    assert record["split"]["asked"] == "2" and record["split"]["chosen"] in (1, 2)
    assert result.split == record["split"]["chosen"]
    times = record["split"]["median_wall_ms_per_call"]
    assert list(times) == [result.chosen, f"{result.chosen}, split in 2"]
    assert result.conversion.split and result.conversion.split[0] in result.conversion.notes
    written_split = any("split_batch_in_2" in name for name in _functions(tmp_path / "tuned"))
    assert written_split == (result.split == 2)
    assert ("split in 2 branches" in result.summary()) == (result.split == 2)
    if result.split == 2:  # written only if not slower beyond the noise in the other serving setting, timed there
        assert record["split"]["other_median_wall_ms_per_call"], record["split"]


def test_tune_split_times_the_winner_and_its_split_in_the_other_serving_setting(converted):
    from mp_rewrite.savedmodel.split_timing import DEFAULT_THREADS, ONE_THREAD, this_setting
    from mp_rewrite.savedmodel.tune_split import _timed_elsewhere
    whole, split, _ = converted
    other, times, why, _ = _timed_elsewhere({"whole": whole, "split": split}, {"split": 3}, None, 8)
    assert why == "" and {this_setting(), other} == {DEFAULT_THREADS, ONE_THREAD}
    # Both signatures (serving_default and serve) of each, summed: a positive time per candidate.
    assert set(times) == {"whole", "split"} and all(ms > 0 for ms in times.values()), times


def test_auto_in_place_times_the_staged_copies_in_both_serving_settings(mlp, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # timed, not read from an earlier test's times
    from mp_rewrite.savedmodel.split_timing import DEFAULT_THREADS, ONE_THREAD
    result = convert_saved_model(mlp, tmp_path / "auto", "bfloat16", split="auto")
    [line] = set(result.split)
    # Both settings' times in the line: the child process loaded the staged copies and timed them.
    assert f"with {DEFAULT_THREADS}: batch 8: whole" in line and f"with {ONE_THREAD}: batch 8: whole" in line, line
    assert "not timed" not in line
