"""The time view (report/layer_times.py): each layer's time per call in float32 and as converted, read from the
cost table as plain data, summed into the stated total; drawn as SVG (--show time) and said by explain."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
from timed_model import CAST_MS, made_up_table, rewritten, small_cnn

from mp_rewrite.analysis.graph_costs import MAIN
from mp_rewrite.analysis.graph_profile import measured_runs
from mp_rewrite.analysis.run_times import RunTimes, counted_once
from mp_rewrite.commands.cli import main as cli_main
from mp_rewrite.core.assignment import DEFAULT_CAST_MS, CostTable
from mp_rewrite.report.explanation import explain_all
from mp_rewrite.report.layer_times import ms_text
from mp_rewrite.report.node_times import node_times
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


def _runs(result, table, calls=1) -> RunTimes:
    """RunTimes for the small CNN: every node of every graph ran (1 ms float32, 0.5 ms in the lists' run), the
    result's low nodes ran as fused kernels, 0.25 ms of TF's own nodes."""
    nodes, kernels = {}, {}
    for name, sub in (("", result), *result.functions.items()):
        label = name or MAIN
        nodes[label] = {n.name: (1.0, 0.5) for n in sub.graph_def.node if n.op != "Cast"}
        kernels[label] = {n: ("_MklNativeFusedConv2D: BiasAdd", "_MklNativeFusedConv2D: BiasAdd+Relu")
                          for n in sub.converted_nodes}
    return RunTimes((30.0, 20.0), (25.0 * calls, 15.0 * calls), (), nodes, (0.25, 0.25), kernels,
                    {label: calls for label in nodes})


def test_measured_runs_are_data_the_profile_stored():
    runs = RunTimes((90.1, 108.9), (70.0, 60.0), (78.6, 83.0, 73.2), {}, (0.0, 0.0))
    assert measured_runs(CostTable("bfloat16", note="anything at all", runs=runs)) == {
        "traced": (90.1, 108.9), "untraced": (70.0, 60.0), "raced": (78.6, 83.0, 73.2)}
    assert measured_runs(CostTable("bfloat16", note="costs from a.json; 3 of 4 candidate ops measured")) == {}
    assert RunTimes.from_data(json.loads(json.dumps(runs.as_data()))) == runs


def test_with_runs_every_op_counts_and_the_total_is_the_whole_run(timed):
    _, result, tables, graph, table, _ = timed
    runs = _runs(result, table, calls=2)
    view = picture_times(graph, tables, dataclasses.replace(table, runs=runs), result)
    assert view.complete
    ran = sum(len(nodes) for nodes in runs.nodes.values())
    # every node ran 1 ms in float32 per call, TF's own nodes 0.25 ms per run of two calls: all of it is in the
    # layers, undrawn or elsewhere
    assert view.total_fp32 == pytest.approx(ran * 1.0 + 0.125)
    assert sum(t.fp32 for t in view.layers.values()) + view.undrawn[0] + view.elsewhere[0] == \
        pytest.approx(view.total_fp32)
    # the lists' coloring: every op at its lists' time, whatever its class; a Cast its run did not run (none here)
    # adds nothing
    assert view.total == pytest.approx(ran * 0.5 + 0.125) and view.edge_casts == 0
    # two calls per run (two signatures): the measured whole run is halved to one call
    assert view.measured["float32"] == 25.0 and view.measured["converted"] == 15.0
    assert "2 calls of the model each" in view.measured["how"]
    fused = [t for t in view.layers.values() if t.kernels]
    assert fused and fused[0].kernels[0][0] == "_MklNativeFusedConv2D: BiasAdd+Relu"  # as converted: the lists'
    svg = whole_model_svg(result, costs=dataclasses.replace(table, runs=runs))
    assert "ran _MklNativeFusedConv2D: BiasAdd+Relu" in svg and "what ran outside the layers" in svg


def test_each_run_s_fused_kernel_goes_to_the_box_of_the_op_it_starts_from(timed):
    _, result, tables, graph, table, _ = timed
    rows = graph.table.rows

    def node(op, scope):
        return next(n for n, row in rows.items() if row.op == op and f"/{scope}" in n and n in graph.box_of)
    conv, bias, mul, add, relu = (node("Conv2D", "conv_a"), node("BiasAdd", "conv_a"), node("Mul", "bn_a"),
                                  node("AddV2", "bn_a"), node("Relu", "relu_a"))
    # float32 ran the convolution, its bias, the BatchNorm and the Relu as one kernel named after the Relu;
    # bfloat16 ran the convolution with its bias (named after the BiasAdd), the BatchNorm and the Relu alone
    nodes = {graph.source: {relu: (3.0, 0.4), bias: (0.0, 1.0), mul: (0.0, 0.2), add: (0.0, 0.3)}}
    kernels = {graph.source: {relu: ("_MklNativeFusedConv2D: BiasAdd+Relu", ""),
                              bias: ("", "_MklNativeFusedConv2D: BiasAdd")}}
    runs = RunTimes((5.0, 3.0), (4.0, 2.0), (), nodes, (0.0, 0.0), kernels, {graph.source: 1})
    view = picture_times(graph, tables, dataclasses.replace(table, runs=runs), result)
    t = {label: view.layers[graph.box_of[n]] for label, n in (("conv", conv), ("bn", add), ("relu", relu))}
    # float32's kernel is the convolution's (as converted, the Casts of its weights are priced in too)
    assert t["conv"].fp32 == 3.0 and t["conv"].ms == pytest.approx(1.0, abs=0.05)
    assert t["conv"].kernels == (("_MklNativeFusedConv2D: BiasAdd", 1),)  # as converted: bfloat16's kernel
    assert t["bn"].fp32 == 0.0 and t["bn"].ms == pytest.approx(0.5, abs=0.05)
    assert t["relu"].fp32 == 0.0 and t["relu"].ms == pytest.approx(0.4, abs=0.05) and not t["relu"].kernels


def test_the_cut_is_the_lists_run_but_for_what_it_demoted_and_its_measured_time_the_race_ratio(timed):
    from mp_rewrite.core.options import make_options
    from mp_rewrite.model.loaded import load_model, rewrite_model
    path, lists, *_ = timed
    table = made_up_table(lists)
    # one candidate made slower in bfloat16: the cut keeps it float32, so the result is the cut's
    label, nodes = next((label, nodes) for label, nodes in table.nodes.items() if nodes)
    slow = dict(nodes, **{sorted(nodes)[0]: (0.1, 10.0)})
    table = dataclasses.replace(table, nodes={**table.nodes, label: slow})
    cut = rewrite_model(load_model(path), "bfloat16", options=make_options("bfloat16", assign="cost", costs=table))
    name = "" if label == MAIN else label
    sub, ran_lists = (cut.functions.get(name, cut), lists.functions.get(name, lists))
    demoted = sorted(sub.assignment.demoted)
    shared = [c.name for c in sub.casts if c.name in {c.name for c in ran_lists.casts}]
    new = [c for c in sub.casts if c.name not in {c.name for c in ran_lists.casts}]
    assert demoted and shared and new
    runs = _runs(cut, table)
    # the lists' run: the demoted node ran in bfloat16 (10 ms), every Cast it shares with the cut 0.3 ms
    own = {**runs.nodes[label], **{n: (0.1, 10.0) for n in demoted}, **{c: (0.0, 0.3) for c in shared}}
    runs = dataclasses.replace(runs, nodes={**runs.nodes, label: own}, raced=(30.0, 33.0, 24.0))
    tables = build_tables(cut, with_flops=False)
    graph, _, _ = layer_picture(cut, None, 150, tables)
    view = picture_times(graph, tables, dataclasses.replace(table, runs=runs), cut)
    times = view.nodes[name]
    kept = next(n for n, row in graph.table.rows.items() if row.node_class == "untouched" and n in own)
    # a node float32 in both runs takes the lists' run's time (the cut's graph is the lists' but for what it
    # demoted), a demoted one float32's, a Cast the lists' run ran its time there, a new one its price per tensor
    assert times[kept] == (1.0, 0.5) and all(times[n] == (0.1, 0.1) for n in demoted)
    assert all(times[c] == (0.0, 0.3) for c in shared)
    priced = {c.name: table.casts[label].get((c.src, c.src_port), (DEFAULT_CAST_MS,) * 2) for c in new}
    assert all(times[c.name] == (0.0, priced[c.name][0 if c.to_low else 1]) for c in new)
    # the lists' fastest untraced run is 15 ms, and the cut ran at 24/33 of the lists' in the race (medians, on
    # a busier machine): 10.9 ms, not the 24 ms median
    assert view.measured["float32"] == 25.0 and view.measured["converted"] == pytest.approx(15.0 * 24 / 33)
    assert "the lists' times the cut's ratio to it in the race (0.73" in view.measured["how"]


def test_a_cut_with_runs_of_its_own_is_drawn_from_them(timed):
    """Where the profile traced the cut it kept (RunTimes.cut), every node's time as converted, its Casts and its
    measured whole run are the cut's own run's: none is put together from the lists' run and float32's."""
    from mp_rewrite.core.options import make_options
    from mp_rewrite.model.loaded import load_model, rewrite_model
    path, lists, *_ = timed
    table = made_up_table(lists)
    label, nodes = next((label, nodes) for label, nodes in table.nodes.items() if nodes)
    table = dataclasses.replace(table, nodes={**table.nodes, label: dict(nodes, **{sorted(nodes)[0]: (0.1, 10.0)})})
    cut = rewrite_model(load_model(path), "bfloat16", options=make_options("bfloat16", assign="cost", costs=table))
    name = "" if label == MAIN else label
    sub = cut.functions.get(name, cut)
    demoted, casts = sorted(sub.assignment.demoted), [c.name for c in sub.casts]
    assert demoted and casts
    runs = _runs(cut, table)  # float32 1 ms, the lists 0.5 ms a node
    own = {label: {**{n: (1.0, 0.2) for n in runs.nodes[label]}, **{c: (0.0, 0.05) for c in casts}}}
    mine = RunTimes((30.0, 12.0), (25.0, 9.0), (), own, (0.25, 0.1), {}, {label: 1}, (0.5, 0.3))
    runs = dataclasses.replace(runs, raced=(30.0, 33.0, 24.0), cut=mine)
    tables = build_tables(cut, with_flops=False)
    graph, _, _ = layer_picture(cut, None, 150, tables)
    view = picture_times(graph, tables, dataclasses.replace(table, runs=runs), cut)
    times = view.nodes[name]
    assert all(times[n] == (1.0, 0.2) for n in demoted)  # its own run's time, not float32's
    assert all(times[c] == (0.0, 0.05) for c in casts)  # as its run ran them, not priced
    assert view.measured["converted"] == 9.0 and "the cut's own runs" in view.measured["how"]
    assert view.between == (0.5, 0.3)
    assert RunTimes.from_data(json.loads(json.dumps(runs.as_data()))) == runs


def test_counted_once_gives_each_instant_to_the_oldest_running_kernel():
    from tensorflow.core.framework import step_stats_pb2
    stats = step_stats_pb2.StepStats()
    device = stats.dev_stats.add(device="cpu")
    for name, start, end in (("conv", 0, 4_000_000), ("add", 1_000_000, 4_500_000), ("relu", 6_000_000, 7_000_000)):
        device.node_stats.add(node_name=name, all_start_nanos=start, op_start_rel_nanos=0,
                              op_end_rel_nanos=end - start)
    # the add started beside the conv waits for it: its own time starts when the conv ends; the gap counts for none
    assert counted_once(stats) == pytest.approx({"conv": 4.0, "add": 0.5, "relu": 1.0})


def test_an_old_cache_file_is_measured_again_with_a_message(tmp_path, monkeypatch, caplog):
    from mp_rewrite.analysis import graph_profile, profile_cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    table = CostTable("bfloat16", {MAIN: {"a": (1.0, 0.5)}}, {MAIN: {}}, {MAIN: {}}, True, "measured")
    profile_cache.save("k", table, 3.0, 2.0)  # as the previous version wrote it: no "runs"
    loaded = profile_cache.load("k")
    assert loaded is not None and loaded[0].runs is None and loaded[0].nodes == table.nodes
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        assert graph_profile._cached("k") is None
    assert "measuring the model again" in caplog.text
    runs = RunTimes((1.0, 1.0), (1.0, 1.0), (), {MAIN: {"a": (1.0, 0.5)}})
    profile_cache.save("k", dataclasses.replace(table, runs=runs), 3.0, 2.0)
    assert graph_profile._cached("k").table.runs == runs


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
