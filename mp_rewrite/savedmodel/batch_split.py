"""Per-core branches (`convert --freeze --split auto|N|off`): a frozen signature whose batch is cut into N slices,
the graph called once per slice inside one tf.function (TensorFlow's inter-op pool runs the calls at once) and the
outputs concatenated on axis 0.

TensorFlow hands each small oneDNN primitive of one call to its intra-op pool and waits; served with one intra-op
thread (TF_NUM_INTRAOP_THREADS=1, tf.config.threading.set_intra_op_parallelism_threads(1), TF Serving's
--tensorflow_intra_op_parallelism=1), N concurrent calls on slices of the batch use the cores with no hand-off.

Only where the batch-rows analysis (analysis/batch_rows.py) proves that every output row depends on the same input
rows alone, and a check on random inputs agrees, bit for bit (mixed_samples: no slice's outputs move when the other
samples change, the split equals the graph called on each slice to ULPS units in the last place, a batch smaller
than N runs whole). "auto" times the whole call and the splits here and, in a child process, in the other serving
setting (split_timing.py: one intra-op thread, TF's default threads), and keeps a split only where it measured
faster than the whole call beyond the noise at every batch timed from some batch up in one setting and not slower in
the other (split_verdict.py; a tie keeps the graph whole): the split never makes a model slower in either setting. A
timing other processes disturbed cannot judge the split (split_timing.busy_timing: the graph stays whole, said);
times that could are kept per graph and machine (timing_cache.py), so the same graph converted again here gets the
same verdict however busy the machine is then.

Batch 1 is decided apart (row_choice.py): one sample's token rows in 2 branches, routed to inside the frozen graph
(a Switch on the batch) where the plan exists, the check passes at batch 1 and, for "auto", it measured faster
there (split_verdict.row_verdict).
"""

from __future__ import annotations

import dataclasses
import functools
import os

from ..analysis.batch_rows import batch_rows
from ..analysis.profile_cache import graph_bytes
from ..analysis.shapes import node_shapes
from ..errors import tf_reason
from .frozen_function import imported_function
from .row_choice import ROW_CALLS, ROW_PARTS, RowChoice, row_function, rows_least, with_rows
from .split_option import SERVE, split_function
from .inputs import DEFAULT_DIM
from .split_timing import CALLS, SETTINGS, feeds, learned_specs, saved_functions, times_in_both
from .split_verdict import SplitChoice, row_verdict, split_verdict

SHAPE_BATCH = 7  # the batch the analysis infers shapes at: odd and prime, so a row count tells its k apart
SHAPE_OTHER = 11  # any other unknown input dimension, there: odd, prime, and not SHAPE_BATCH
TIMED_BATCHES = (8, 32)
ROUND_OFF = 1e-2  # a low-precision difference round-off explains: value by value, or by norm (within_round_off)
ROW_ULPS = 16  # the same in float32, in units of its last place: batch 1's token rows against the whole graph
ULPS = 4  # units in the last place a split may differ from the whole graph called on its slices (mixed_samples)
PROBED_BATCHES = (16,)  # timed too where the split won from a larger batch only: where between does it begin?


def split_signature(graph_def, frozen, captured, split, exact: bool, say=lambda what: None, dim: int = DEFAULT_DIM):
    """(the signature's tf.function, a SplitChoice): the frozen graph whole, or split into N branches.

    Args:
        graph_def: the frozen, rewritten graph; frozen: its FrozenSignature (inputs, outputs, shapes);
        captured: [(placeholder, owner)] as frozen_function.as_function takes them.
        split: "off", "auto" or N (split_option.parse_split).
        exact: the graph computes in float32 (batch 1's token rows must then equal the whole graph bit for bit).
        say: told each stage that takes a while ("timing the split ..."), for a progress bar.
        dim: the length "auto" times an unknown input dimension after the batch at (--seq-len).
    """
    import tensorflow as tf

    imported, specs = imported_function(graph_def, frozen.inputs, frozen.outputs, captured)
    whole = _function(imported, specs, list(frozen.outputs), frozen.shapes, (), 1)
    if split == "off":
        return whole, SplitChoice(1, "off")
    specs = learned_specs(whole, specs, dim)
    graph = functools.cache(lambda: graph_bytes(graph_def))  # what timed splits are kept under: read once, if timed
    try:
        imported, at_one = _batch_one(graph_def, graph, frozen, captured, imported, specs, whole, split, exact, say,
                                      dim)
        function, choice = _batch_split(graph_def, graph, frozen, captured, imported, specs, split, say, dim)
    except tf.errors.OpError as e:  # the checks and the timing run the model on made-up inputs (ids < 1000)
        return whole, SplitChoice(1, f"not split: {failed_check(whole, specs, dim, e)}")
    return function, with_rows(choice, at_one)


def failed_check(whole, specs, dim: int, error) -> str:
    """Why the split's check or timing stopped on a TensorFlow `error`: the model's own, on the made-up inputs
    (ids past a vocabulary smaller than theirs), or the split's (a bug of ours). Frozen and in place."""
    if not _runs(whole, specs, 3, dim):
        return f"the split's check runs the model on made-up inputs, and the model failed on them ({tf_reason(error)})"
    return (f"the split failed where the model runs ({tf_reason(error)}); this is a bug of mp-rewrite, please report "
            "it with the model")


def _batch_one(graph_def, graph, frozen, captured, imported, specs, whole, split, exact: bool, say, dim: int):
    """(the frozen graph to call: `imported`, or the one routing batch 1 to its token rows (row_choice's), a
    RowChoice): what batch 1 runs. `graph()` gives the graph's bytes; the times are kept under them and the routed
    graph's, so a change to the row split's plan times it again."""
    least = rows_least(split, dim)
    routed, made, plan = row_function(graph_def, frozen, captured, SHAPE_OTHER, least)  # made: the GraphDef, or why
    if routed is None:
        return imported, RowChoice(1, f"runs whole: {made}")
    candidate = _function(routed, specs, list(frozen.outputs), frozen.shapes, (), 1)
    choice = decided_rows(whole, candidate, specs, (split, exact, dim, least, plan.unknown_length),
                          lambda: saved_functions({1: whole, ROW_PARTS: candidate}, captured),
                          graph() + graph_bytes(made), say)
    return (routed if choice.rows > 1 else imported), choice


def decided_rows(whole, candidate, specs, asked: tuple, places, graph: bytes, say=lambda what: None) -> RowChoice:
    """What batch 1 runs, frozen and in place: `candidate` (its token rows in ROW_PARTS branches) where it equals
    the `whole` call at batch 1 and 3 but for round-off (unequal_outputs) and, for "auto", measured faster at batch 1
    in one serving setting and not slower in the other (split_verdict.row_verdict: `places()` and `graph` as
    chosen_split takes them). `asked` is (split, exact, dim, least, unknown_length): a length the graph leaves
    unknown is checked at `dim` and at a length of the other parity (uneven slices: one below, or above where below
    is not routed to the rows, `least` tokens) where the model accepts it, and timed at `dim` (--seq-len)."""
    split, exact, dim, least, unknown_length = asked
    longer = max(dim, least)
    lengths = ([n for n in (longer, longer - 1 if longer > least else longer + 1) if _runs(whole, specs, 1, n)]
               or [longer]) if unknown_length else [dim]
    unequal = next(filter(None, (unequal_outputs(whole, candidate, specs, exact, (1, 3), "in token rows", length)
                                 for length in lengths)), "")
    if unequal:
        return RowChoice(1, f"runs whole: {unequal}")
    unknown = f" (an unknown length: samples of {least} tokens or more)" if unknown_length else ""
    if split != "auto":
        return RowChoice(ROW_PARTS, f"token rows in {ROW_PARTS} branches{unknown} (proven, and equal to the whole "
                                    "graph at batch 1 but for round-off)")
    say(f"timing batch 1 in token rows, {SETTINGS}")
    timed = times_in_both({1: whole, ROW_PARTS: candidate}, specs, [(1, ROW_CALLS, [1, ROW_PARTS])], places, graph,
                          dim)
    return row_verdict(timed.times, timed.untimed, timed.busy, timed.note(), unknown)


def _runs(whole, specs, batch: int, dim: int) -> bool:
    """Whether the whole call runs on made-up inputs (`feeds`) of `batch` samples, an unknown length `dim` long: a
    length a model refuses (past its positions: BERT's 129 of 128) is not one a caller can send."""
    import tensorflow as tf
    try:
        whole(*feeds(specs, batch, seed=batch, dim=dim))
    except tf.errors.OpError:
        return False
    return True


def _batch_split(graph_def, graph, frozen, captured, imported, specs, split, say, dim: int):
    """(the function, a SplitChoice): `imported` called whole, or once per slice of the batch in N branches.
    `graph()` gives the graph's bytes, what its times are kept under; `dim`, the length "auto" times at."""
    whole = _function(imported, specs, list(frozen.outputs), frozen.shapes, (), 1)
    found = analysed(graph_def, frozen)
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
    choice = chosen_split(whole, made, specs, lambda: saved_functions({1: whole, **made}, captured), graph(), dim)
    if choice.branches == 1:
        return whole, choice
    if not choice.least:
        return made[choice.branches], choice
    # The checked split with its first split batch raised: the same branches, called from there.
    return _function(imported, specs, list(frozen.outputs), frozen.shapes, carried, choice.branches,
                     choice.least), choice


def analysed(graph_def, frozen):
    """The batch-rows analysis (analysis.batch_rows.BatchRows) of a frozen signature's graph, its shapes inferred at
    batch SHAPE_BATCH and every other unknown input dimension (a sequence's length) at SHAPE_OTHER: a reshape that
    merges each sample's tokens into rows, or a Tensordot's size computed from the shape, is then read at one known
    size, as the batch is. That proves the split at those sizes; the check (mixed_samples) runs it on inputs of
    other sizes, and a graph whose rows depended on the length would not run at every length anyway."""
    inputs = {name: (None if spec.shape.rank is None else tuple(spec.shape.as_list())) for spec, name in frozen.inputs}
    shapes = node_shapes(graph_def, batch=SHAPE_BATCH, others=SHAPE_OTHER)
    return batch_rows(graph_def, inputs, frozen.fetches, shapes, SHAPE_BATCH)


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
    return tf.function(run, input_signature=list(specs), autograph=False)


def unequal_outputs(whole, other, specs, exact: bool, batches, what: str, dim: int = DEFAULT_DIM) -> str:
    """"" if the function `other`'s outputs (`other(*tensors)` -> {key: tensor}, as `whole`, on inputs made from the
    TensorSpecs `specs`, an unknown dimension after the batch `dim` long) equal the whole one's at each of
    `batches`, but for round-off (within_round_off): ROW_ULPS units in float32's last place where `exact` (the graph
    computes in float32: halves of an odd length may sum a matmul's rows in another order, 4.8 units of the largest
    value apart at 15 tokens in keras-hub's CLIP text encoder, 3.6 by norm, where 16 and 17 tokens were bit for
    bit), ROUND_OFF where it computes in low precision; else why (`what` names `other`)."""
    import numpy as np
    tolerance = ROW_ULPS * float(np.finfo(np.float32).eps) if exact else ROUND_OFF
    for batch in batches:
        tensors = feeds(specs, batch, seed=batch, dim=dim)
        want, got = whole(*tensors), other(*tensors)
        for key in want:
            a, b = want[key].numpy(), got[key].numpy()
            if a.shape != b.shape:
                return f"output {key} is {b.shape} {what}, {a.shape} whole (batch {batch})"
            x, y = a.astype(np.float64), b.astype(np.float64)
            if not (within_round_off(x, y, tolerance) if np.issubdtype(a.dtype, np.floating) else np.array_equal(a, b)):
                return (f"output {key} {what} differs from the whole call at batch {batch} (largest "
                        f"difference {np.max(np.abs(x - y)):.3g})")
    return ""


def within_round_off(a, b, tolerance: float = ROUND_OFF) -> bool:
    """Whether two computations of one output (float64 arrays) agree but for round-off: the same NaNs and
    infinities, and every value within `tolerance` (relative and absolute), or the difference's norm within
    `tolerance` of the output's. Value by value alone refuses a correct split of a large output: slices summed in
    another order differ by a few units in the last place where a value's low bits fall (a 4-layer keras-hub Llama
    in bfloat16 at 127 tokens: 125 of 32,512 values 2 bfloat16 units apart, 0.03 at 2; 0.4% by norm, where the whole
    graph is 1.0% from float32 and its rows 1.0% too). By norm alone refuses a small one (4 pooled values near 0.05,
    0.001 apart). A wrong row (a misplaced slice, a position off by one) moves a whole row: one row of 100 alike in
    size is 14% of the norm."""
    import numpy as np
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite], equal_nan=True):
        return False
    a, b = a[finite], b[finite]
    return bool(np.allclose(a, b, rtol=tolerance, atol=tolerance) or
                np.linalg.norm(a - b) <= tolerance * np.linalg.norm(a))


def mixed_samples(whole, split, specs, branches: int) -> str:
    """"" if the batch split is what the analysis proved it to be, else why. On inputs made from the TensorSpecs
    `specs` (an input of rank >= 1 with an unknown axis 0 carries the batch), bit for bit in every precision but
    where 2. says:

    1. at an odd batch B (7, or 2N + 1 for more branches), each slice's rows of the whole call's outputs stay the
       same when every other sample is changed: no output row depends on another sample;
    2. at B, the split call (`split(*tensors)` -> {key: tensor}, as `whole`) equals the whole graph called on each
       slice (4 + 3 for two branches), concatenated: the slices are cut and put back in order. To ULPS units in
       the last place of the output's type: in place, keras-hub BERT's float32 pooled output came out 1 unit
       (6e-8) apart, though the same body ran on the same rows (why is not known: perhaps a slice cut inside its
       batch's buffer takes another kernel path); cut or put back out of order, rows would differ by their values;
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
        if not _within_ulps(expected, got):
            return (f"output {key} split in {branches} differs from the graph called on each slice (batch {batch}, "
                    f"largest difference {_largest(expected, got)})")
    small = feeds(specs, max(1, branches - 1), seed=branches)
    want = _arrays(whole(*small))
    for key, got in _arrays(split(*small)).items():
        if not _same(want[key], got):
            return f"output {key} differs from the whole call at batch {max(1, branches - 1)}, which runs whole"
    return ""


def _within_ulps(a, b) -> bool:
    """Whether two arrays are equal to ULPS units in the last place of their floating type (bit for bit else)."""
    import ml_dtypes
    import numpy as np
    floating = np.issubdtype(a.dtype, np.floating) or a.dtype == ml_dtypes.bfloat16
    if a.shape != b.shape or a.dtype != b.dtype or not floating:
        return _same(a, b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(x) & np.isnan(y)
    allowed = ULPS * float(ml_dtypes.finfo(a.dtype).eps) * np.maximum(np.abs(x), np.abs(y))
    return bool(np.all(both_nan | (x == y) | (np.abs(x - y) <= allowed)))


def _largest(a, b) -> str:
    """The largest difference of two arrays, as a line says it ("shapes differ" where they do)."""
    import numpy as np
    if a.shape != b.shape:
        return f"shapes differ: {a.shape} against {b.shape}"
    return f"{np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0):.3g}"


def _arrays(outputs: dict) -> dict:
    return {key: value.numpy() for key, value in outputs.items()}


def _same(a, b) -> bool:
    import numpy as np
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.inexact))


def chosen_split(whole, made: dict, specs, places, graph: bytes, dim: int = DEFAULT_DIM) -> SplitChoice:
    """Race the whole call and each split ({branches: function}), interleaved, at TIMED_BATCHES, in this process's
    serving setting and in the other one (split_timing: `places()` is a context yielding the candidates' SavedModels
    for its child process, keyed as `made` and 1 for the whole call, or why there are none), or read an earlier
    conversion's times of the same `graph` (the bytes the candidates are made from: timing_cache): what
    split_verdict says of them. Where the split won only from a larger batch timed, it is timed again at the
    PROBED_BATCHES between, so that it begins at the first of those where it wins too. An unknown input dimension
    after the batch (a sequence's length) is timed at `dim`, and the line says so."""
    races = [(batch, CALLS, [1, *made]) for batch in TIMED_BATCHES]
    timed = times_in_both({1: whole, **made}, specs, races, places, graph, dim)
    length = f"; an unknown length timed as {dim} (--seq-len)" if any(
        spec.shape.rank and None in spec.shape.as_list()[1:] for spec in specs) else ""
    choice = split_verdict(timed.times, timed.untimed, timed.busy, timed.note() + length)
    between = [b for b in PROBED_BATCHES if choice.least and TIMED_BATCHES[0] < b < choice.least]
    if not between:
        return choice
    n = choice.branches
    probed = times_in_both({1: whole, n: made[n]}, specs, [(b, CALLS, [1, n]) for b in between], places, graph,
                           dim)
    if probed.busy or set(probed.times) != set(timed.times):  # the first verdict stands, and the line says why
        why, serve = probed.busy or probed.untimed, f"; {SERVE}"  # the advice stays last, where the line ends
        said = f"{choice.why.removesuffix(serve)}; batch {', '.join(map(str, between))} not judged: {why}"
        return dataclasses.replace(choice, why=said + serve * choice.why.endswith(serve))
    times = {s: {**t, **probed.times[s]} for s, t in timed.times.items()}
    return split_verdict(times, timed.untimed, "", (timed.note() or probed.note()) + length)
