"""Batch 1 on both cores (issue 40): one sample's token rows in 2 branches. The plan (analysis/token_rows.py)
splits a Transformer's row-wise ops and gathers attention's keys and values, or refuses a model with nothing worth
splitting, naming the node; the split graph (savedmodel/row_split.py) equals the whole frozen graph bit for bit in
float32, with an attention mask too; `convert --freeze --split 2` calls it at batch 1 and says so. A ViT makes its
tokens from the image inside the graph: they are cut where they are made."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.analysis.grappler import FOLDING, optimize_graph  # noqa: E402
from mp_rewrite.analysis.shapes import node_shapes  # noqa: E402
from mp_rewrite.analysis.token_rows import WORK, row_plan, token_rows  # noqa: E402
from mp_rewrite.commands import cli  # noqa: E402
from mp_rewrite.savedmodel.batch_split import ROW_ULPS, SHAPE_OTHER, within_round_off  # noqa: E402
from mp_rewrite.savedmodel.split_verdict import row_verdict  # noqa: E402
from mp_rewrite.savedmodel.split_timing import DEFAULT_THREADS, ONE_THREAD  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.frozen_signature import freeze_signature  # noqa: E402
from mp_rewrite.savedmodel.row_choice import RowChoice, joined  # noqa: E402
from mp_rewrite.savedmodel.row_split import routed_rows, split_rows  # noqa: E402
from mp_rewrite.savedmodel.split_option import SERVE  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402
from split_times import in_rounds  # noqa: E402

TOKENS = 16


def _vit() -> keras.Model:
    """keras-hub's ViT, tiny: a 32x32 image in 16 patches and a class token, 17 tokens made inside the graph."""
    import keras_hub
    return keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2,
                                        hidden_dim=16, mlp_dim=32)


def _flattened_tokens() -> keras.Model:
    """Its first op mixes the tokens: a Dense over all of them at once."""
    tokens = keras.Input((TOKENS, 8), name="tokens")
    return keras.Model(tokens, keras.layers.Dense(4)(keras.layers.Flatten()(tokens)))


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """{name: the float32 frozen signature folded as --freeze folds it}."""
    keras.utils.set_random_seed(0)
    made = {"transformer": example_models.token_transformer(layers=2, d_model=32, heads=2, ff=64),
            "masked": example_models.masked_transformer(), "cnn": example_models.cnn_bn(), "flat": _flattened_tokens(),
            "unknown_length": example_models.masked_transformer(None), "vit": _vit()}
    found = {}
    for name, model in made.items():
        path = tmp_path_factory.mktemp(name) / "model"
        model.export(str(path), verbose=False)
        signature = freeze_signature(tf.saved_model.load(str(path)), "serving_default")
        signature.graph_def = optimize_graph(signature.graph_def, signature.fetches, FOLDING)
        found[name] = signature
    return found


def _plan(signature, parts: int = 2):
    graph_def = signature.graph_def
    return token_rows(graph_def, [n for _, n in signature.inputs], list(signature.outputs.values()),
                      node_shapes(graph_def, batch=1, others=SHAPE_OTHER), parts)


def _run(graph_def, signature, outputs, feeds):
    names = [n for _, n in signature.inputs]
    run = tf.function(lambda *args: tf.graph_util.import_graph_def(
        graph_def, input_map=dict(zip(names, args)), return_elements=outputs, name="g"))
    return [t.numpy() for t in run(*feeds)]


def _feeds(signature, seed=0, batch=1, length=TOKENS):
    rng = np.random.default_rng(seed)
    feeds = []
    for spec, _ in signature.inputs:
        shape = [batch, *(length if d is None else d for d in spec.shape.as_list()[1:])]
        value = rng.integers(0, 2 if spec.name == "mask" else 100, shape) if spec.dtype.is_integer else \
            rng.normal(size=shape)
        feeds.append(tf.constant(value, dtype=spec.dtype))
    return feeds


def _run_one(graph_def, source: str, output: str, x):
    """`output` of `graph_def` fed `x` at `source`."""
    return tf.function(lambda v: tf.graph_util.import_graph_def(
        graph_def, input_map={source: v}, return_elements=[output], name="g")[0])(x).numpy()


def _whole_and_split(signature, parts: int = 2):
    plan = _plan(signature, parts)
    assert plan.splittable, plan.reason
    graph, fetched = split_rows(signature.graph_def, plan)
    outputs = list(signature.outputs.values())
    feeds = _feeds(signature)
    return plan, graph, _run(signature.graph_def, signature, outputs, feeds), \
        _run(graph, signature, [fetched[o] for o in outputs], feeds)


@pytest.mark.parametrize("parts", [2, 3])
def test_slices_of_token_rows_compute_the_whole_transformer_bit_for_bit(frozen, parts):
    plan, graph, whole, split = _whole_and_split(frozen["transformer"], parts)
    for want, got in zip(whole, split):
        if parts == 2:  # 64 rows a slice: the kernels sum in the whole graph's order
            np.testing.assert_array_equal(got, want)
        else:  # 43 rows: a matmul's remainder rows may sum in another order (1 ulp); the product splits in 2
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Only the pooling needs every row; attention reads its keys and values whole: one exchange per layer.
    assert {op for _, op, _ in plan.fed_whole} == {"Mean"}, plan.fed_whole
    assert sum(n.op == "ConcatV2" and "/rows_whole" in n.name for n in graph.node) == 2 * 2 + 1
    # Every matmul but the logits' (on the pooled row) runs once per slice.
    assert plan.split_work == sum(n.op in WORK for n in frozen["transformer"].graph_def.node) - 1


def test_tokens_made_inside_the_graph_are_cut_where_they_are_made(frozen):
    """A ViT's input is an image, with no token axis: the rows cut are the first tensor of [1, 17, 16] that splits
    every matmul (the patches and the class token concatenated); the patch embedding runs once, whole."""
    signature = frozen["vit"]
    plan, graph, whole, split = _whole_and_split(signature)
    assert plan.source == signature.inputs[0][1] and plan.input != plan.source, (plan.source, plan.input)
    nodes = {n.name: n for n in signature.graph_def.node}
    assert nodes[plan.input.split(":")[0]].op == "ConcatV2"
    assert plan.split_work == sum(n.op in WORK for n in signature.graph_def.node) and not plan.fed_whole
    assert not any(n.op == "Conv2D" and "/row" in n.name for n in graph.node)  # the patches are made once
    for want, got in zip(whole, split):  # 9 and 8 rows: a matmul's remainder rows may sum in another order
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_grapplers_layer_norm_spelling_splits_on_the_rows():
    """Grappler's arithmetic optimizer spells a LayerNorm's Mul by a broadcast as a Tile and its sums as an AddN
    (the frozen ViT's, as `--freeze` writes it): both are row-wise, and before these rules every matmul after them
    read gathered rows (6 of ViT-Tiny's 96 split)."""
    rng = np.random.default_rng(2)
    w = tf.constant(rng.normal(size=[8, 8]).astype(np.float32))

    def spelled(x):
        mean = tf.tile(tf.reduce_mean(x, -1, keepdims=True), [1, 1, 8])
        return tf.matmul(tf.math.add_n([x, -mean, tf.matmul(x, w)]), w)
    plan, graph_def = _split_traced(spelled, rng)
    assert {"Tile", "AddN"} <= {n.op for n in graph_def.node} and plan.split_work == 2
    # A Tile that repeats the tokens is not row-wise on the input's rows; its output, made inside, is cut instead.
    tiled = tf.function(lambda x: tf.matmul(tf.tile(x, [1, 2, 1]), w)).get_concrete_function(
        tf.TensorSpec([None, TOKENS, 8], tf.float32))
    graph_def = tiled.graph.as_graph_def()
    shapes = node_shapes(graph_def, batch=1)
    source, output = tiled.inputs[0].name, tiled.outputs[0].name
    refused = row_plan(graph_def, source, 1, [output], shapes)
    assert not refused.splittable and "(op Tile) needs every token row (tiles the split axis)" in refused.reason
    plan = token_rows(graph_def, [source], [output], shapes)
    assert plan.splittable and plan.input.startswith("Tile") and plan.source == source, plan


def test_a_reshape_target_made_per_slice_that_names_every_token_is_fed_whole():
    """SegFormer's attention, traced in place, reshapes to [batch, 256, 1, 16] with the batch read from the rows'
    shape and 256 a constant: the target is computed per slice, yet names every token. It was split (each slice
    asked for 256 rows: the check failed at run time); it is fed whole."""
    rng = np.random.default_rng(3)
    w = tf.constant(rng.normal(size=[8, 8]).astype(np.float32))

    def attention_like(x):
        y = tf.matmul(x, w)
        return tf.matmul(tf.reshape(tf.reshape(y, tf.stack([tf.shape(y)[0], TOKENS, 2, 4])), tf.shape(y)), w)
    concrete = tf.function(attention_like).get_concrete_function(tf.TensorSpec([None, TOKENS, 8], tf.float32))
    graph_def = concrete.graph.as_graph_def()
    source, output = concrete.inputs[0].name, concrete.outputs[0].name
    plan = token_rows(graph_def, [source], [output], node_shapes(graph_def, batch=1))
    assert any(op == "Reshape" and why == "its target, made per slice, names the whole token count"
               for _, op, why in plan.fed_whole), plan.fed_whole
    graph, fetched = split_rows(graph_def, plan)
    x = tf.constant(rng.normal(size=[1, TOKENS, 8]).astype(np.float32))
    np.testing.assert_array_equal(_run_one(graph, source, fetched[output], x),
                                  _run_one(graph_def, source, output, x))


def test_a_tf_keras_bodys_control_inputs_on_split_nodes_wait_for_every_copy(tmp_path):
    """tf_keras writes its call's output through a node with a control input on the embedding lookup, which the
    plan splits: that control input names no node of the split graph unless it waits for the copies (it did not:
    frozen, `--split` checked the routed graph, found its output empty at batch 1 and ran batch 1 whole)."""
    example_models.save_tf_keras_transformer(str(tmp_path / "model"), length=TOKENS)
    signature = freeze_signature(tf.saved_model.load(str(tmp_path / "model")), "serving_default")
    signature.graph_def = optimize_graph(signature.graph_def, signature.fetches, FOLDING)
    plan, graph, whole, split = _whole_and_split(signature)
    for want, got in zip(whole, split):
        np.testing.assert_array_equal(got, want)
    waiting = [n for n in graph.node if any(t.startswith("^") and t.endswith("/row1") for t in n.input)]
    assert waiting and all(any(t.startswith("^") and t.endswith("/row0") for t in n.input) for n in waiting)


def test_an_attention_mask_on_the_query_rows_is_sliced_with_them(frozen):
    plan, _, whole, split = _whole_and_split(frozen["masked"])
    for want, got in zip(whole, split):
        np.testing.assert_array_equal(got, want)
    assert plan.input.startswith("tokens")  # the input whose rows carry the work
    assert plan.slices, "the mask's query rows are cut like the tokens', not gathered"
    assert {op for _, op, _ in plan.fed_whole} == {"Mean"}, plan.fed_whole


def test_the_routed_graph_runs_the_rows_at_batch_one_and_the_whole_graph_otherwise_sharing_weights(frozen):
    signature = frozen["masked"]
    graph, fetched = routed_rows(signature.graph_def, _plan(signature))
    outputs = list(signature.outputs.values())
    for batch in (1, 3):
        feeds = _feeds(signature, seed=batch, batch=batch)
        for want, got in zip(_run(signature.graph_def, signature, outputs, feeds),
                             _run(graph, signature, [fetched[o] for o in outputs], feeds)):
            np.testing.assert_array_equal(got, want)

    def weights(graph_def):
        return sum(n.attr["value"].tensor.ByteSize() for n in graph_def.node if n.op == "Const")
    assert weights(graph) < 1.05 * weights(signature.graph_def)  # the row split's constants are the slices' bounds
    assert sum(n.op == "Switch" for n in graph.node) == 1 and sum(n.op == "Merge" for n in graph.node) == 1


def test_a_length_left_unknown_is_cut_where_the_rows_are_at_run_time(frozen):
    """keras-hub exports the sequence length unknown: the plan is made at a stand-in length and holds at every
    one -- no shape of it is a constant --, the slices are cut at i * length // 2 of the length the call has, and
    the routed graph sends a sample to the rows only from 4 tokens (2 per slice), or from `least`."""
    signature = frozen["unknown_length"]
    plan = _plan(signature)
    assert plan.splittable and plan.unknown_length and not plan.constants, plan.reason or plan.constants
    assert {op for _, op, _ in plan.fed_whole} <= {"Mean"}, plan.fed_whole
    split, fetched = split_rows(signature.graph_def, plan)
    routed, merged = routed_rows(signature.graph_def, plan, least=6)
    outputs = list(signature.outputs.values())
    for length in (4, 9, 16, 31):  # even, odd (uneven slices), and neither the stand-in nor the made-up length
        feeds = _feeds(signature, seed=length, length=length)
        want = _run(signature.graph_def, signature, outputs, feeds)
        for got in (_run(split, signature, [fetched[o] for o in outputs], feeds),
                    _run(routed, signature, [merged[o] for o in outputs], feeds)):
            for w, g in zip(want, got):
                if length % 4:  # odd halves: a matmul's remainder rows may sum in another order (1 ulp)
                    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
                else:
                    np.testing.assert_array_equal(g, w)
    # Below `least` tokens (and at batch 2) the Switch sends the sample to the whole graph: its predicate.
    switch = next(n for n in routed.node if n.op == "Switch")
    run = tf.function(lambda *args: tf.graph_util.import_graph_def(
        routed, input_map=dict(zip([n for _, n in signature.inputs], args)),
        return_elements=[switch.input[1] + ":0"], name="g")[0])
    for batch, length, rows in ((1, 5, False), (1, 6, True), (2, 16, False)):
        assert run(*_feeds(signature, batch=batch, length=length)).numpy() == rows, (batch, length)


def test_the_routed_graph_names_its_nodes_apart_from_the_models_own(frozen):
    """keras-hub's BERT, frozen, holds nodes named '<matmul>/rows' of its own: the row split's copies take other
    names (it failed to import: 'Node ... is not unique')."""
    import copy
    from tensorflow.core.framework import node_def_pb2
    signature = copy.copy(frozen["masked"])
    signature.graph_def = copy.deepcopy(signature.graph_def)
    for node in list(signature.graph_def.node):
        for suffix in ("/rows", "/row0", "/row1", "/rows_whole"):  # the names the split would give its copies
            taken = node_def_pb2.NodeDef(name=node.name + suffix, op="Const")
            taken.attr["dtype"].type = tf.float32.as_datatype_enum
            taken.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0.0))
            signature.graph_def.node.append(taken)
    graph, fetched = routed_rows(signature.graph_def, _plan(signature))
    names = [n.name for n in graph.node]
    assert len(names) == len(set(names))
    outputs = list(signature.outputs.values())
    feeds = _feeds(signature)
    for want, got in zip(_run(signature.graph_def, signature, outputs, feeds),
                         _run(graph, signature, [fetched[o] for o in outputs], feeds)):
        np.testing.assert_array_equal(got, want)


def _split_traced(attention, rng):
    """(the plan, the traced graph) of `attention` (or any function) on [batch, TOKENS, 8], after checking that the
    plan splits every op (the softmax runs per slice, nothing is fed whole) and that the split equals the graph bit
    for bit."""
    concrete = tf.function(attention).get_concrete_function(tf.TensorSpec([None, TOKENS, 8], tf.float32))
    graph_def = concrete.graph.as_graph_def()
    source, output = concrete.inputs[0].name, concrete.outputs[0].name
    plan = token_rows(graph_def, [source], [output], node_shapes(graph_def, batch=1))
    assert plan.splittable and not plan.fed_whole, plan.reason or plan.fed_whole
    graph, fetched = split_rows(graph_def, plan)
    x = tf.constant(rng.normal(size=[1, TOKENS, 8]).astype(np.float32))
    np.testing.assert_array_equal(_run_one(graph, source, fetched[output], x),
                                  _run_one(graph_def, source, output, x))
    return plan, graph_def


def test_attention_spelled_keys_by_transposed_queries_splits_the_queries():
    rng = np.random.default_rng(0)
    wq, wk = (tf.constant(rng.normal(size=[8, 8]).astype(np.float32)) for _ in range(2))

    def attention(x):  # scores as keys @ queries^T, transposed back (keras-hub's GPT-2 spells it so)
        q, k = tf.matmul(x, wq), tf.matmul(x, wk)
        scores = tf.transpose(tf.matmul(k, tf.transpose(q, [0, 2, 1])), [0, 2, 1])
        return tf.matmul(tf.nn.softmax(scores), k)
    _split_traced(attention, rng)


def test_attention_on_adjoint_operands_splits_the_query_rows():
    """keras-hub BERT's scores, as TensorFlow spells its einsum: BatchMatMulV2(queries^T, keys, adj_x, adj_y).
    Before the adjoint rule its attention ran whole on gathered queries (8 of its 32 matmuls fed every row)."""
    rng = np.random.default_rng(1)
    wq, wk, wv = (tf.constant(rng.normal(size=[8, 8]).astype(np.float32)) for _ in range(3))

    def attention(x):
        q, k, v = tf.matmul(x, wq), tf.matmul(x, wk), tf.matmul(x, wv)
        scores = tf.linalg.matmul(tf.transpose(q, [0, 2, 1]), k, adjoint_a=True, adjoint_b=True)  # [b, Tq, Tk]
        return tf.matmul(tf.nn.softmax(scores), v)
    plan, graph_def = _split_traced(attention, rng)
    assert any(n.op == "BatchMatMulV2" and n.attr["adj_x"].b and n.attr["adj_y"].b for n in graph_def.node)
    assert plan.split_work == sum(n.op in WORK for n in graph_def.node)  # the scores and the weighted sum too


@pytest.mark.parametrize("name, node", [("cnn", "Conv2D"), ("flat", "Reshape")])
def test_a_model_with_nothing_to_split_on_its_rows_is_refused_naming_the_node(frozen, name, node):
    plan = _plan(frozen[name])
    assert not plan.splittable
    assert "nothing worth splitting" in plan.reason and f"(op {node})" in plan.reason, plan.reason


def test_batch_one_keeps_the_row_split_only_where_faster_beyond_the_noise_and_says_so():
    faster = row_verdict(in_rounds({ONE_THREAD: {(1, 1): 3.3, (1, 2): 2.4},
                                    DEFAULT_THREADS: {(1, 1): 5.1, (1, 2): 5.0}}))
    assert faster.rows == 2 and "2.40 ms against whole 3.30 ms" in faster.why and "5.00 ms against" in faster.why
    tie = row_verdict(in_rounds({DEFAULT_THREADS: {(1, 1): 3.3, (1, 2): 3.25}}), f"{ONE_THREAD} not timed: a reason")
    assert tie.rows == 1 and "TF_NUM_INTRAOP_THREADS=1" in tie.why and "not timed: a reason" in tie.why
    # BERT's rows (docs/batch_split.md): level with one thread, 1.09x slower with the default ones: whole.
    slower = row_verdict(in_rounds({ONE_THREAD: {(1, 1): 3.7, (1, 2): 3.0},
                                    DEFAULT_THREADS: {(1, 1): 6.6, (1, 2): 7.1}}))
    assert slower.rows == 1 and f"faster with {ONE_THREAD} but slower with {DEFAULT_THREADS}" in slower.why
    # The batch not split, its rows split: the line opens with what splits.
    line = joined("not split: no split measured faster here (...)", 1, faster)
    assert line.startswith("batch 1: token rows in 2 branches") and "larger batches run whole" in line
    assert "TF_NUM_INTRAOP_THREADS=1" in line
    line = joined(f"split in 2 branches, as asked; {SERVE}", 2, RowChoice(1, "runs whole: refused"))
    assert line == f"split in 2 branches, as asked; batch 1 runs whole: refused; {SERVE}"


def test_convert_freeze_split_runs_batch_one_in_token_rows_equal_to_the_whole(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    source = tmp_path / "fp32"
    example_models.token_transformer(layers=1, d_model=32, heads=2, ff=64).export(str(source), verbose=False)
    result = convert_saved_model(source, tmp_path / "split", "bfloat16", freeze=True, split=2)
    line = next(note for note in result.notes if "token rows" in note)
    assert "batch 1: token rows in 2 branches" in line and "TF_NUM_INTRAOP_THREADS=1" in line
    convert_saved_model(source, tmp_path / "whole", "bfloat16", freeze=True)
    split = tf.saved_model.load(str(tmp_path / "split")).signatures["serving_default"]
    whole = tf.saved_model.load(str(tmp_path / "whole")).signatures["serving_default"]
    graph = split.graph.as_graph_def()
    assert any(n.name.endswith("/row1") for f in graph.library.function for n in f.node_def)
    # One graph routes batch 1 to the rows (a Switch on the batch): the weights are stored once.
    assert any(n.op == "Switch" for f in graph.library.function for n in f.node_def)
    size = {name: (tmp_path / name / "saved_model.pb").stat().st_size for name in ("split", "whole")}
    assert size["split"] < 1.2 * size["whole"], size
    assert cli.main(["inspect", str(tmp_path / "split"), "--precision", "bfloat16"]) == 0
    assert "run batch 1 as its token rows in 2 concurrent branches" in capsys.readouterr().err
    rng = np.random.default_rng(1)
    for batch in (1, 3):
        tokens = tf.constant(rng.integers(0, 8000, [batch, 128]), tf.int32)
        want, got = whole(tokens=tokens), split(tokens=tokens)
        for key in want:
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())


class _PastItsTable(tf.Module):
    """Ids that index past the table whatever they are (each offset by 1000): no made-up input runs it."""

    def __init__(self):
        super().__init__()
        self.table = tf.Variable(np.random.default_rng(0).normal(size=(100, 8)).astype("float32"))
        self.weight = tf.Variable(np.random.default_rng(1).normal(size=(8, 8)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.int32, name="tokens")], autograph=False)
    def serve(self, tokens):
        return {"out": tf.einsum("btc,cd->btd", tf.gather(self.table, tokens + 1000), self.weight)}


def test_convert_freeze_split_runs_batch_one_of_an_unknown_length_in_token_rows(tmp_path):
    """A keras-hub-like export (length unknown) runs batch 1 in token rows from 4 tokens, equal to --freeze's
    whole graph within round-off at any length, a vocabulary of 100 too (the check's made-up ids, drawn below 1000,
    learn the table's 100 rows from TF's error, as the run check's do); a model no made-up input runs (past the run
    check, with --no-run-check) is written whole, frozen or in place, and the line says why."""
    keras.utils.set_random_seed(0)
    for name, vocabulary in (("small", 100), ("large", 1000)):
        example_models.masked_transformer(None, vocabulary).export(str(tmp_path / name), verbose=False)
    module = _PastItsTable()
    tf.saved_model.save(module, str(tmp_path / "past"), signatures={"serving_default": module.serve})
    for freeze in (True, False):
        result = convert_saved_model(tmp_path / "past", tmp_path / f"past_{freeze}", "bfloat16", freeze=freeze,
                                     split=2, run_check=False)
        line = next(note for note in result.notes if "branches" in note or "not split" in note)
        assert "not split: the split's check runs the model on made-up inputs, and the model failed on them" in line
        assert "is not in [0, 100)" in line, line
    result = convert_saved_model(tmp_path / "small", tmp_path / "small_split", "bfloat16", freeze=True, split=2)
    line = next(note for note in result.notes if "token rows" in note)
    assert "batch 1: token rows in 2 branches (an unknown length: samples of 4 tokens or more)" in line, line
    result = convert_saved_model(tmp_path / "large", tmp_path / "split", "bfloat16", freeze=True, split=2)
    line = next(note for note in result.notes if "token rows" in note)
    assert "batch 1: token rows in 2 branches (an unknown length: samples of 4 tokens or more)" in line, line
    convert_saved_model(tmp_path / "large", tmp_path / "whole", "bfloat16", freeze=True)
    split = tf.saved_model.load(str(tmp_path / "split")).signatures["serving_default"]
    whole = tf.saved_model.load(str(tmp_path / "whole")).signatures["serving_default"]
    rng = np.random.default_rng(2)
    for length in (3, 9, 24):
        feeds = {"tokens": tf.constant(rng.integers(0, 1000, [1, length]), tf.int32),
                 "mask": tf.constant(rng.integers(0, 2, [1, length]), tf.int32)}
        want, got = whole(**feeds), split(**feeds)
        for key in want:
            assert got[key].shape == want[key].shape
            np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-2, atol=1e-2)


def test_a_rotary_position_model_runs_its_rows_at_batch_one(tmp_path):
    """keras-hub's Llama 3 (its kind: Mistral, Phi-3, Qwen 3, SmolLM 3), frozen: Grappler folds a constant that
    keeps a control input from a node of the token rows, written later in the GraphDef. The routed graph shared it
    with the whole graph, dead at batch 1, and so every row was: the output came out empty, (0,)."""
    import keras_hub
    keras.utils.set_random_seed(0)
    keras_hub.models.Llama3Backbone(vocabulary_size=100, num_layers=1, num_query_heads=4, num_key_value_heads=2,
                                    hidden_dim=32, intermediate_dim=64).export(str(tmp_path), verbose=False)
    signature = freeze_signature(tf.saved_model.load(str(tmp_path)), "serving_default")
    signature.graph_def = optimize_graph(signature.graph_def, signature.fetches, FOLDING)
    plan = _plan(signature)
    assert plan.splittable and plan.unknown_length, plan.reason
    graph, fetched = routed_rows(signature.graph_def, plan)
    outputs = list(signature.outputs.values())
    for batch, length in ((1, 8), (1, 13), (2, 8)):
        feeds = _feeds(signature, seed=length, batch=batch, length=length)
        for want, got in zip(_run(signature.graph_def, signature, outputs, feeds),
                             _run(graph, signature, [fetched[o] for o in outputs], feeds)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_batch_one_rows_are_checked_only_at_lengths_the_model_accepts(tmp_path):
    """--seq-len at a keras-hub BERT's longest sequence: the check's second length, of the other parity, is one
    below, not one past the positions it has (the model itself fails there: the split was refused as our bug)."""
    import keras_hub
    keras.utils.set_random_seed(0)
    keras_hub.models.BertBackbone(vocabulary_size=1000, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
                                  max_sequence_length=16).export(str(tmp_path / "bert"), verbose=False)
    result = convert_saved_model(tmp_path / "bert", tmp_path / "split", "bfloat16", freeze=True, split=2)
    line = next(note for note in result.notes if "branches" in note or "not split" in note)
    assert "batch 1: token rows in 2 branches (an unknown length: samples of 4 tokens or more)" in line, line


def test_low_precision_rows_agree_with_the_whole_but_for_round_off_by_norm_not_value_by_value():
    """A 4-layer keras-hub Llama in bfloat16 at 127 tokens: its rows' output had 125 of 32,512 values 2 bfloat16
    units from the whole graph's (0.03 at 2: past a 1e-2 bound value by value), 0.4% by norm; the whole graph is
    1.0% from float32. A small output is held value by value; float32 to ROW_ULPS units in its last place. A
    wrong row, or a NaN moved, is refused."""
    rng = np.random.default_rng(0)
    whole = tf.cast(tf.constant(rng.normal(0, 1, [1, 127, 256])), tf.bfloat16).numpy().astype(np.float64)
    rounded = whole.copy().reshape(-1)
    moved = rng.choice(rounded.size, 125, replace=False)
    rounded[moved] += 2 * np.sign(rounded[moved]) * 2.0 ** (np.floor(np.log2(np.abs(rounded[moved]))) - 7)
    rounded = rounded.reshape(whole.shape)
    assert not np.allclose(rounded, whole, rtol=1e-2, atol=1e-2)  # what the value-by-value check refused
    assert within_round_off(whole, rounded)
    wrong = whole.copy()
    wrong[0, 5] = whole[0, 6]  # one row of 127 another's
    assert not within_round_off(whole, wrong)
    nan = whole.copy()
    nan[0, 0, 0] = np.nan
    assert not within_round_off(nan, rounded)
    pooled = np.array([0.05, -0.04, 0.06, 0.03])  # a small output (a pooled head): value by value, 0.001 apart
    assert within_round_off(pooled, pooled + 0.001) and not within_round_off(pooled, pooled + 0.03)
    # float32 (keras-hub's CLIP text encoder at 15 tokens: 4.8 units of its largest value apart, 3.6 by norm)
    unit, tolerance = float(np.finfo(np.float32).eps), ROW_ULPS * float(np.finfo(np.float32).eps)
    exact = rng.normal(0, 1, [1, 15, 128]).astype(np.float32).astype(np.float64)
    summed = exact + (rng.random(exact.shape) < 0.05) * rng.choice([-5, 5], exact.shape) * unit * np.abs(exact).max()
    assert within_round_off(exact, summed, tolerance)
    wrong = exact.copy()
    wrong[0, 3] = exact[0, 4]
    assert not within_round_off(exact, wrong, tolerance)
