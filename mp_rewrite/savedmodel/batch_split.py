"""Per-core branches (`convert --freeze --split auto|N|off`): a frozen signature whose batch is cut into N slices,
the graph called once per slice inside one tf.function (TensorFlow's inter-op pool runs the calls at once) and the
outputs concatenated on axis 0.

TensorFlow hands each small oneDNN primitive of one call to its intra-op pool and waits; served with one intra-op
thread (TF_NUM_INTRAOP_THREADS=1, tf.config.threading.set_intra_op_parallelism_threads(1), TF Serving's
--tensorflow_intra_op_parallelism=1), N concurrent calls on slices of the batch use the cores with no hand-off.

Only where the batch-rows analysis (analysis/batch_rows.py) proves that every output row depends on the same input
rows alone, and a check on random inputs agrees, bit for bit (mixed_samples: no slice's outputs move when the other
samples change, the split equals the graph called on each slice, a batch smaller than N runs whole). "auto" times
the whole call and the splits here and, in a child process, in the other serving setting (split_timing.py: one
intra-op thread, TF's default threads), and keeps a split only where it measured faster than the whole call beyond
the noise at every batch timed in one setting and not slower in the other (a tie keeps the graph whole): the split
never makes a model slower in either setting. A timing whose branches got no second core cannot judge the split
(split_timing.busy_timing: the graph stays whole, said); times that could are kept per graph and machine
(timing_cache.py), so the same graph converted again here gets the same verdict however busy the machine is then.

Batch 1 is decided apart (row_choice.py): one sample's token rows in 2 branches, routed to inside the frozen graph
(a Switch on the batch) where the plan exists, the check passes at batch 1 and, for "auto", it measured faster
there (row_verdict).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics

from ..analysis.batch_rows import batch_rows
from ..analysis.profile_cache import graph_bytes
from ..analysis.shapes import node_shapes
from .frozen_function import imported_function
from .row_choice import ROW_CALLS, ROW_PARTS, RowChoice, joined, row_function
from .split_option import SERVE, split_function
from .split_timing import CALLS, FASTER, ONE_THREAD, SETTINGS, feeds, saved_functions, split_ratio, times_in_both

SHAPE_BATCH = 7  # the batch the analysis infers shapes at: odd and prime, so a row count tells its k apart
TIMED_BATCHES = (8, 32)
NOT_JUDGED = "convert again on a quiet machine, or --split N writes N branches without timing them"


@dataclasses.dataclass(frozen=True)
class SplitChoice:
    """What a signature's batch split became, and why (the convert line).

    Attributes:
        branches: N slices (1: the graph runs whole).
        why: the reason, with what was measured.
        times: {serving setting: {(batch, branches): [ms per call, round by round]}} measured for "auto" (empty
            otherwise); at batch 1, branches N is the token-row split in N.
        rows: token-row branches at batch 1 (row_choice.py; 1: batch 1 runs whole).
        least: the smallest batch split (0: N -- a batch smaller than the branches runs whole); for "auto", the
            smallest batch timed from which the split measured faster, where it did not at a smaller one.
    """

    branches: int
    why: str
    times: dict = dataclasses.field(default_factory=dict)
    rows: int = 1
    least: int = 0


def split_signature(graph_def, frozen, captured, split, exact: bool, say=lambda what: None):
    """(the signature's tf.function, a SplitChoice): the frozen graph whole, or split into N branches.

    Args:
        graph_def: the frozen, rewritten graph; frozen: its FrozenSignature (inputs, outputs, shapes);
        captured: [(placeholder, owner)] as frozen_function.as_function takes them.
        split: "off", "auto" or N (split_option.parse_split).
        exact: the graph computes in float32 (batch 1's token rows must then equal the whole graph bit for bit).
        say: told each stage that takes a while ("timing the split ..."), for a progress bar.
    """
    imported, specs = imported_function(graph_def, frozen.inputs, frozen.outputs, captured)
    whole = _function(imported, specs, list(frozen.outputs), frozen.shapes, (), 1)
    if split == "off":
        return whole, SplitChoice(1, "off")
    graph = functools.cache(lambda: graph_bytes(graph_def))  # what timed splits are kept under: read once, if timed
    imported, at_one = _batch_one(graph_def, graph, frozen, captured, imported, specs, whole, split, exact, say)
    function, choice = _batch_split(graph_def, graph, frozen, captured, imported, specs, split, say)
    times = {s: {**at_one.times.get(s, {}), **choice.times.get(s, {})} for s in {**at_one.times, **choice.times}}
    return function, dataclasses.replace(choice, why=joined(choice.why, choice.branches, at_one), times=times,
                                         rows=at_one.rows)


def _batch_one(graph_def, graph, frozen, captured, imported, specs, whole, split, exact: bool, say):
    """(the frozen graph to call: `imported`, or the one routing batch 1 to its token rows (row_choice's), a
    RowChoice): what batch 1 runs. `graph()` gives the graph's bytes, what its times are kept under."""
    routed, why = row_function(graph_def, frozen, captured)
    if routed is None:
        return imported, RowChoice(1, f"runs whole: {why}")
    candidate = _function(routed, specs, list(frozen.outputs), frozen.shapes, (), 1)
    unequal = unequal_outputs(whole, candidate, specs, exact, (1, 3), "in token rows")
    if unequal:
        return imported, RowChoice(1, f"runs whole: {unequal}")
    if split != "auto":
        return routed, RowChoice(ROW_PARTS, f"token rows in {ROW_PARTS} branches (proven, and equal to "
                                                     "the whole graph at batch 1)")
    runners = {1: whole, ROW_PARTS: candidate}
    say(f"timing batch 1 in token rows, {SETTINGS}")
    timed = times_in_both(runners, specs, [(1, ROW_CALLS, [1, ROW_PARTS])],
                          lambda: saved_functions(runners, captured), graph())
    choice = row_verdict(timed.times, timed.untimed, timed.busy, timed.note())
    return (routed if choice.rows > 1 else imported), choice


def _batch_split(graph_def, graph, frozen, captured, imported, specs, split, say):
    """(the function, a SplitChoice): `imported` called whole, or once per slice of the batch in N branches.
    `graph()` gives the graph's bytes, what its times are kept under."""
    whole = _function(imported, specs, list(frozen.outputs), frozen.shapes, (), 1)
    inputs = {name: (None if spec.shape.rank is None else tuple(spec.shape.as_list())) for spec, name in frozen.inputs}
    found = batch_rows(graph_def, inputs, frozen.fetches, node_shapes(graph_def, batch=SHAPE_BATCH), SHAPE_BATCH)
    if not found.splittable:
        return whole, SplitChoice(1, f"not split: {found.reason}")
    carried = tuple(name in found.batch_inputs for _, name in frozen.inputs)
    made = {n: _function(imported, specs, list(frozen.outputs), frozen.shapes, carried, n)
            for n in split_candidates(split)}
    for n, function in made.items():
        unequal = mixed_samples(whole, function, specs, n)
        if unequal:
            return whole, SplitChoice(1, f"not split: {unequal}")
    if split != "auto":
        return made[split], SplitChoice(split, f"split in {split} branches, as asked; {SERVE}")
    say(f"timing the split, {SETTINGS}")
    choice = chosen_split(whole, made, specs, lambda: saved_functions({1: whole, **made}, captured), graph())
    if choice.branches == 1:
        return whole, choice
    if not choice.least:
        return made[choice.branches], choice
    # The checked split with its first split batch raised: the same branches, called from there.
    return _function(imported, specs, list(frozen.outputs), frozen.shapes, carried, choice.branches,
                     choice.least), choice


def split_candidates(split) -> list[int]:
    """The numbers of branches to try: N as asked, or for "auto" 2 and the number of cores (at most 8)."""
    return [split] if split != "auto" else sorted({2, min(8, os.cpu_count() or 2)})


def split_lines(graphs: dict) -> list[str]:
    """One line per frozen graph whose split was asked for ("auto" or N): what it became and why. Signatures of
    one function share one graph ({label: RewriteResult with a `split` SplitChoice}) and are named together."""
    shared = {}
    for label, result in graphs.items():
        shared.setdefault(id(result), (result, []))[1].append(label)
    return [f"{', '.join(labels)}: {result.split.why}" for result, labels in shared.values()
            if getattr(result, "split", None) is not None and result.split.why != "off"]


def _function(imported, specs, keys, shapes, carried, branches: int, least: int = 0):
    """A tf.function calling `imported` whole (branches 1) or once per slice of the `carried` inputs' batch, where
    the batch has `least` samples or more (0: `branches`)."""
    import tensorflow as tf

    def whole(args):
        return list(imported(*args))

    def sliced(args):
        batch = tf.shape(args[carried.index(True)])[0]
        sizes = batch // branches + tf.cast(tf.range(branches) < batch % branches, tf.int32)
        pieces = [tf.split(a, sizes, num=branches) if c else [a] * branches for a, c in zip(args, carried)]
        results = [imported(*[p[i] for p in pieces]) for i in range(branches)]
        return [tf.concat([r[j] for r in results], 0) for j in range(len(keys))]

    def run(*args):
        if branches == 1:
            outputs = whole(args)
        else:  # a batch smaller than the branches, or than `least`, runs whole
            batch = tf.shape(args[carried.index(True)])[0]
            outputs = tf.cond(batch >= (least or branches), lambda: sliced(args), lambda: whole(args))
        results = dict(zip(keys, outputs))
        for key, shape in (shapes or {}).items():
            results[key].set_shape(shape)  # a shape Grappler computed from folded weights, kept when they are not
        return results

    if branches > 1:  # a name `inspect` finds in the written model
        run.__name__ = split_function(branches, least)
    return tf.function(run, input_signature=specs, autograph=False)


def unequal_outputs(whole, other, specs, exact: bool, batches, what: str) -> str:
    """"" if the function `other`'s outputs (`other(*tensors)` -> {key: tensor}, as `whole`, on inputs made from the
    TensorSpecs `specs`) equal the whole one's at each of `batches`: bit for bit where `exact` (the graph computes
    in float32), within round-off (1e-2) where it computes in low precision; else why (`what` names `other`)."""
    import numpy as np
    for batch in batches:
        tensors = feeds(specs, batch, seed=batch)
        want, got = whole(*tensors), other(*tensors)
        for key in want:
            a, b = want[key].numpy(), got[key].numpy()
            if a.shape != b.shape:
                return f"output {key} is {b.shape} {what}, {a.shape} whole (batch {batch})"
            same = np.array_equal(a, b, equal_nan=True) if exact or not np.issubdtype(a.dtype, np.floating) else \
                np.allclose(a.astype(np.float32), b.astype(np.float32), rtol=1e-2, atol=1e-2, equal_nan=True)
            if not same:
                return (f"output {key} {what} differs from the whole call at batch {batch} (largest "
                        f"difference {np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))):.3g})")
    return ""


def mixed_samples(whole, split, specs, branches: int) -> str:
    """"" if the batch split is what the analysis proved it to be, else why. On inputs made from the TensorSpecs
    `specs` (an input of rank >= 1 with an unknown axis 0 carries the batch), bit for bit in every precision:

    1. at an odd batch B (7, or 2N + 1 for more branches), each slice's rows of the whole call's outputs stay the
       same when every other sample is changed: no output row depends on another sample;
    2. at B, the split call (`split(*tensors)` -> {key: tensor}, as `whole`) equals the whole graph called on each
       slice (4 + 3 for two branches), concatenated: the slices are cut and put back in order;
    3. at N - 1 samples (run whole), the split call equals the whole one.

    The split call is not compared with the whole call at B itself: oneDNN blocks a matmul or a convolution by
    its rows, so the same graph at B and at B / N may round differently (2e-6 in float32 on a ViT, 0.08 in
    bfloat16), as a model called at two batch sizes does anyway."""
    import numpy as np
    import tensorflow as tf
    batch = max(SHAPE_BATCH, 2 * branches + 1)
    given, others = feeds(specs, batch, seed=batch), feeds(specs, batch, seed=batch + 1)
    carried = [bool(spec.shape.rank) and spec.shape[0] is None for spec in specs]
    bounds = np.cumsum([0] + [batch // branches + (i < batch % branches) for i in range(branches)])
    slices = list(zip(bounds[:-1], bounds[1:]))
    want = _arrays(whole(*given))
    for lo, hi in slices:
        changed = [tf.concat([o[:lo], f[lo:hi], o[hi:]], 0) if c else f for f, o, c in zip(given, others, carried)]
        for key, got in _arrays(whole(*changed)).items():
            if not _same(want[key][lo:hi], got[lo:hi]):
                return (f"output {key} of samples {lo}-{hi - 1} changes when the other samples of the batch change "
                        f"(batch {batch}): the graph mixes the samples of a batch")
    pieces = [_arrays(whole(*[f[lo:hi] if c else f for f, c in zip(given, carried)])) for lo, hi in slices]
    for key, got in _arrays(split(*given)).items():
        expected = np.concatenate([piece[key] for piece in pieces])
        if not _same(expected, got):
            return f"output {key} split in {branches} differs from the graph called on each slice (batch {batch})"
    small = feeds(specs, max(1, branches - 1), seed=branches)
    want = _arrays(whole(*small))
    for key, got in _arrays(split(*small)).items():
        if not _same(want[key], got):
            return f"output {key} differs from the whole call at batch {max(1, branches - 1)}, which runs whole"
    return ""


def _arrays(outputs: dict) -> dict:
    return {key: value.numpy() for key, value in outputs.items()}


def _same(a, b) -> bool:
    import numpy as np
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.inexact))


def chosen_split(whole, made: dict, specs, places, graph: bytes) -> SplitChoice:
    """Race the whole call and each split ({branches: function}), interleaved, at TIMED_BATCHES, in this process's
    serving setting and in the other one (split_timing: `places()` is a context yielding the candidates' SavedModels
    for its child process, keyed as `made` and 1 for the whole call, or why there are none), or read an earlier
    conversion's times of the same `graph` (the bytes the candidates are made from: timing_cache): what
    split_verdict says of them."""
    races = [(batch, CALLS, [1, *made]) for batch in TIMED_BATCHES]
    timed = times_in_both({1: whole, **made}, specs, races, places, graph)
    return split_verdict(timed.times, timed.untimed, timed.busy, timed.note())


def split_verdict(times: dict, untimed: str = "", busy: str = "", note: str = "") -> SplitChoice:
    """The split to keep from measured times: a number of branches and the smallest batch timed B from which it
    measured faster than the whole call (1) beyond the noise at every batch timed in some serving setting, and not
    slower at any of those batches in any setting timed -- a split that wins with one intra-op thread and loses
    with TF's default threads would make the model slower where it is served so --; of those, the smallest B, then
    the least in sum of its ratios to the whole call from B up; else 1 (a tie keeps the graph whole). Where B is
    not the smallest batch timed, the batches below B run whole (SplitChoice.least: keras-hub BERT and GPT-2 split
    slower at batch 8 with TF's default threads and faster at 32, docs/batch_split.md). Faster and slower are
    _faster's and _slower's: read round by round (split_timing.split_ratio).

    Args:
        times: {setting: {(batch, branches): [ms per call, round by round]}}, with branches 1 for the whole call
            at every batch; this process's setting first.
        untimed: why a setting was not timed ("" where both were), said in the line.
        busy: why the timing cannot judge a split (split_timing.busy_timing), or "": then the graph stays whole.
        note: where the times were read from (split_timing.Timed.note), said after them.
    """
    measured = "; ".join(f"with {s}: {_measured(t)}" for s, t in times.items())
    if busy:
        return SplitChoice(1, f"not split: {busy} ({measured}); {NOT_JUDGED}", times)
    ratios = {s: {(b, n): split_ratio(t[b, 1], walls) for (b, n), walls in t.items() if n > 1}
              for s, t in times.items()}
    splits = sorted({n for r in ratios.values() for _, n in r})
    batches = sorted({b for r in ratios.values() for b, _ in r})

    def faster_in(n: int, least: int) -> list[str]:  # the settings where n branches win at every batch from `least`
        return [s for s, r in ratios.items() if all(_faster(x) for (b, m), x in r.items() if m == n and b >= least)]

    def slower_in(n: int, least: int) -> list[str]:  # the settings where n branches lose at some batch from `least`
        return [s for s, r in ratios.items() if any(_slower(x) for (b, m), x in r.items() if m == n and b >= least)]

    winners = [(least, n) for n in splits for least in batches if faster_in(n, least) and not slower_in(n, least)]
    hint = _hint(untimed, next(iter(times))) + note
    if not winners:
        first = batches[0]
        mixed = next((n for n in splits if faster_in(n, first) and slower_in(n, first)), None)
        if mixed is None:
            return SplitChoice(1, f"not split: no split measured faster beyond the noise with {' or '.join(times)} "
                                  f"({measured}){hint}", times)
        faster, slower = faster_in(mixed, first), slower_in(mixed, first)
        return SplitChoice(1, f"not split: {mixed} branches measured faster with {' and '.join(faster)} but "
                              f"slower with {' and '.join(slower)} ({measured}): the split would make the model "
                              f"slower served so; --split {mixed} writes it for {' and '.join(faster)}{hint}", times)
    least, best = min(winners, key=lambda w: (w[0], sum(x.mid for r in ratios.values() for (b, m), x in r.items()
                                                        if m == w[1] and b >= w[0])))
    faster = faster_in(best, least)
    level = [s for s in times if s not in faster]
    from_here = (f"split in {best} branches: faster at every batch timed" if least == batches[0] else
                 f"split in {best} branches from batch {least}: faster at every batch timed from {least} up")
    return SplitChoice(best, f"{from_here} with {' and '.join(faster)}"
                             + (f", not slower with {' and '.join(level)}" if level else "")
                             + _below(best, least, faster, ratios) + f" ({measured}){hint}; {SERVE}", times,
                       least=0 if least == batches[0] else least)


def _below(branches: int, least: int, faster: list, ratios: dict) -> str:
    """"; smaller batches run whole (batch 8: 2 branches slower with TF's default threads)": why the batches timed
    below `least` are not split ("" where none is); `faster`: the settings where the split wins from `least` up."""
    def why(b):
        slower = [s for s, r in ratios.items() if _slower(r[b, branches])]
        return (f"batch {b}: {branches} branches slower with {' and '.join(slower)}" if slower else
                f"batch {b}: {branches} branches not faster beyond the noise with {' and '.join(faster)}")
    below = [why(b) for b in sorted({b for r in ratios.values() for b, _ in r}) if b < least]
    return f"; smaller batches run whole ({'; '.join(below)})" if below else ""


def _faster(ratio) -> bool:
    """Whether a split's time over the whole call's (a Ratio) is below 1 beyond the noise -- every round but the
    interval's outliers faster -- and by more than the tie (FASTER)."""
    return ratio.high < 1 and ratio.mid < FASTER


def _slower(ratio) -> bool:
    """Whether a split's time over the whole call's is above the tie (1 / FASTER): its median, so that "never
    slower" does not lean on the noise. Read beyond the noise instead (the whole interval above 1 / FASTER, as the
    precision race reads a variant slower), keras-hub GPT-2's split was kept at 1.04x and 1.07x by the median at
    batch 8 with TF's default threads (intervals 0.92-1.15x and 0.91-1.25x), and served so it then ran 1.22x
    --freeze's time (docs/batch_split.md): the conversion's timing under-reads that loss, so the median decides."""
    return ratio.mid > 1 / FASTER


def _measured(times: dict) -> str:
    """"batch 8: whole 14.4 ms, 2 branches 8.3 ms (per round 0.58x, 0.55-0.61x); batch 32: ..." of {(batch,
    branches): [ms per call, round by round]}: medians, and each split's ratio to the whole call with its
    interval."""
    def one(b, n):
        if n == 1:
            return f"whole {statistics.median(times[b, n]):.1f} ms"
        return f"{n} branches {statistics.median(times[b, n]):.1f} ms ({_ratio_text(times[b, 1], times[b, n])})"
    batches = sorted({b for b, _ in times})
    return "; ".join(f"batch {b}: " + ", ".join(one(b, n) for n in sorted(m for c, m in times if c == b))
                     for b in batches)


def _ratio_text(whole, split) -> str:
    """"per round 0.58x, 0.55-0.61x": a split's time over the whole call's, the median of the rounds' ratios (not
    the ratio of the medians beside it: the two can fall on either side of 1), and its interval."""
    r = split_ratio(whole, split)
    return f"per round {r.mid:.2f}x, {r.low:.2f}-{r.high:.2f}x"


def _hint(untimed: str, here: str) -> str:
    """The line's note on a setting not timed, and how to choose for one intra-op thread then."""
    if not untimed:
        return ""
    return f"; {untimed}" + ("" if here == ONE_THREAD else "; to choose for one intra-op thread, convert with "
                             "TF_NUM_INTRAOP_THREADS=1")


def row_verdict(times: dict, untimed: str = "", busy: str = "", note: str = "") -> RowChoice:
    """Batch 1's choice from measured times, by split_verdict's rule: the token-row split if faster than the whole
    call beyond the noise in some serving setting timed and not slower in any; else whole.

    Args:
        times: {setting: {(1, 1): the whole call's ms per call round by round, (1, ROW_PARTS): the row split's}},
            this process's first.
        untimed: why a setting was not timed ("" where both were), said in the line.
        busy: why the timing cannot judge the split (split_timing.busy_timing), or "": then batch 1 runs whole.
        note: where the times were read from (split_timing.Timed.note), said after them.
    """
    ratio = {s: split_ratio(t[1, 1], t[1, ROW_PARTS]) for s, t in times.items()}
    faster = [s for s, x in ratio.items() if _faster(x)]
    slower = [s for s, x in ratio.items() if _slower(x)]
    measured = "; ".join(f"{statistics.median(t[1, ROW_PARTS]):.2f} ms against whole {statistics.median(t[1, 1]):.2f}"
                         f" ms with {s} ({_ratio_text(t[1, 1], t[1, ROW_PARTS])})" for s, t in times.items())
    if busy:
        return RowChoice(1, f"runs whole: {busy} ({measured}); {NOT_JUDGED}", times)
    hint = _hint(untimed, next(iter(times))) + note
    if faster and not slower:
        return RowChoice(ROW_PARTS, f"token rows in {ROW_PARTS} branches, {measured}{hint}", times)
    if faster:
        return RowChoice(1, f"runs whole: token rows in {ROW_PARTS} branches faster with {' and '.join(faster)} but "
                            f"slower with {' and '.join(slower)} ({measured}){hint}", times)
    return RowChoice(1, f"runs whole: token rows in {ROW_PARTS} branches not faster beyond the noise ({measured})"
                        f"{hint}", times)
