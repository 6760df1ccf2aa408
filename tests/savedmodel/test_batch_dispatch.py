"""The batch dispatch (issue 39, item 2): one frozen signature running float32 below a batch size and the low
precision from it (savedmodel/batch_dispatch.py) equals each branch on its side of the threshold; the verdict
(savedmodel/dispatch_verdict.py) keeps it only where it ties with the faster variant at every batch and beats
either alone across them; `convert --freeze` writes it and says so (MP_REWRITE_DISPATCH=force: on this machine the
race's winner need not change with the batch)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.analysis.grappler import FOLDING, optimize_graph  # noqa: E402
from mp_rewrite.analysis.race_times import RaceTimes  # noqa: E402
from mp_rewrite.core.rewrite import rewrite_graph_def  # noqa: E402
from mp_rewrite.errors import OptionError  # noqa: E402
from mp_rewrite.rules import fold_constant_casts  # noqa: E402
from mp_rewrite.savedmodel.batch_dispatch import (DISPATCH_ENV, DISPATCH_FUNCTION, dispatch_function,  # noqa: E402
                                                  dispatch_mode)
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.dispatch_verdict import (FLOAT32, LOW, dispatch_verdict, dispatches, kept_line,  # noqa: E402
                                                    refused_line, segments_of, segments_text, winners_of)
from mp_rewrite.savedmodel.frozen_function import compact, imported_function  # noqa: E402
from mp_rewrite.savedmodel.frozen_signature import freeze_signature  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402


@pytest.fixture(scope="module")
def branches(tmp_path_factory):
    """(float32's and bfloat16's concrete functions of a frozen Keras MLP, their specs, the frozen signature)."""
    path = tmp_path_factory.mktemp("mlp") / "model"
    example_models.mlp().export(str(path), verbose=False)
    frozen = freeze_signature(tf.saved_model.load(str(path)), "serving_default")
    graph = optimize_graph(frozen.graph_def, frozen.fetches, FOLDING)
    fed = [name.split(":")[0] for _, name in frozen.inputs]
    low = rewrite_graph_def(graph, "bfloat16", fetches=frozen.fetches, preserve=fed)
    assert low.converted_nodes  # the MatMuls run in bfloat16: the two branches differ
    low_graph = compact(fold_constant_casts(low.graph_def, frozen.fetches)[0], frozen.fetches)
    f32, specs = imported_function(graph, frozen.inputs, frozen.outputs)
    bf16, _ = imported_function(low_graph, frozen.inputs, frozen.outputs)
    return (f32, bf16), specs, frozen


def test_the_dispatch_equals_each_branch_on_its_side_of_the_threshold(branches):
    imported, specs, frozen = branches
    keys = list(frozen.outputs)
    dispatch = dispatch_function(imported, specs, keys, frozen.shapes, ((1, FLOAT32), (4, LOW)), 0)
    rng = np.random.default_rng(0)
    for batch, side in ((1, FLOAT32), (3, FLOAT32), (4, LOW), (9, LOW)):
        x = tf.constant(rng.normal(size=[batch, 32]).astype(np.float32))
        got = dispatch(x)
        want, other = (dict(zip(keys, imported[v](x))) for v in (side, 1 - side))
        for key in keys:
            assert got[key].shape == (batch, 10) and got[key].dtype == tf.float32
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
            # bfloat16's round-off tells the branches apart: the call above did run the side's own graph
            assert not np.array_equal(got[key].numpy(), other[key].numpy())


def test_three_segments_nest_two_conds(branches):
    imported, specs, frozen = branches
    keys = list(frozen.outputs)
    dispatch = dispatch_function(imported, specs, keys, frozen.shapes, ((1, LOW), (2, FLOAT32), (5, LOW)), 0)
    for batch, side in ((1, LOW), (2, FLOAT32), (4, FLOAT32), (5, LOW)):
        x = tf.ones([batch, 32])
        np.testing.assert_array_equal(dispatch(x)[keys[0]].numpy(), imported[side](x)[0].numpy())
    graph = dispatch.get_concrete_function().graph.as_graph_def()
    conds = [n for f in [graph, *graph.library.function] for n in getattr(f, "node", getattr(f, "node_def", []))
             if n.op in ("If", "StatelessIf")]
    assert len(conds) == 2


def test_winners_make_segments_from_batch_one():
    assert segments_of({1: FLOAT32, 8: LOW, 32: LOW}) == ((1, FLOAT32), (8, LOW))
    assert segments_of({1: LOW, 8: LOW, 32: LOW}) == ((1, LOW),)
    assert segments_of({1: LOW, 8: FLOAT32, 32: LOW}) == ((1, LOW), (8, FLOAT32), (32, LOW))
    assert winners_of({1: [1.0, 1.2], 8: [8.0, 5.0]}) == {1: FLOAT32, 8: LOW}
    assert winners_of({1: [1.0, 1.005], 8: [8.0, 5.0]}) == {1: LOW, 8: LOW}  # within 1%: the variant written


def test_a_batch_won_inside_the_noise_stays_with_the_variant_written():
    rounds = 5
    f32 = (1.0,) * rounds
    noisy = (0.9, 1.2, 0.95, 1.3, 1.25)  # bfloat16 slower in the median, faster in two rounds of five: a tie
    clear = (1.2, 1.3, 1.25, 1.3, 1.22)  # slower in every round
    assert winners_of({1: RaceTimes((f32, noisy))}) == {1: LOW}
    assert winners_of({1: RaceTimes((f32, clear))}) == {1: FLOAT32}
    assert winners_of({1: RaceTimes((f32, clear))}, written=FLOAT32) == {1: FLOAT32}
    # Once one batch is won beyond the noise, a tie goes to its median's winner (the threshold's best estimate).
    faster_low = tuple(0.8 * x for x in f32)
    assert winners_of({1: RaceTimes((f32, clear)), 8: RaceTimes((f32, tuple(2 - x for x in noisy))),
                       32: RaceTimes((f32, faster_low))}, written=FLOAT32) == {1: FLOAT32, 8: LOW, 32: LOW}
    assert segments_text(((1, FLOAT32), (8, LOW)), "bfloat16") == "float32 below batch 8, bfloat16 from 8"


# ms per call at each batch: (float32, bfloat16, the dispatch): bfloat16 slower at 1, faster at 8 and 32
CROSSING = {1: [1.0, 1.3, 1.01], 8: [8.0, 5.0, 5.02], 32: [30.0, 15.0, 15.1]}


def test_a_dispatch_as_fast_as_the_winner_everywhere_and_faster_than_either_is_kept():
    verdict = dispatch_verdict(CROSSING)
    assert verdict.kept and not verdict.losses
    assert verdict.overall[0].mid < 0.7 and verdict.overall[1].mid < 0.95


def test_a_dispatch_slower_than_the_winner_at_one_batch_is_refused_and_the_batch_named():
    verdict = dispatch_verdict({**CROSSING, 1: [1.0, 1.3, 1.10]})  # the tf.cond costs 10% at batch 1
    assert not verdict.kept
    assert [(b, v) for b, _, v in verdict.losses] == [(1, FLOAT32)]
    line = refused_line(verdict, {**CROSSING, 1: [1.0, 1.3, 1.10]}, ((1, FLOAT32), (8, LOW)), "bfloat16", LOW)
    assert "1.10x float32's time at batch 1" in line
    assert "with bfloat16 alone batch 1 (1.30x float32's time) loses" in line


def test_a_dispatch_no_faster_than_one_variant_across_the_batches_is_refused():
    tie_at_one = {1: [1.0, 1.0, 1.0], 8: [8.0, 5.0, 5.0], 32: [30.0, 15.0, 15.0]}  # bfloat16 never loses
    verdict = dispatch_verdict(tie_at_one)
    assert not verdict.kept and not verdict.losses
    assert "no faster than bfloat16's" in refused_line(verdict, tie_at_one, ((1, FLOAT32), (8, LOW)), "bfloat16", LOW)


def test_a_difference_inside_the_noise_of_alternated_rounds_is_a_tie():
    rounds = 9
    f32 = [1.0] * rounds
    low = [1.3] * rounds
    # The dispatch 5% slower in the median, but faster in several rounds: its interval holds 1.
    dispatch = [1.05, 0.95, 1.08, 0.97, 1.06, 1.05, 0.96, 1.07, 1.05]
    noisy = {1: RaceTimes((tuple(f32), tuple(low), tuple(dispatch))), **{b: RaceTimes.of_medians(t)
                                                                         for b, t in CROSSING.items() if b > 1}}
    assert dispatch_verdict(noisy).kept
    steady = [1.05] * rounds  # 5% slower in every round: beyond the noise
    noisy[1] = RaceTimes((tuple(f32), tuple(low), tuple(steady)))
    assert [b for b, _, _ in dispatch_verdict(noisy).losses] == [1]


def test_the_kept_line_says_what_runs_where_and_the_size_of_both_graphs():
    line = kept_line(dispatch_verdict(CROSSING), CROSSING, ((1, FLOAT32), (8, LOW)), "bfloat16", (13.7, 7.1))
    assert line.startswith("wrote a batch dispatch: float32 below batch 8, bfloat16 from 8")
    assert "13.7 MB + 7.1 MB against 7.1 MB for bfloat16 alone" in line
    assert "48 KB + 30 KB" in kept_line(dispatch_verdict(CROSSING), CROSSING, ((1, FLOAT32), (8, LOW)), "bfloat16",
                                        (0.048, 0.03))
    assert "at batch 1 / 8 / 32: the dispatch 1.0 / 5.0 / 15.1 ms per call" in line


def test_an_unknown_dispatch_setting_is_refused(monkeypatch):
    monkeypatch.setenv(DISPATCH_ENV, "sometimes")
    with pytest.raises(OptionError, match="MP_REWRITE_DISPATCH"):
        dispatch_mode()


def test_convert_freeze_writes_a_forced_dispatch_that_runs_both_sides(tmp_path, monkeypatch):
    source = tmp_path / "mlp"
    example_models.mlp().export(str(source), verbose=False)
    plain = convert_saved_model(source, tmp_path / "plain", "bfloat16", freeze=True)
    assert all(getattr(r, "dispatch", None) is None for r in plain.graphs.values())  # Grappler's lists: no race
    monkeypatch.setenv(DISPATCH_ENV, "force")
    result = convert_saved_model(source, tmp_path / "dispatch", "bfloat16", freeze=True)
    choice = next(iter(result.graphs.values())).dispatch
    assert choice.kept and choice.segments[0] == (1, FLOAT32) and len(choice.segments) >= 2
    assert choice.why.startswith("wrote a batch dispatch: float32 below batch") and " KB against " in choice.why
    assert set(choice.times) == {1, 8, 32} and all(len(t.walls) == 3 for t in choice.times.values())
    loaded = tf.saved_model.load(str(tmp_path / "dispatch"))
    names = [f.signature.name for f in loaded.signatures["serving_default"].graph.as_graph_def().library.function]
    assert any(DISPATCH_FUNCTION in name for name in names)
    assert dispatches(names)
    lists = tf.saved_model.load(str(tmp_path / "plain")).signatures["serving_default"]
    threshold = choice.segments[1][0]
    for batch in (1, threshold - 1, threshold, threshold + 3):
        if batch < 1:
            continue
        x = tf.constant(np.random.default_rng(batch).normal(size=[batch, 32]).astype(np.float32))
        got = next(iter(loaded.signatures["serving_default"](features=x).values())).numpy()
        low = next(iter(lists(features=x).values())).numpy()
        if batch >= threshold:  # the bfloat16 branch: Grappler's lists, as the plain conversion wrote them
            np.testing.assert_array_equal(got, low)
        else:
            assert not np.array_equal(got, low)  # float32: not the bfloat16 graph's round-off


def test_convert_in_place_writes_a_forced_dispatch_whose_bodies_share_the_variables(tmp_path, monkeypatch, capsys):
    from mp_rewrite.commands import cli
    from mp_rewrite.model.files import read_saved_model
    from mp_rewrite.savedmodel.dispatch_verdict import FLOAT32_SUFFIX
    source = tmp_path / "mlp"
    example_models.mlp().export(str(source), verbose=False)
    plain = convert_saved_model(source, tmp_path / "plain", "bfloat16")
    assert all(getattr(r, "dispatch", None) is None for r in plain.graphs.values())
    monkeypatch.setenv(DISPATCH_ENV, "force")
    result = convert_saved_model(source, tmp_path / "dispatch", "bfloat16")
    choice = next(iter(result.graphs.values())).dispatch
    assert choice.kept and choice.segments == ((1, FLOAT32), (8, LOW)), choice.why
    assert "read the same variables" in choice.why
    loaded = tf.saved_model.load(str(tmp_path / "dispatch"))
    written = {f.signature.name for f in tf.saved_model.load(str(tmp_path / "dispatch")).signatures[
        "serving_default"].graph.as_graph_def().library.function}
    assert any(FLOAT32_SUFFIX in n for n in written)
    assert cli.main(["inspect", str(tmp_path / "dispatch"), "--precision", "bfloat16"]) == 0
    assert "its signatures dispatch on the batch size" in capsys.readouterr().err
    assert not dispatches(f.signature.name for f in read_saved_model(tmp_path / "plain").meta_graphs[0]
                          .graph_def.library.function)
    # one copy of the weights: the variables directory is the source's
    size = sum(f.stat().st_size for f in (tmp_path / "dispatch" / "variables").iterdir())
    assert size == sum(f.stat().st_size for f in (source / "variables").iterdir())
    source_model = tf.saved_model.load(str(source)).signatures["serving_default"]
    lists = tf.saved_model.load(str(tmp_path / "plain")).signatures["serving_default"]
    for batch in (1, 7, 8, 11):
        x = tf.constant(np.random.default_rng(batch).normal(size=[batch, 32]).astype(np.float32))
        got = next(iter(loaded.signatures["serving_default"](features=x).values())).numpy()
        f32, low = (next(iter(m(features=x).values())).numpy() for m in (source_model, lists))
        # The If is lowered and inlined as a tf.cond's is: each side runs its variant's kernels, bit for bit.
        np.testing.assert_array_equal(got, f32 if batch < 8 else low)
        assert not np.array_equal(got, low if batch < 8 else f32)


def test_dispatch_races_run_beside_another_process_are_said_and_not_kept(tmp_path, monkeypatch):
    """A race the rest of the machine disturbed (analysis/machine_load.py) decides this conversion only: the line
    says so and the timing cache keeps nothing, so the next conversion times again."""
    import subprocess
    import sys
    import time

    from mp_rewrite.savedmodel.batch_dispatch import KeptRaces
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    times = {8: RaceTimes(((1.0, 1.1, 1.0), (2.0, 2.1, 2.0)))}
    races = KeptRaces(b"a graph", 7, "auto")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        got = races.alone(lambda: time.sleep(0.6) or times)  # a race that waits while the other process spins
    finally:
        hog.kill()
        hog.wait()
    assert got is times and "; timed while other processes used " in races.note, races.note
    assert "not kept, so the next conversion times again" in races.note
    assert KeptRaces(b"a graph", 7, "auto").note == ""  # nothing was kept
    # Below: races counted as quiet, whatever else the machine runs now (a busy CI machine failed the kept one).
    monkeypatch.setattr("mp_rewrite.savedmodel.split_timing.OTHERS", float("inf"))
    KeptRaces(b"a graph", 7, "auto").alone(lambda: time.sleep(0.3) or times)  # quiet: kept
    later = KeptRaces(b"a graph", 7, "auto")
    assert later.alone(lambda: None) == times and "times measured by an earlier conversion" in later.note
    assert later.with_dispatch(lambda: times) is times  # the part the earlier conversion did not keep: timed now
    assert later.note.endswith("; the race with the dispatch timed now (the earlier conversion could not keep it)")
