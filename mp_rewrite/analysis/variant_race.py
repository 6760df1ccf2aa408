"""Which variant of a model to keep: each run whole, untraced, side by side, at one batch size or several (a front end:
analysis.graph_runs runs TensorFlow).

analysis.graph_profile builds a cost table from node times in context and a cut from it; a prediction is then
checked against the run. `race_variants` (called by graph_profile with the runners of each variant) races float32,
Grappler's lists, the cut and, where the graph rules changed the model, the model as given, and `best_across`
decides: the baseline is the model as given; a variant much slower than it at any raced batch is out; of the rest,
the least geometric mean of the time over the baseline's wins, the cut unless another gains more than the timing
resolves. Without a batch size from the user the race runs at RACE_BATCHES and the line says what each batch
showed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .graph_runs import WARMUP, VariantError, made_up_values, race

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
            ms[size] = race(runners, *_race_runs(size, batch), names=[_named(v) for v in names])
        except VariantError:  # none runs at this size (a shape fixed in the graph): best_across leaves it out
            ms[size] = [np.inf] * len(runners)
    keep, said = best_across(ms, names, where)
    at = ms.get(batch)
    raced = () if at is None else (at[0], at[1], at[names.index("cut")] if with_cut else at[1])
    return dataclasses.replace(table, keep=keep, note=f"{table.note}; {said}"), raced


def demotes(cut) -> bool:
    """Whether the cut (a RewriteResult) moved some candidate of the lists to float32: a graph of its own."""
    return any(r.assignment.demoted for r in (cut, *cut.functions.values()) if r.assignment)


def verdict(table, raced, where: str = ""):
    """The table with what one race of float32, the lists and the cut (ms per run, in that order) showed, as
    `best_across` decides (analysis.step_profile's race of a training step)."""
    keep, said = best_across({None: list(raced)}, ("float32", "lists", "cut"), where)
    return dataclasses.replace(table, keep=keep, note=f"{table.note}; {said}")


def best_across(ms: dict, names=("float32", "lists", "cut"), where: str = "") -> tuple:
    """Which variant to keep, given each one's ms per run ({batch size, or None: [ms per variant in `names`]}).

    The baseline is the model as given: "source" where it was raced (the rules changed it), else "float32". A
    variant slower than the baseline by more than SLOWER at any batch is out (the baseline never is); of the rest,
    the one whose time over the baseline's has the least geometric mean across the batches wins -- what the
    assignment keeps by itself (the cut, or the lists when there is no cut of their own), unless another gains
    more than RESOLUTION on it. A batch the baseline could not run at (infinite) is left out, and said.

    Returns:
        (keep, line): the table's `keep` ("" for what the assignment keeps by itself, else "lists", "float32" or
        "source") and what the race showed.
    """
    from ..core.assignment import RESOLUTION
    base = names.index("source") if "source" in names else 0
    failed = [b for b, t in ms.items() if not np.isfinite(t[base])]
    ms = {b: t for b, t in ms.items() if b not in failed}
    sizes = ", ".join(map(str, failed))
    if not ms:
        return names[base], f"{_named(names[base])} did not run at batch {sizes}: it is kept"
    ratio = {v: [t[i] / t[base] for t in ms.values()] for i, v in enumerate(names)}
    score = {v: float(np.exp(np.mean(np.log(r)))) for v, r in ratio.items() if max(r) <= 1 + SLOWER}
    best = min(score, key=score.get)
    mine = "cut" if "cut" in names else "lists"
    if mine in score and score[mine] <= (1 + RESOLUTION) * score[best]:
        best = mine
    at = f" at batch {', '.join(map(str, ms))}" if None not in ms else ""
    each = "; ".join(f"{_named(v)} " + " / ".join(f"{t[i]:.1f}" for t in ms.values()) for i, v in enumerate(names))
    worst = {v: max(zip(r, ms)) for v, r in ratio.items()}  # (ratio, batch) where each is slowest
    out = [f"{_named(v)} " + (f"{worst[v][0]:.2f}x" if np.isfinite(worst[v][0]) else "did not run")
           + (f" at batch {worst[v][1]}" if at else "") for v in names if v not in score]
    slower, where_slower = worst[best]
    # Where a variant left out ran faster than the one kept: a model for that batch alone would gain.
    gains = [(x, size, v) for v, r in ratio.items() if v not in score
             for x, size, kept in zip(r, ms, ratio[best]) if x < (1 - RESOLUTION) * kept]
    hint = ""
    if gains and at:
        fastest, size, variant = min(gains)
        hint = f"; at batch {size} {_named(variant)} ran {fastest:.2f}x: --batch-size {size} chooses for that batch"
    said = (f"raced{where}{at} ({each} ms per run): {_named(best)} kept"
            + (", the best across them" if len(ms) > 1 else "")
            + (f" (out, over {1 + SLOWER:.2f}x {_named(names[base])}'s time: {', '.join(out)}{hint})" if out else "")
            + (f"; it runs {slower:.2f}x {_named(names[base])}'s time at batch {where_slower} (--batch-size "
               f"{where_slower} chooses for that batch)" if len(ms) > 1 and slower > 1 + RESOLUTION else "")
            + (f"; {_named(names[base])} did not run at batch {sizes}" if failed else ""))
    return ("" if best == mine else best), said


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
