"""Which variant of a model to keep: each run whole, untraced, side by side, at one batch size or several (a front end:
analysis.graph_runs runs TensorFlow).

analysis.graph_profile builds a cost table from node times in context and a cut from it; a prediction is then
checked against the run. `race_variants` (called by graph_profile with the runners of each variant) races float32,
Grappler's lists, the cut and, where the graph rules changed the model, the model as given, and `best_across`
decides: the baseline is the model as given; a variant much slower than it at any raced batch, beyond the noise, is
out; of the rest, the least geometric mean of the time over the baseline's is fastest, and the low precision (the
cut, else the lists) is kept wherever it ties with the fastest -- within the resolution, or inside the noise of the
alternated runs (analysis.race_times: each ratio read round by round, with the sign test's interval), and the line
says "tie". Without a batch size from the user the race runs at RACE_BATCHES and the line says what each batch
showed; `decision` says what was written and why in a user's words (the first line a conversion prints).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .graph_runs import WARMUP, VariantError, made_up_values, race
from .race_times import RaceTimes, geometric_mean, ties

RACE_RUNS = 9  # untraced runs of each variant when the cut's graph is checked against the lists' and float32
# Without a batch size from the user, the variants are raced at each of these (where an input's batch is unknown)
# and the one best across them is kept: a model is served at batches nobody told the conversion.
RACE_BATCHES = (1, 8, 32)
# A variant slower than the model as given by more than this at any raced batch is out, however much faster at
# the others: a few percent at one batch for a large gain elsewhere is kept, and said (a Transformer's bfloat16 ran
# 1.07x float32's time at batch 1 and 0.38x at 32); a real loss at one batch is not traded for gains at others.
SLOWER = 0.10


def feeds_by_batch(names, specs):
    """feeds_at(batch) -> {input name: made-up value} with an unknown dimension at that batch size."""
    return lambda batch: dict(zip(names, made_up_values(specs, batch)))


def distinct(batches, feeds_at) -> dict:
    """{batch size: feeds} for each of `batches` whose inputs differ in shape from the smaller ones' (an input of
    fixed batch has one)."""
    found, shapes = {}, set()
    for batch in sorted(batches):
        feeds = feeds_at(batch)
        key = tuple(np.shape(v) for v in feeds.values())
        if key not in shapes:
            shapes.add(key)
            found[batch] = feeds
    return found


def race_variants(table, cut, racing, batches: dict, batch, where: str, source: bool) -> tuple:
    """The table with the variant the runs chose: float32, the lists, the cut (when it differs from the lists) and,
    with `source`, the model as given before the rules, raced untraced (`racing(with_cut)` -> their runners) at
    each of `batches` ({batch size: feeds, or None to run on the runners' own}), `best_across` choosing. Nothing
    is raced where there is nothing to choose (the traced batch alone, the cut the lists', no source): the traced runs
    already compared float32 with the lists, and the cut followed. Returns (table, the raced (float32, lists,
    cut) ms at `batch`, or ())."""
    with_cut = demotes(cut)
    if not table.low_units or (list(batches) in ([batch], [None]) and not with_cut and not source):
        return table, ()
    runners = racing(with_cut)
    names = ("float32", "lists") + (("cut",) if with_cut else ()) + (("source",) if source else ())
    ms = {}
    for size, feeds in batches.items():
        if feeds is not None:
            for runner in runners:
                runner.feed(feeds)
        try:
            ms[size] = race(runners, *_race_runs(size, batch), names=[_named(v) for v in names],
                            settled=lambda times: clear_of_the_limit(times, names))
        except VariantError:  # none runs at this size (a shape fixed in the graph): best_across leaves it out
            ms[size] = RaceTimes.of_medians([np.inf] * len(runners))
    everything_float32 = with_cut and _all_float32(cut)
    keep, said = best_across(ms, names, where, cut_is_low=not everything_float32)
    table = dataclasses.replace(table, decision=decision(ms, names, keep, table.precision, everything_float32))
    at = ms[batch].medians if batch in ms else None
    raced = () if at is None else (at[0], at[1], at[names.index("cut")] if with_cut else at[1])
    return dataclasses.replace(table, keep=keep, note=f"{table.note}; {said}"), raced


def decision(ms: dict, names, keep: str, precision: str, cut_all_float32: bool = False) -> str:
    """What a race decided, in a user's words, for the first line a conversion says: "wrote bfloat16: 1.92x faster
    than float32 at batch 8, measured here", or "wrote float32: bfloat16 measured 1.31x slower at batch 1 and 1.10x
    at 8 on this CPU, 2.20x faster at 32 -- `--batch-size 32` converts for that batch, `--assign lists` forces TF's
    lists" (`ms` and `names` as best_across reads them; `keep` its choice). Where the cut that won keeps every
    candidate float32 (`cut_all_float32`), what was written is float32 with the graph rules, and the line says so
    with the lists' figures: "wrote float32 with the graph rules (the cut keeps every candidate float32):
    bfloat16 (the lists) measured ..."."""
    times = {b: t if isinstance(t, RaceTimes) else RaceTimes.of_medians(t) for b, t in ms.items()}
    base = names.index("source") if "source" in names else 0
    times = {b: t for b, t in times.items() if np.isfinite(t.medians[base])}
    low = [v for v in ("cut", "lists") if v in names]
    if not times or not low:
        return ""
    kept = keep or ("cut" if "cut" in names else "lists")
    if kept == "cut" and cut_all_float32:  # float32 with the rules won: what bfloat16 measured is the lists' run
        written = decision(ms, [n if n != "cut" else "rules" for n in names], "float32", precision)
        rules = " with the graph rules" if "source" in names else ""  # the rules changed the model: it was raced
        return written.replace("wrote float32:", f"wrote float32{rules} (the cut keeps every candidate float32):", 1)
    shown = kept if kept in low else min(low, key=lambda v: geometric_mean(
        t.ratio(names.index(v), base) for t in times.values()).mid)
    ratios = [(t.ratio(names.index(shown), base).mid, b) for b, t in times.items()]
    faster = [(1 / x, b) for x, b in ratios if x < 1]
    slower = [(x, b) for x, b in ratios if x >= 1]
    against = "float32" if base == 0 else "the model as given"

    def said(pairs, how):  # "1.31x slower at batch 1 and 1.10x at 8"
        parts = [f"{x:.2f}x" + (f" {how}" if i == 0 else "") + (f" at {'batch ' if i == 0 else ''}{b}"
                                                               if b is not None else "")
                 for i, (x, b) in enumerate(pairs)]
        return " and ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else parts[0]
    if kept in low:
        figures = "; ".join(said(p, h) for p, h in ((faster, f"faster than {against}"),
                                                     (slower, f"{against}'s time")) if p)
        score = {v: geometric_mean(t.ratio(i, base) for t in times.values()) for i, v in enumerate(names)}
        fastest = min(score, key=lambda v: score[v].mid)
        faster_one = (f"{against} itself measured faster" if fastest == names[base] else
                      f"{_named(fastest)} measured {score[fastest].mid:.2f}x {against}'s time across the batches")
        tie = (f" ({faster_one}: a tie inside the noise, so the precision asked for)"
               if score[fastest].mid < score[kept].mid and fastest != kept else "")
        return f"wrote {precision}: {figures}, measured here{tie}"
    what = f"{precision} ({_named(shown)})"
    slow = said(slower, "slower") if slower else ""
    fast = said(faster, "faster") if faster else ""
    hint = f" -- --batch-size {max(faster)[1]} converts for that batch" if faster and faster[0][1] is not None else ""
    return (f"wrote float32: {what} measured " + ", ".join(x for x in (slow, fast) if x) + " on this CPU" + hint
            + (", --assign lists forces TF's lists" if hint else " -- --assign lists forces TF's lists"))


def clear_of_the_limit(times: RaceTimes, names) -> bool:
    """Whether one batch's race has said, for every variant, on which side of the SLOWER limit its time over the
    baseline's lies (its interval not across 1 + SLOWER): what best_across cannot settle by a tie. The race goes on
    (graph_runs.race, up to its most rounds) while it has not; a tie with the fastest needs no more rounds, it goes to
    the precision asked for."""
    base = names.index("source") if "source" in names else 0
    ratios = [times.ratio(i, base) for i in range(len(names)) if i != base]
    return all(not r.low <= 1 + SLOWER < r.high for r in ratios if np.isfinite(r.mid))


def _all_float32(cut) -> bool:
    """Whether the cut (a RewriteResult) moved every candidate of the lists to float32."""
    return all(len(r.assignment.demoted) == len(r.assignment.candidates)
               for r in (cut, *cut.functions.values()) if r.assignment)


def demotes(cut) -> bool:
    """Whether the cut (a RewriteResult) moved some candidate of the lists to float32: a graph of its own."""
    return any(r.assignment.demoted for r in (cut, *cut.functions.values()) if r.assignment)


def verdict(table, raced, where: str = ""):
    """The table with what one race of float32, the lists and the cut (ms per run, in that order) showed, as
    `best_across` decides (analysis.step_profile's race of a training step)."""
    keep, said = best_across({None: list(raced)}, ("float32", "lists", "cut"), where)
    return dataclasses.replace(table, keep=keep, note=f"{table.note}; {said}")


def best_across(ms: dict, names=("float32", "lists", "cut"), where: str = "", cut_is_low: bool = True) -> tuple:
    """Which variant to keep, given each one's times ({batch size, or None: a RaceTimes, or [ms per variant in
    `names`]}).

    The baseline is the model as given: "source" where it was raced (the rules changed it), else "float32". Each
    variant's time over the baseline's is read round by round, with an interval (race_times.Ratio). A variant
    slower than the baseline by more than SLOWER at some batch, beyond the noise (its interval above the limit), is
    out (the baseline never is); of the rest, the one whose ratio has the least geometric mean across the batches
    is fastest. What the user asked for -- the low precision: what the assignment keeps by itself (the cut, or
    the lists when there is no cut of their own), else the lists -- is kept wherever it ties with the fastest:
    within RESOLUTION of it, or inside the noise (their intervals overlap). A cut that keeps every candidate float32
    (`cut_is_low` False) is no low precision: only the lists are kept on a tie then. A batch the baseline could not
    run at (infinite) is left out, and said.

    Returns:
        (keep, line): the table's `keep` ("" for what the assignment keeps by itself, else "lists", "float32" or
        "source") and what the race showed, "tie" where the noise decided nothing.
    """
    times = {b: t if isinstance(t, RaceTimes) else RaceTimes.of_medians(t) for b, t in ms.items()}
    base = names.index("source") if "source" in names else 0
    failed = [b for b, t in times.items() if not np.isfinite(t.medians[base])]
    times = {b: t for b, t in times.items() if b not in failed}
    sizes = ", ".join(map(str, failed))
    if not times:
        return names[base], f"{_named(names[base])} did not run at batch {sizes}: it is kept"
    ratio = {v: [t.ratio(i, base) for t in times.values()] for i, v in enumerate(names)}
    kept_in = {v for v, r in ratio.items() if all(x.low <= 1 + SLOWER for x in r)}
    score = {v: geometric_mean(ratio[v]) for v in kept_in}
    fastest = min(score, key=lambda v: score[v].mid)
    mine = "cut" if "cut" in names else "lists"
    asked = (mine, "lists") if cut_is_low else ("lists",)
    best = next((v for v in asked if v in score and ties(score[v], score[fastest])), fastest)
    return ("" if best == mine else best), _said(times, names, base, ratio, score, best, fastest, where, sizes)


def _said(times: dict, names, base: int, ratio: dict, score: dict, best: str, fastest: str, where: str,
          sizes: str) -> str:
    """The race's line: each variant's ms per run at each batch, what was kept and why, the variants out, ties."""
    from ..core.assignment import RESOLUTION
    at = f" at batch {', '.join(map(str, times))}" if None not in times else ""
    each = "; ".join(f"{_named(v)} " + " / ".join(f"{t.medians[i]:.1f}" for t in times.values())
                     for i, v in enumerate(names))
    rounds = max(t.rounds for t in times.values())
    worst = {v: max(zip((x.mid for x in r), times, r), key=lambda w: w[0]) for v, r in ratio.items()}
    out = [f"{_named(v)} " + (f"{worst[v][2].text()}" if np.isfinite(worst[v][0]) else "did not run")
           + (f" at batch {worst[v][1]}" if at else "") for v in names if v not in score]
    # A variant whose median was over the limit somewhere, kept in because the limit is inside its interval.
    near = [f"{_named(best)} {x.text()}" + (f" at batch {size}" if at else "")
            for x, size in zip(ratio[best], times) if x.mid > 1 + SLOWER]
    slower, where_slower = worst[best][0], worst[best][1]
    gains = [(x.high, size, v) for v, r in ratio.items() if v not in score
             for x, size, kept in zip(r, times, ratio[best]) if x.high < (1 - RESOLUTION) * kept.low]
    hint = ""
    if gains and at:
        fastest_gain, size, variant = min(gains)
        hint = (f"; at batch {size} {_named(variant)} ran {fastest_gain:.2f}x: --batch-size {size} chooses for that "
                "batch")
    tie = ""
    if best != fastest:
        tie = (f": a tie with {_named(fastest)} ({score[best].text()} against {score[fastest].text()} of "
               f"{_named(names[base])}'s time, inside the noise of {rounds} alternated runs), so the precision asked "
               "for is kept")
    return (f"raced{where}{at} ({each} ms per run): {_named(best)} kept" + tie
            + (", the best across them" if len(times) > 1 and not tie else "")
            + (f" (out, over {1 + SLOWER:.2f}x {_named(names[base])}'s time"
               f"{' beyond the noise' if rounds > 1 else ''}: {', '.join(out)}{hint})" if out else "")
            + (f"; a tie with the {1 + SLOWER:.2f}x limit, inside the noise: {', '.join(near)}" if near else "")
            + (f"; it runs {slower:.2f}x {_named(names[base])}'s time at batch {where_slower} (--batch-size "
               f"{where_slower} chooses for that batch)" if len(times) > 1 and slower > 1 + RESOLUTION else "")
            + (f"; {_named(names[base])} did not run at batch {sizes}" if sizes else ""))


def _named(variant: str) -> str:
    return {"float32": "float32", "source": "the model as given (no rules)"}.get(variant, f"the {variant}")


def _race_runs(size, batch) -> tuple:
    """(runs, warm-up runs) of each variant at a batch size: RACE_RUNS at the measured batch (or an unknown one),
    more at a smaller one (a run is short, its time noisier), fewer at a larger one -- each size's race costs about
    what the measured batch's does (ResNet-50's float32 runs ~4x longer at batch 32 than at 8) -- and a single
    warm-up there."""
    if size is None or batch is None:
        return RACE_RUNS, WARMUP
    runs = RACE_RUNS * batch // size
    return int(min(3 * RACE_RUNS, max(3, runs))), (WARMUP if size <= batch else 1)
