"""No unmeasured quantity shown as zero (issue 39, item 4): a node the timed runs gave no time of its own, and a
node with no casts, say so in their reasons, never "bfloat16 0.0 us vs float32 0.0 us; casts 0.0 us"."""

import mp_rewrite
from chains import chain
from mp_rewrite.core.assignment import CostTable
from mp_rewrite.report.explanation import Explainer


def test_a_node_of_no_time_in_either_run_is_not_measured_and_no_casts_is_said():
    graph_def, fetches, _ = chain("MatMul", "Relu", "MatMul")
    times = {"n0": (2.0, 0.5), "n1": (0.0, 0.0), "n2": (2.0, 0.5)}  # n1 ran fused into n0's kernel
    table = CostTable("bfloat16", {"graph": times}, {"graph": {(n.name, 0): (0.0, 0.0) for n in graph_def.node}})
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=table)
    details = {name: result.coloring[name, "T"].reason.detail for name in ("n0", "n1")}
    assert "0.0 us" not in " ".join(details.values()), details
    assert details["n1"].startswith("no time of its own") and "; no casts" in details["n1"], details
    assert details["n0"].startswith("bfloat16 0.500 ms vs float32 2.000 ms"), details


class _Row:
    graph, name, cast, node_class, decisions = "graph", "relu", None, "allow", ()


def test_explain_says_not_measured_where_a_node_has_no_time():
    explainer = Explainer([], "bfloat16", {"graph": {"relu": (0.0, 0.0)}})
    assert explainer.time_hint(_Row()) == [
        "time: not measured (no kernel of its own ran in the timed runs: fused into another, or folded)"]
    explainer = Explainer([], "bfloat16", {"graph": {"relu": (1.42, 0.78)}})
    assert explainer.time_hint(_Row()) == ["time: bfloat16 0.780 ms vs float32 1.420 ms per call (it computes in "
                                           "bfloat16)"]


def test_inspect_says_it_wrote_the_page(small_cnn, tmp_path, capsys):
    from mp_rewrite.commands import cli
    page = tmp_path / "cnn.html"
    assert cli.main(["inspect", str(small_cnn), "--precision", "bfloat16", "--format", "html", "-o", str(page)]) == 0
    out = capsys.readouterr().out
    assert page.is_file() and f"wrote {page} (" in out and " KB)" in out, out
