"""The time view (report/layer_times.py): each layer's time per call in float32 and as converted, read from the
cost table as plain data, summed into the stated total; drawn as SVG (--show time) and said by explain."""

from __future__ import annotations

import re

import pytest
from timed_model import CAST_MS, made_up_table, rewritten, small_cnn

from mp_rewrite.analysis.graph_costs import MAIN
from mp_rewrite.analysis.graph_profile import measured_runs
from mp_rewrite.commands.cli import main as cli_main
from mp_rewrite.core.assignment import CostTable
from mp_rewrite.report.explain import explain_all
from mp_rewrite.report.layer_times import ms_text, node_times
from mp_rewrite.report.node_table import build_tables
from mp_rewrite.report.palette import HEAT
from mp_rewrite.report.whole_model import layer_picture, picture_times, whole_model_svg


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    path = small_cnn(str(tmp_path_factory.mktemp("timed") / "cnn"))
    result = rewritten(path)
    tables = build_tables(result, with_flops=False)
    graph, _, _ = layer_picture(result, None, 150, tables)
    table = made_up_table(result)
    return path, result, tables, graph, table, picture_times(graph, tables, table, result)


def test_a_low_node_takes_its_low_time_and_a_cast_its_price(timed):
    _, result, tables, graph, table, _ = timed
    times = node_times(tables, table)[graph.source]
    rows = graph.table.rows
    low = next(n for n in table.nodes[graph.source] if rows[n].node_class == "allow")
    assert times[low] == table.nodes[graph.source][low]
    cast = next(r for r in rows.values() if r.cast is not None)
    assert times[cast.name] == (0.0, CAST_MS[0] if cast.cast.to_low else CAST_MS[1])


def test_layers_edges_and_undrawn_nodes_sum_to_the_total(timed):
    _, result, tables, graph, table, view = timed
    own = table.nodes[graph.source]
    assert view.total_fp32 == pytest.approx(sum(fp32 for fp32, _ in own.values()))
    assert view.total == pytest.approx(sum(t.ms for t in view.layers.values()) + view.edge_casts + view.undrawn[1])
    # every node here computes in bfloat16 (the lists' choice), every Cast is priced once
    casts = len({c.name for c in graph.table.result.casts})
    low = sum(ms for _, ms in own.values())
    assert view.total == pytest.approx(low + sum(CAST_MS[0] if c.to_low else CAST_MS[1]
                                                 for c in graph.table.result.casts)) and casts >= 2
    assert view.edges and all(ms > 0 for ms in view.edges.values())


def test_the_slowest_come_first(timed):
    *_, view = timed
    slowest = view.slowest()
    assert 0 < len(slowest) <= 10 and [t.ms for _, t in slowest] == sorted((t.ms for _, t in slowest), reverse=True)
    assert view.fill(slowest[0][0]) == HEAT[-1]


def test_svg_time_view_fills_by_time_and_states_the_total(timed):
    _, result, tables, graph, table, view = timed
    svg = whole_model_svg(result, costs=table)
    heats = re.findall(r'<rect class="mp-heat"[^>]*fill="(#[0-9a-f]+)"', svg)
    assert len(heats) == sum(1 for layer in graph.layers.values() if layer.kind not in ("input", "output"))
    assert HEAT[-1] in heats and 'class="mp-stripe mp-allow' not in svg
    assert f"as converted {ms_text(view.total)} ms" in svg
    key, t = view.slowest(1)[0]
    assert f"{ms_text(t.fp32)} → {ms_text(t.ms)} ms" in svg
    assert re.search(r"f32→bf16 0\.010 ms", svg)  # the input's Cast, priced on its edge


def test_no_units_no_times_and_the_note_says_why(timed):
    _, result, *_ = timed
    svg = whole_model_svg(result, costs=CostTable("bfloat16", low_units=False, note="this CPU has no avx512_bf16"))
    assert "No times: this CPU has no avx512_bf16." in svg and "mp-heat" not in svg


def test_explain_gives_the_times_its_reason_lacks(timed):
    _, result, tables, graph, table, _ = timed
    low = next(n for n in table.nodes[graph.source] if graph.table.rows[n].node_class == "allow")
    text = explain_all(result, low, graph.source, costs=table)[0].text()
    fp32, ms = table.nodes[graph.source][low]
    assert f"time: bfloat16 {ms:.3f} ms vs float32 {fp32:.3f} ms per call" in text
    assert "time:" not in explain_all(result, low, graph.source)[0].text()
    for cast in result.functions[graph.source].casts:
        price = CAST_MS[0] if cast.to_low else CAST_MS[1]
        assert f"time: {price:.3f} ms per call" in explain_all(result, cast.name, graph.source, costs=table)[0].text()


def test_measured_runs_read_what_the_profile_wrote():
    note = ("costs measured in this graph on this machine (5 traced runs of each: float32 90.1 ms, Grappler's lists "
            "108.9 ms per run); ran float32 78.6 ms, the lists 83.0 ms, the cut 73.2 ms per run; cached in x.json")
    assert measured_runs(CostTable("bfloat16", note=note)) == {"traced": (90.1, 108.9), "raced": (78.6, 83.0, 73.2)}
    assert measured_runs(CostTable("bfloat16", note="costs from a.json; 3 of 4 candidate ops measured")) == {}


@pytest.mark.parametrize("argv, words", [
    (["--format", "text", "--show", "time"], "--show colors a picture"),
    (["--format", "svg", "--show", "time", "--around", "x"], "--show time draws the whole-model picture"),
])
def test_show_time_where_there_is_no_picture_is_a_one_line_error(timed, capsys, argv, words):
    path = timed[0]
    assert cli_main(["inspect", path, "--precision", "bfloat16", "--assign", "lists", *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def _has_bf16_units() -> bool:
    from mp_rewrite.analysis.op_costs import NATIVE_FLAGS, machine_facts
    return bool(set(NATIVE_FLAGS["bfloat16"]) & set(machine_facts()["cpu_flags"]))


@pytest.mark.slow
@pytest.mark.skipif(not _has_bf16_units(), reason="no bfloat16 units: nothing is measured, every op stays float32")
def test_show_time_after_the_lists_measures_the_times_once_then_reads_the_cache(timed, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = timed[0]
    argv = ["inspect", path, "--precision", "bfloat16", "--assign", "lists", "--format", "html", "--show", "time"]
    assert cli_main([*argv, "-o", str(tmp_path / "a.html")]) == 0
    assert "the time view reads the model's op times on this machine" in capsys.readouterr().err
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    total = re.search(r'<p id="xtotal">([^<]*)</p>', page).group(1)
    assert "measured: float32" in total and "whole runs" in total
    profiles = list((tmp_path / "cache" / "mp_rewrite" / "profiles").iterdir())
    assert cli_main([*argv, "-o", str(tmp_path / "b.html")]) == 0  # the same model again: the cache answers
    assert list((tmp_path / "cache" / "mp_rewrite" / "profiles").iterdir()) == profiles
    assert cli_main(argv[:-2] + ["-o", str(tmp_path / "c.html")]) == 0  # no --show time: nothing measured
    assert 'id="xtotal"' not in (tmp_path / "c.html").read_text(encoding="utf-8")
    again = re.search(r'<p id="xtotal">([^<]*)</p>', (tmp_path / "b.html").read_text(encoding="utf-8")).group(1)
    assert again == total
