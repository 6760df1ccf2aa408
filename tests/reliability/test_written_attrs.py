"""No attr without a value in any graph we write (issue 28): the rewritten SavedModel is checked before the first
byte of the output is written (savedmodel/source_check.check_written_attrs), the same check `check_source` makes of
a source. TensorFlow loads a graph with an empty AttrValue and fails only when it is called ("Failed to bind all
placeholders in <Unknown AttrValue type>"); reading an absent attr with `node.attr[key]` inserts one.

The fault is made for real after the rewrite: the strategy's Rewritten proto gets an attr emptied before the
orchestrator writes it, in place, frozen, and frozen with the weights kept as variables. --no-run-check shows the
refusal is this check's, not the run check's.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite import convert_saved_model
from mp_rewrite.commands import cli
from mp_rewrite.errors import GraphError
from mp_rewrite.model.files import read_saved_model
from mp_rewrite.savedmodel import convert
from users import entries, one_line_error, tree_hash

STRATEGIES = {"in-place": [], "frozen": ["--freeze"], "frozen variables": ["--freeze", "--freeze-weights", "variables"]}


def _empty_one_attr(rewritten, where: str) -> str:
    """Clear the dtype attr 'T' of the first node that has one, in a function body or the main graph; its name."""
    graph = rewritten.saved_model.meta_graphs[0].graph_def
    bodies = [graph.node] if where == "main" else [f.node_def for f in graph.library.function]
    for body in bodies:
        for node in body:
            for key in ("T", "dtype"):
                if key in node.attr:
                    node.attr[key].Clear()
                    return node.name
    raise AssertionError(f"no node with a dtype attr in the {where} graph: the fault would not be made")


@pytest.fixture
def emptied(monkeypatch):
    """Make both strategies hand back their rewrite with one attr emptied; returns {"where": ..., "node": ...}."""
    made = {"where": "function"}

    def faulty(strategy):
        def rewrite(*args, **kwargs):
            rewritten = strategy(*args, **kwargs)
            made["node"] = _empty_one_attr(rewritten, made["where"])
            return rewritten
        return rewrite
    monkeypatch.setattr(convert, "rewrite_in_place", faulty(convert.rewrite_in_place))
    monkeypatch.setattr(convert, "freeze_saved_model", faulty(convert.freeze_saved_model))
    return made


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_emptied_attr_is_refused_before_writing(source, tmp_path, capsys, emptied, strategy):
    before = tree_hash(source)
    args = ["convert", str(source), str(tmp_path / "out"), "--precision", "bfloat16", *STRATEGIES[strategy]]
    assert cli.main(args + ["--no-run-check"]) == 2  # the run check would catch it later: this check comes first
    line = one_line_error(capsys.readouterr().err, "internal error: node ")
    assert f"{emptied['node']!r}" in line and "has no value after the rewrite (our bug" in line, line
    assert "nothing was written" in line
    assert entries(tmp_path) == [] and tree_hash(source) == before


def test_the_main_graph_is_checked_too(source, tmp_path, capsys, emptied):
    emptied["where"] = "main"
    assert cli.main(["convert", str(source), str(tmp_path / "out"), "--precision", "bfloat16"]) == 2
    line = one_line_error(capsys.readouterr().err, "of the main graph")
    assert "internal error" in line and f"{emptied['node']!r}" in line, line
    assert entries(tmp_path) == []


def test_the_api_raises_graph_error(source, tmp_path, emptied):
    with pytest.raises(GraphError, match="internal error: .* has no value after the rewrite"):
        convert_saved_model(source, tmp_path / "out", "bfloat16")
    assert entries(tmp_path) == []


def test_a_clean_conversion_passes_the_check(source, tmp_path):
    result = convert_saved_model(source, tmp_path / "out", "bfloat16")
    assert result.ran == ("serving_default",) and (tmp_path / "out" / "saved_model.pb").is_file()


class SequenceParser(tf.Module):
    """ParseSequenceExampleV2 in a function body: its default-valued count and type-list attrs (Ncontext_sparse,
    context_sparse_types, ...) are left out of the SavedModel, and the pass must read their defaults without
    adding them to the node (it once did, writing empty AttrValues into the output)."""

    def __init__(self):
        self.w = tf.Variable(tf.ones([4, 4]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def __call__(self, examples):
        context, _, _ = tf.io.parse_sequence_example(
            examples, context_features={"x": tf.io.FixedLenFeature([4], tf.float32)})
        return {"y": tf.matmul(context["x"], self.w)}


def test_absent_default_attrs_are_read_not_added(tmp_path):
    source, out = tmp_path / "parser", tmp_path / "out"
    module = SequenceParser()
    tf.saved_model.save(module, str(source), signatures=module.__call__)
    parse = [n for f in read_saved_model(source).meta_graphs[0].graph_def.library.function for n in f.node_def
             if n.op == "ParseSequenceExampleV2"]
    assert parse and "Ncontext_sparse" not in parse[0].attr  # the case this test is about
    before = tree_hash(source)
    convert_saved_model(source, out, "bfloat16", assign="lists", force_low=["*MatMul*"])
    assert tree_hash(source) == before
    written = [n for f in read_saved_model(out).meta_graphs[0].graph_def.library.function for n in f.node_def]
    assert not [(n.name, k) for n in written for k, v in n.attr.items() if v.WhichOneof("value") is None]
    assert any(n.op == "MatMul" and n.attr["T"].type == tf.bfloat16.as_datatype_enum for n in written)
    example = tf.train.SequenceExample()
    example.context.feature["x"].float_list.value.extend([1, 2, 3, 4])
    loaded = tf.saved_model.load(str(out))
    y = loaded.signatures["serving_default"](examples=tf.constant([example.SerializeToString()]))["y"]
    np.testing.assert_allclose(y.numpy(), [[10, 10, 10, 10]])
