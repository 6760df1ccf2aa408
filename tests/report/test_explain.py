"""`explain`: the final color of a node, the chain of reasons that decided it, near misses, and name lookup."""

from __future__ import annotations

import pytest
from chains import chain

import mp_rewrite.testing.examples as ex
from mp_rewrite import rewrite_graph_def
from mp_rewrite.errors import GraphError, OptionError
from mp_rewrite.report import explain, explain_all
from mp_rewrite.report.explanation import Explainer
from mp_rewrite.report.node_table import build_tables


@pytest.fixture(scope="module")
def exp_add_matmul():
    """Const -> Exp (deny) -> Add (infer) -> MatMul (allow) -> fetch."""
    graph_def, fetches, _ = chain("Exp", "Add", "MatMul")
    return rewrite_graph_def(graph_def, fetches=fetches)


@pytest.fixture(scope="module")
def cnn_train():
    graph = ex.EXAMPLES["cnn_bn/train"]()
    return rewrite_graph_def(graph.graph_def, fetches=graph.fetches)


def test_denied_node_names_its_deny_list_source(exp_add_matmul):
    e = explain(exp_add_matmul, "n1")
    assert e.headline() == "n1: float32 — infer op; deny propagated from n0 (Exp, deny list) via n1"
    assert e.node_class == "deny" and e.chains[0] == ["n0", "n1"]
    assert any("deny from Exp upstream: add 'n0' to --force-low or remove Exp from the deny list" in h
               for h in e.hints)


def test_allow_list_node(exp_add_matmul):
    assert explain(exp_add_matmul, "n2").headline() == "n2: float16 — allow list"
    assert explain(exp_add_matmul, "n2").hints == []


def test_deny_chain_in_a_training_graph_reaches_the_loss(cnn_train):
    tables = build_tables(cnn_train, with_flops=False)
    explainer = Explainer(tables, "float16")
    denied = [r for r in tables[0].rows.values() if r.decision and r.decision.reason.rule == "deny_propagated"]
    assert denied
    for row in denied:
        e = explainer.explain_row(row)
        source = row.decision.reason.source
        source_row = tables[0].rows[source]
        assert source_row.decision.reason.rule == "deny_list"
        assert f"deny propagated from {source} ({source_row.op}, deny list) via " in e.headline()
        assert e.chains[0][0] == source and e.chains[0][-1] == row.name


def test_every_node_of_a_training_graph_explains(cnn_train):
    tables = build_tables(cnn_train, with_flops=False)
    explainer = Explainer(tables, "float16")
    for row in tables[0].rows.values():
        e = explainer.explain_row(row)
        assert e.text().startswith(f"{row.name}: ")


def test_infer_op_near_miss_names_its_inputs():
    graph_def, fetches, _ = chain("Add", "MatMul")
    e = explain(rewrite_graph_def(graph_def, fetches=fetches), "n0")
    assert e.headline() == "n0: float32 — infer op; infer op neither between allow nodes nor directly after one"
    assert e.hints[0] == "an infer op: it would convert if it sat between two allow ops or directly after one"
    assert "its input input is float32 (untouched: in no op list)" in e.hints


def test_not_processed_on_cpu_suggests_the_device():
    graph_def, fetches, _ = chain("MatMul", "Relu", device="/device:CPU:0")
    e = explain(rewrite_graph_def(graph_def, fetches=fetches, device="gpu"), "n0")
    assert e.node_class == "allow-kept"
    assert any(h.endswith("— use --device cpu or --device any") for h in e.hints)


def test_fetched_node_keeps_its_dtype():
    graph_def, _, _ = chain("MatMul", "Relu")
    e = explain(rewrite_graph_def(graph_def, fetches=["n1"]), "n1")
    assert "not processed: fetched" in e.headline()
    assert e.hints == ["fetched: graph outputs keep their dtype (drop it from the fetches to let it convert)"]


def test_inserted_cast(exp_add_matmul):
    cast = next(c for c in exp_add_matmul.casts if c.src == "n1")
    e = explain(exp_add_matmul, cast.name)
    assert e.headline() == f"{cast.name}: inserted Cast float32 -> float16 of n1:0" and e.node_class == "cast"


def test_unknown_node_names_the_closest(cnn_train):
    with pytest.raises(GraphError, match=r"no node named 'dense_1/MatMull' .*closest: cnn_bn_1/dense_1/MatMul"):
        explain(cnn_train, "dense_1/MatMull")
    with pytest.raises(GraphError, match=r"closest: cnn_bn_1/dense_1/BiasAdd"):
        explain(cnn_train, "BiasAdd")


def test_function_bodies_are_searched():
    graph = ex.EXAMPLES["lstm_functional/inference"]()
    result = rewrite_graph_def(graph.graph_def, fetches=graph.fetches)
    body = next(name for name in result.functions if "body" in name)
    (e,) = explain_all(result, "lstm_1/lstm_1/while/lstm_cell_1/MatMul")
    assert e.graph == body and e.headline().endswith("float16 — allow list")
    assert f"function {body}" in e.text()
    assert explain(result, "lstm_1/lstm_1/while/lstm_cell_1/MatMul", function=body).graph == body
    with pytest.raises(OptionError, match="no rewritten function named 'nope'"):
        explain(result, "lstm_1/dense_1/MatMul", function="nope")
    with pytest.raises(GraphError, match=f"in function '{body}'"):
        explain(result, "lstm_1/dense_1/MatMul", function=body)
