"""The first line says what was written and why (issue 39, item 3): the race's decision in a user's words, and
--verify says when both sides ran float32."""

from __future__ import annotations

import os

import pytest

from mp_rewrite.analysis.op_costs import this_machine
from mp_rewrite.analysis.variant_race import decision
from mp_rewrite.commands import cli


def test_a_float32_output_says_why_with_the_measured_ratios_and_what_to_do():
    line = decision({1: [1.0, 1.31], 8: [10.0, 11.0], 32: [40.0, 18.2]}, ("float32", "lists"), "float32", "bfloat16")
    assert line == ("wrote float32: bfloat16 (the lists) measured 1.31x slower at batch 1 and 1.10x at 8, 2.20x "
                    "faster at batch 32 on this CPU -- --batch-size 32 converts for that batch, --assign lists forces "
                    "TF's lists")


def test_a_low_precision_output_says_how_much_faster_it_measured():
    line = decision({1: [1.0, 1.02, 1.01], 8: [10.0, 5.2, 5.1], 32: [40.0, 18.2, 18.0]},
                    ("float32", "lists", "cut"), "", "bfloat16")
    assert line == ("wrote bfloat16: 1.96x faster than float32 at batch 8 and 2.22x at 32; 1.01x float32's time at "
                    "batch 1, measured here")


def test_a_cut_that_keeps_every_candidate_float32_is_not_said_to_write_bfloat16():
    """The cut won the race, but it keeps all its candidates float32: the line says what runs (float32 with the
    graph rules) and what bfloat16 (the lists) measured, not the cut's figures as bfloat16's."""
    ms = {1: [1.0, 1.15, 0.96], 8: [10.0, 10.5, 9.3]}
    assert decision(ms, ("float32", "lists", "cut"), "", "bfloat16").startswith("wrote bfloat16: ")
    line = decision(ms, ("float32", "lists", "cut"), "", "bfloat16", cut_all_float32=True)
    assert line == ("wrote float32 (the cut keeps every candidate float32): bfloat16 (the lists) measured 1.15x "
                    "slower at batch 1 and 1.05x at 8 on this CPU -- --assign lists forces TF's lists")
    # Where the graph rules changed the model, the model as given was raced too: what was written is float32 with
    # the rules, against the model as given.
    ms = {1: [1.0, 1.15, 0.96, 1.05], 8: [10.0, 10.5, 9.3, 11.0]}
    line = decision(ms, ("float32", "lists", "cut", "source"), "", "bfloat16", cut_all_float32=True)
    assert line.startswith("wrote float32 with the graph rules (the cut keeps every candidate float32): bfloat16 "
                           "(the lists) measured"), line


@pytest.mark.skipif(not this_machine("bfloat16").low_units, reason="the race runs where the CPU computes bfloat16")
def test_convert_says_the_decision_first(small_cnn, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MP_REWRITE_ASSIGN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cli.main(["convert", str(small_cnn), str(tmp_path / "out"), "--precision", "bfloat16", "--freeze"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(("wrote bfloat16: ", "wrote float32: ", "wrote float32 with the graph rules")) and \
        "batch 1" in first, first


def test_verify_says_when_both_sides_ran_float32(small_cnn, tmp_path, capsys):
    assert os.environ["MP_REWRITE_ASSIGN"] == "lists"  # conftest: Grappler's lists, no race
    assert cli.main(["convert", str(small_cnn), str(tmp_path / "out"), "--precision", "bfloat16",
                     "--keep-fp32", "*", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "both sides ran float32 (no node was converted to bfloat16)" in out, out


def test_the_decision_is_cached_with_the_costs():
    from mp_rewrite.analysis.profile_cache import as_text, from_text
    from mp_rewrite.core.assignment import CostTable
    table = CostTable("bfloat16", decision="wrote bfloat16: 1.67x faster than float32, measured here")
    assert from_text(as_text(table, 10.0, 6.0))[0].decision == table.decision


def test_a_tie_with_a_faster_float32_is_said_in_the_decision():
    from mp_rewrite.analysis.race_times import RaceTimes
    ms = {8: RaceTimes(((10, 11, 9.5, 10.2, 12, 10, 9.8, 10.1, 10.4), (10.6, 10.2, 10.9, 11.0, 10.0, 12, 9.9, 10.8,
                                                                      10.6)))}
    line = decision(ms, ("float32", "lists"), "", "bfloat16")
    assert line == ("wrote bfloat16: 1.06x float32's time at batch 8, measured here (float32 itself measured faster: "
                    "a tie inside the noise, so the precision asked for)"), line


def test_a_cut_that_keeps_every_candidate_float32_is_not_the_precision_asked_for_on_a_tie():
    from mp_rewrite.analysis.variant_race import best_across
    ms = {1: [1.0, 1.0, 0.995], 8: [10.0, 9.8, 9.75]}  # the lists within 1% of the fastest, the cut
    assert best_across(ms)[0] == ""  # a cut of its own: what the assignment keeps
    keep, line = best_across(ms, cut_is_low=False)  # a cut all float32: the lists are what was asked for
    assert keep == "lists" and "the lists kept: a tie with the cut" in line, line
