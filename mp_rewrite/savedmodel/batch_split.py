"""Per-core branches (`convert --freeze --split auto|N|off`): a frozen signature whose batch is cut into N slices,
the graph called once per slice inside one tf.function (TensorFlow's inter-op pool runs the calls at once) and the
outputs concatenated on axis 0.

TensorFlow hands each small oneDNN primitive of one call to its intra-op pool and waits; served with one intra-op
thread (TF_NUM_INTRAOP_THREADS=1, tf.config.threading.set_intra_op_parallelism_threads(1), TF Serving's
--tensorflow_intra_op_parallelism=1), N concurrent calls on slices of the batch use the cores with no hand-off.

Only where the batch-rows analysis (analysis/batch_rows.py) proves that every output row depends on the same input
rows alone, and a check on random inputs agrees, bit for bit (mixed_samples: no slice's outputs move when the other
samples change, the split equals the graph called on each slice, a batch smaller than N runs whole). "auto" keeps
the split only where it measured faster than the whole call here, at every batch timed, beyond the noise (a tie
keeps the graph whole): the split never makes a model slower in the setting it was measured in.

Batch 1 is decided apart (row_choice.py): one sample's token rows in 2 branches, routed to inside the frozen graph
(a Switch on the batch) where the plan exists, the check passes at batch 1 and, for "auto", it measured faster
there (row_verdict).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

from ..analysis.batch_rows import batch_rows
from ..analysis.shapes import node_shapes
from .frozen_function import imported_function
from .inputs import signature_inputs
from .row_choice import ROW_CALLS, ROW_PARTS, RowChoice, joined, row_function
from .split_option import SERVE, SPLIT_FUNCTION

SHAPE_BATCH = 7  # the batch the analysis infers shapes at: odd and prime, so a row count tells its k apart
TIMED_BATCHES, ROUNDS, CALLS = (8, 32), 5, 4
FASTER = 0.97  # a split within 3% of the whole call is a tie: the graph stays whole
ONE_THREAD = "one intra-op thread"  # the setting a split model is served in (split_option.SERVE)


@dataclasses.dataclass(frozen=True)
class SplitChoice:
    """What a signature's batch split became, and why (the convert line).

    Attributes:
        branches: N slices (1: the graph runs whole).
        why: the reason, with what was measured.
        times: {(batch, branches): median ms per call} measured for "auto" (empty otherwise); at batch 1,
            branches N is the token-row split in N.
        rows: token-row branches at batch 1 (row_choice.py; 1: batch 1 runs whole).
    """

    branches: int
    why: str
    times: dict = dataclasses.field(default_factory=dict)
    rows: int = 1


def split_signature(graph_def, frozen, captured, split, exact: bool):
    """(the signature's tf.function, a SplitChoice): the frozen graph whole, or split into N branches.

    Args:
        graph_def: the frozen, rewritten graph; frozen: its FrozenSignature (inputs, outputs, shapes);
        captured: [(placeholder, owner)] as frozen_function.as_function takes them.
        split: "off", "auto" or N (split_option.parse_split).
        exact: the graph computes in float32 (batch 1's token rows must then equal the whole graph bit for bit).
    """
    imported, specs = imported_function(graph_def, frozen.inputs, frozen.outputs, captured)
    whole = _function(imported, specs, list(frozen.outputs), frozen.shapes, (), 1)
    if split == "off":
        return whole, SplitChoice(1, "off")
    imported, at_one = _batch_one(graph_def, frozen, captured, imported, specs, whole, split, exact)
    function, choice = _batch_split(graph_def, frozen, imported, specs, split)
    return function, dataclasses.replace(choice, why=joined(choice.why, choice.branches, at_one),
                                         times={**choice.times, **at_one.times}, rows=at_one.rows)


def _batch_one(graph_def, frozen, captured, imported, specs, whole, split, exact: bool):
    """(the frozen graph to call: `imported`, or the one routing batch 1 to its token rows (row_choice's), a
    RowChoice): what batch 1 runs."""
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
    times = interleaved_times({1: whole, ROW_PARTS: candidate}, _feeds(specs, 1), ROW_CALLS)
    choice = row_verdict({(1, n): t for n, t in times.items()}, _setting())
    return (routed if choice.rows > 1 else imported), choice


def _batch_split(graph_def, frozen, imported, specs, split):
    """(the function, a SplitChoice): `imported` called whole, or once per slice of the batch in N branches."""
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
    return chosen_split(whole, made, specs)


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


def _function(imported, specs, keys, shapes, carried, branches: int):
    """A tf.function calling `imported` whole (branches 1) or once per slice of the `carried` inputs' batch."""
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
        else:  # a batch smaller than the branches runs whole
            batch = tf.shape(args[carried.index(True)])[0]
            outputs = tf.cond(batch >= branches, lambda: sliced(args), lambda: whole(args))
        results = dict(zip(keys, outputs))
        for key, shape in (shapes or {}).items():
            results[key].set_shape(shape)  # a shape Grappler computed from folded weights, kept when they are not
        return results

    if branches > 1:  # a name `inspect` finds in the written model
        run.__name__ = SPLIT_FUNCTION.format(branches)
    return tf.function(run, input_signature=specs, autograph=False)


def _feeds(specs, batch: int, seed: int = 0) -> list:
    import tensorflow as tf
    arrays, _ = signature_inputs("split", {spec.name: spec for spec in specs}, {}, batch, seed)
    return [tf.constant(arrays[spec.name]) for spec in specs]


def unequal_outputs(whole, other, specs, exact: bool, batches, what: str) -> str:
    """"" if the function `other`'s outputs (`other(*tensors)` -> {key: tensor}, as `whole`, on inputs made from the
    TensorSpecs `specs`) equal the whole one's at each of `batches`: bit for bit where `exact` (the graph computes
    in float32), within round-off (1e-2) where it computes in low precision; else why (`what` names `other`)."""
    import numpy as np
    for batch in batches:
        feeds = _feeds(specs, batch, seed=batch)
        want, got = whole(*feeds), other(*feeds)
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
    feeds, others = _feeds(specs, batch, seed=batch), _feeds(specs, batch, seed=batch + 1)
    carried = [bool(spec.shape.rank) and spec.shape[0] is None for spec in specs]
    bounds = np.cumsum([0] + [batch // branches + (i < batch % branches) for i in range(branches)])
    slices = list(zip(bounds[:-1], bounds[1:]))
    want = _arrays(whole(*feeds))
    for lo, hi in slices:
        changed = [tf.concat([o[:lo], f[lo:hi], o[hi:]], 0) if c else f for f, o, c in zip(feeds, others, carried)]
        for key, got in _arrays(whole(*changed)).items():
            if not _same(want[key][lo:hi], got[lo:hi]):
                return (f"output {key} of samples {lo}-{hi - 1} changes when the other samples of the batch change "
                        f"(batch {batch}): the graph mixes the samples of a batch")
    pieces = [_arrays(whole(*[f[lo:hi] if c else f for f, c in zip(feeds, carried)])) for lo, hi in slices]
    for key, got in _arrays(split(*feeds)).items():
        expected = np.concatenate([piece[key] for piece in pieces])
        if not _same(expected, got):
            return f"output {key} split in {branches} differs from the graph called on each slice (batch {batch})"
    small = _feeds(specs, max(1, branches - 1), seed=branches)
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


def chosen_split(whole, made: dict, specs):
    """Race the whole call and each split ({branches: function}), interleaved, at TIMED_BATCHES; keep what
    split_verdict says: (the function kept, its SplitChoice)."""
    times = {}
    for batch in TIMED_BATCHES:
        raced = interleaved_times({1: whole, **made}, _feeds(specs, batch))
        times.update({(batch, n): ms for n, ms in raced.items()})
    choice = split_verdict(times, _setting())
    return (made[choice.branches] if choice.branches > 1 else whole), choice


def interleaved_times(runners: dict, feeds, calls: int = CALLS) -> dict:
    """{key: median ms per call} of the functions `runners` ({key: function}) called on `feeds`: ROUNDS rounds,
    each timing a block of `calls` calls of every runner in turn, after one warming call each."""
    samples = {n: [] for n in runners}
    for function in runners.values():
        function(*feeds)  # warm: oneDNN's primitives and TF's kernels are made at the first call
    for _ in range(ROUNDS):
        for n, function in runners.items():
            start = time.perf_counter()
            for _ in range(calls):
                function(*feeds)
            samples[n].append((time.perf_counter() - start) / calls * 1e3)
    return {n: statistics.median(samples[n]) for n in runners}


def _setting() -> str:
    """This process's intra-op threads, as the lines say them."""
    import tensorflow as tf
    # TF reads TF_NUM_INTRAOP_THREADS at start without reporting it through tf.config.
    threads = tf.config.threading.get_intra_op_parallelism_threads() or int(
        os.environ.get("TF_NUM_INTRAOP_THREADS", "0") or 0)
    return ONE_THREAD if threads == 1 else f"{threads or 'the default'} intra-op threads"


def _hint(setting: str) -> str:
    return "" if setting == ONE_THREAD else "; to choose for one intra-op thread, convert with TF_NUM_INTRAOP_THREADS=1"


def split_verdict(times: dict, setting: str) -> SplitChoice:
    """The split to keep from measured times: a number of branches faster than the whole call (1) by more than the
    noise (FASTER) at every batch timed, the fastest in sum of those; else 1 (a tie keeps the graph whole).

    Args:
        times: {(batch, branches): median ms per call}, with branches 1 for the whole call at every batch.
        setting: the threads the times were measured with, for the line.
    """
    batches = sorted({b for b, _ in times})
    splits = sorted({n for _, n in times if n > 1})
    measured = "; ".join(f"batch {b}: " + ", ".join(f"{'whole' if n == 1 else f'{n} branches'} {times[b, n]:.1f} ms"
                                                     for n in (1, *splits)) for b in batches)
    winners = [n for n in splits if all(times[b, n] < FASTER * times[b, 1] for b in batches)]
    if not winners:
        return SplitChoice(1, f"not split: no split measured faster here with {setting} ({measured})"
                              f"{_hint(setting)}", times)
    best = min(winners, key=lambda n: sum(times[b, n] for b in batches))
    return SplitChoice(best, f"split in {best} branches: faster at every batch timed with {setting} ({measured}); "
                             f"{SERVE}", times)


def row_verdict(times: dict, setting: str) -> RowChoice:
    """Batch 1's choice from measured times: the token-row split if faster than the whole call by more than the
    noise (FASTER), as split_verdict asks of a batch split; else whole.

    Args:
        times: {(1, 1): whole ms per call, (1, ROW_PARTS): the row split's}; setting: the threads they were
            measured with, for the line.
    """
    whole, rows = times[1, 1], times[1, ROW_PARTS]
    measured = f"{rows:.2f} ms against whole {whole:.2f} ms with {setting}"
    if rows < FASTER * whole:
        return RowChoice(ROW_PARTS, f"token rows in {ROW_PARTS} branches, {measured}", times)
    return RowChoice(1, f"runs whole: token rows in {ROW_PARTS} branches not faster beyond the noise ({measured})"
                        f"{_hint(setting)}", times)
