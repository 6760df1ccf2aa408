"""Batch 1's token rows in place (issue 40): `convert --split` without --freeze adds the token-row split of the
traced function a signature's wrapper calls (savedmodel/rows_in_place.py) and routes one sample to it; the function
the pass rewrote is written as it was, both read the same variables, and the rows equal the whole call but for
round-off, at a fixed length and at one the model leaves unknown (from 4 tokens, shorter samples run whole), and
where the model makes its tokens from an image (ViT)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import node_def_pb2  # noqa: E402

from mp_rewrite.analysis.batch_row_states import folded_ints  # noqa: E402
from mp_rewrite.commands import cli  # noqa: E402
from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel.batch_split import SHAPE_OTHER, within_round_off  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.row_split import const_node  # noqa: E402
from mp_rewrite.savedmodel.rows_in_place import rows_body  # noqa: E402
from mp_rewrite.savedmodel.split_wrapper import signature_wrapper  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: (the float32 export, converted in place to bfloat16 whole, the same with --split 2, its result)}: the
    fixed-length Transformer by cost, as the command line converts by default (the graph rules then write its
    LayerNorms as FusedBatchNorms, in whichever precision the cost measures best here), the other by the lists."""
    from mp_rewrite.analysis.op_costs import this_machine
    made, by_cost = {}, {"assign": "cost", "costs": this_machine("bfloat16")}
    for name, model, assign in (
            ("fixed", lambda: example_models.token_transformer(layers=1, d_model=32, heads=2, ff=64), by_cost),
            ("unknown", lambda: example_models.masked_transformer(None, vocabulary=1000), {})):
        keras.utils.set_random_seed(0)
        root = tmp_path_factory.mktemp(name)
        model().export(str(root / "source"), verbose=False)
        convert_saved_model(root / "source", root / "whole", "bfloat16", **assign)
        result = convert_saved_model(root / "source", root / "split", "bfloat16", split=2, **assign)
        made[name] = root / "source", root / "whole", root / "split", result
    return made


def _functions(path) -> dict:
    return {f.signature.name: f for f in read_saved_model(path).meta_graphs[0].graph_def.library.function}


def _agree(want: dict, got: dict) -> None:
    for key in want:
        assert got[key].shape == want[key].shape, key
        a, b = want[key].numpy().astype(np.float64), got[key].numpy().astype(np.float64)
        assert within_round_off(a, b), (key, np.max(np.abs(a - b)))


def test_in_place_batch_one_runs_token_rows_equal_to_the_whole_call(models, capsys):
    _, whole_path, split_path, result = models["fixed"]
    line = next(note for note in result.split if "token rows" in note)
    assert "split in 2 branches, as asked; batch 1: token rows in 2 branches (proven, and equal to the whole " \
           "graph at batch 1 but for round-off); serve it with one intra-op thread" in line, line
    before, after = _functions(whole_path), _functions(split_path)
    rows = [name for name in after if "_token_rows_in_2_" in name and "one_sample" not in name]
    assert len(rows) == 1, sorted(after)
    body = after[rows[0]]
    assert any(n.name.endswith("/row1") for n in body.node_def)
    # The rules' LayerNorm (a FusedBatchNorm over the rows as channels) runs on the rows too, not whole.
    assert any(n.op == "FusedBatchNormV3" and n.name.endswith("/row1") for n in body.node_def)
    # Every function the pass rewrote is written as it was; the wrapper routes one sample with an If.
    for name, function in before.items():
        if "signature_wrapper" not in name:
            assert after[name] == function, name
    assert any(n.op == "If" and n.name == "one_sample/token_rows_in_2" for f in after.values() for n in f.node_def)
    assert cli.main(["inspect", str(split_path), "--precision", "bfloat16"]) == 0
    assert "run batch 1 as its token rows in 2 concurrent branches" in capsys.readouterr().err
    whole = tf.saved_model.load(str(whole_path)).signatures["serving_default"]
    split = tf.saved_model.load(str(split_path)).signatures["serving_default"]
    rng = np.random.default_rng(1)
    for batch in (1, 3):
        tokens = tf.constant(rng.integers(0, 8000, [batch, 128]), tf.int32)
        _agree(whole(tokens=tokens), split(tokens=tokens))


def test_in_place_rows_of_an_unknown_length_run_from_four_tokens(models):
    _, whole_path, split_path, result = models["unknown"]
    line = next(note for note in result.split if "token rows" in note)
    assert "batch 1: token rows in 2 branches (an unknown length: samples of 4 tokens or more)" in line, line
    whole = tf.saved_model.load(str(whole_path)).signatures["serving_default"]
    split = tf.saved_model.load(str(split_path)).signatures["serving_default"]
    rng = np.random.default_rng(2)
    for length in (3, 9, 24):  # 3: too short for the rows, runs whole; 9: uneven halves
        feeds = {"tokens": tf.constant(rng.integers(0, 1000, [1, length]), tf.int32),
                 "mask": tf.constant(rng.integers(0, 2, [1, length]), tf.int32)}
        _agree(whole(**feeds), split(**feeds))


def test_the_row_plan_reads_the_function_as_written_and_leaves_it_so(models):
    """The plan runs on the function the pass wrote (weights read from variables, shapes not folded), reads its
    folded constants, and inserts nothing into it (an attr read with [] would be written empty)."""
    _, whole_path, _, _ = models["fixed"]
    meta_graph = read_saved_model(whole_path).meta_graphs[0]
    before = meta_graph.SerializeToString(deterministic=True)
    wrapper, positions = signature_wrapper(meta_graph, "serving_default")
    rows, why = rows_body(meta_graph, wrapper, positions, 2, SHAPE_OTHER)
    assert rows is not None, why
    assert meta_graph.SerializeToString(deterministic=True) == before
    # No attr read with [] travels into the split function empty (its Embedding's GatherV2 left 'batch_dims' out).
    empty = [(n.name, key) for n in rows.function.node_def for key, value in n.attr.items()
             if value.WhichOneof("value") is None]
    assert not empty, empty[:3]
    assert rows.arg == positions["tokens"] and not rows.unknown_length
    assert [a.name for a in rows.function.signature.input_arg] == \
        [a.name for a in next(f for f in meta_graph.graph_def.library.function
                              if f.signature.name == rows.called).signature.input_arg]


def test_folded_ints_reads_a_concatenation_of_constants():
    nodes = [const_node("a", [0, 2]), const_node("b", [1]), const_node("axis", [0]),
             node_def_pb2.NodeDef(name="perm", op="ConcatV2", input=["a", "b", "axis:0"]),
             node_def_pb2.NodeDef(name="moved", op="ConcatV2", input=["a", "b", "b"])]
    table = {n.name: n for n in nodes}
    nodes[2].attr["value"].tensor.ClearField("tensor_shape")  # a scalar axis
    assert folded_ints(table, "perm:0") == [0, 2, 1]
    assert folded_ints(table, "moved") is None  # concatenated on axis 1: not a flat list
    assert folded_ints(table, "missing") is None


def test_the_convert_line_says_which_converted_nodes_are_the_rows_copies(models, tmp_path, capsys):
    """The line counts what the written copy holds (as inspect and demo read a model), and says which of those
    nodes the rewrite converted and which are the row split's copies of them."""
    source = models["unknown"][0]
    assert cli.main(["convert", str(source), str(tmp_path / "out"), "--precision", "bfloat16", "--assign", "lists",
                     "--split", "2"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote "))
    assert "by the rewrite, the rest their copies in batch 1's token rows)" in line, line


@pytest.mark.parametrize("freeze", [False, True], ids=["in-place", "frozen"])
def test_a_tf_keras_transformer_of_a_small_vocabulary_runs_batch_one_in_token_rows(tmp_path, freeze):
    """tf_keras' traced call reads its embedding through a ResourceGather colocated with its argument: in place,
    the shapes of its body did not import (the colocation names a node the body does not hold) and the gather had
    no row rule ("no axis 1 of static length (None)"); frozen, its output control node waited on the split lookup
    (row_split: the rows' output empty). And the split's check made ids below 1000, which a vocabulary of 100
    refuses: it learns the limit as --verify does."""
    example_models.save_tf_keras_transformer(str(tmp_path / "source"))
    result = convert_saved_model(tmp_path / "source", tmp_path / "split", "bfloat16", split=2, freeze=freeze)
    line = next(note for note in result.split if "serving_default" in note)
    assert "split in 2 branches, as asked; batch 1: token rows in 2 branches (proven" in line, line
    source = tf.saved_model.load(str(tmp_path / "source")).signatures["serving_default"]
    split = tf.saved_model.load(str(tmp_path / "split")).signatures["serving_default"]
    for batch in (1, 3):
        feed = tf.constant(np.random.default_rng(batch).integers(0, 100, (batch, 16)), tf.int32)
        want, got = source(tokens=feed), split(tokens=feed)
        for key in want:  # bfloat16 against float32: within bfloat16's tolerance
            np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=0.1, atol=0.1)


@pytest.mark.parametrize("freeze", [False, True], ids=["in-place", "frozen"])
def test_a_vit_runs_batch_one_in_the_token_rows_it_makes_from_the_image(tmp_path, freeze):
    """keras-hub's ViT takes an image: its tokens (patches and a class token) are made inside, and they are cut
    there (analysis/token_rows: "made inside"); in place the wrapper routes one sample by the image's batch (the
    plan's `source`: before, a plan cut inside had no wrapper argument). The rows equal the whole call but for
    round-off."""
    import keras_hub
    keras.utils.set_random_seed(0)
    keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=1, num_heads=2, hidden_dim=16,
                                 mlp_dim=32).export(str(tmp_path / "source"), verbose=False)
    for name, split in (("whole", "off"), ("split", 2)):
        result = convert_saved_model(tmp_path / "source", tmp_path / name, "bfloat16", split=split, freeze=freeze)
    line = next(note for note in result.split if "serving_default" in note)
    assert "split in 2 branches, as asked; batch 1: token rows in 2 branches (proven" in line, line
    whole = tf.saved_model.load(str(tmp_path / "whole")).signatures["serving_default"]
    split = tf.saved_model.load(str(tmp_path / "split")).signatures["serving_default"]
    for batch in (1, 3):
        images = tf.constant(np.random.default_rng(batch).normal(size=(batch, 32, 32, 3)), tf.float32)
        _agree(whole(images=images), split(images=images))


def test_tune_split_decides_batch_one_apart_and_writes_the_token_rows(models, tmp_path):
    """`--tune --split 2`: the batch split is raced beside the winner, then batch 1 is decided as convert decides
    it -- the winner's signatures written again with the batch as raced and one sample routed to its token rows."""
    import json

    from mp_rewrite.savedmodel.tune import TUNING_FILE, tune_saved_model
    source = models["fixed"][0]
    result = tune_saved_model(source, tmp_path / "tuned", "bfloat16", rounds=2, calls=1, split=2)
    record = json.loads((tmp_path / "tuned" / "assets" / TUNING_FILE).read_text())["split"]
    assert any("batch 1: token rows in 2 branches (proven, and equal to the whole graph at batch 1 but for "
               "round-off)" in line for line in record["rows"]), record
    line = next(note for note in result.conversion.notes if note.startswith("--split 2: "))
    assert "batch 1: token rows in 2 branches" in line and line.count("serve it with one intra-op thread") == 1, line
    assert any("_token_rows_in_2_" in name for name in _functions(tmp_path / "tuned"))
    want, got = (tf.saved_model.load(str(p)).signatures["serving_default"] for p in (source, tmp_path / "tuned"))
    [(name, spec)] = want.structured_input_signature[1].items()
    ids = tf.constant(np.random.default_rng(0).integers(0, 100, (1, spec.shape[1])), spec.dtype)
    a, b = want(**{name: ids}), got(**{name: ids})
    assert all(np.allclose(a[k].numpy(), b[k].numpy(), atol=0.1, rtol=0.05) for k in a)
