"""A batch dispatch (issue 39): where the race's winner changes with the batch size (bfloat16 slower at 1, faster at
32), one frozen signature that runs each call with the variant that won at its batch size -- the float32 frozen
graph and the low-precision one side by side, a `tf.cond` on the batch dimension choosing (`dispatch_function`).

`dispatched` (called by freeze.py for each frozen signature) times float32 and the low precision alone, as the
written model calls them (tf.functions, interleaved rounds, analysis.graph_runs.race), at each batch the conversion
raced; where one variant won everywhere nothing more is done. Otherwise it builds the dispatch at the batch where
the winner changes, races it against each variant alone at every one of those batches, and keeps it only where
dispatch_verdict says (as fast as the faster variant at every batch, faster than either alone across them); it
then says so as the conversion's first line ("wrote a batch dispatch: float32 below batch 8, bfloat16 from 8 ..."),
with the size the float32 weights add. Not kept, the variant the race chose is written and the line says what the
dispatch measured and which batch sizes lose.

MP_REWRITE_DISPATCH=off never tries it; =force writes float32 below the middle batch raced and the low precision
from it, whatever was measured, in either assignment: a test's setting, to exercise the mechanism on any machine.
"""

from __future__ import annotations

import dataclasses
import os

from ..analysis.graph_runs import Calls, VariantError, race
from ..analysis.variant_race import RACE_BATCHES, RACE_RUNS
from ..core.assignment import SOURCE
from ..core.effects import effects_policy, graph_effects
from ..errors import OptionError
from .dispatch_verdict import (DISPATCH_FUNCTION, FLOAT32, LOW, dispatch_verdict,
                               kept_line, refused_line, segments_of, winners_of)
from .frozen_function import compact, imported_function, shaped_outputs
from .inputs import DEFAULT_DIM, made_tensors

DISPATCH_ENV = "MP_REWRITE_DISPATCH"
DISPATCH_MODES = ("auto", "off", "force")
CALLS = 8  # calls per timed run at batch 1 (CALLS // batch at larger ones, one at least): one call there is short
# Rounds of the variants alone, which only say which ran faster at each batch (the conversion's own race said it
# before, in sessions; this reads it as the written functions run): fewer than the verdict's, never extended.
LOCATING_ROUNDS = 5


@dataclasses.dataclass(frozen=True)
class DispatchChoice:
    """What became of a frozen signature's batch dispatch.

    Attributes:
        kept: the dispatch is written.
        why: why not tried, what the variants alone showed, or the line said (kept or not).
        segments: ((first batch size, FLOAT32 or LOW),) where the winner changed, else ().
        alone: {batch: RaceTimes of (float32, low precision)} that located the change.
        times: {batch: RaceTimes of (float32, low precision, dispatch)} that decided.
    """

    kept: bool
    why: str
    segments: tuple = ()
    alone: dict = dataclasses.field(default_factory=dict)
    times: dict = dataclasses.field(default_factory=dict)


def dispatch_mode() -> str:
    """MP_REWRITE_DISPATCH: "auto" (default), "off" or "force".

    Raises:
        OptionError: another value.
    """
    mode = os.environ.get(DISPATCH_ENV, "auto").strip().lower() or "auto"
    if mode not in DISPATCH_MODES:
        raise OptionError(f"unknown {DISPATCH_ENV}={mode!r}: use {', '.join(DISPATCH_MODES)}")
    return mode


def dispatch_function(imported, specs, keys, shapes, segments, carried: int):
    """A tf.function with the signature's interface calling, for each call, the concrete function of the segment
    its batch size falls in.

    Args:
        imported: (float32's, the low precision's) concrete functions (frozen_function.imported_function).
        specs: the inputs' TensorSpecs; keys: the output keys, in the functions' order; shapes: the outputs'
            static shapes.
        segments: ((first batch size, FLOAT32 or LOW),), the first from batch 1 (dispatch_verdict.segments_of).
        carried: the index of an input whose first dimension is the batch.
    """
    import tensorflow as tf

    def branches(args, batch, segments):
        (_, variant), rest = segments[0], segments[1:]

        def here():
            return list(imported[variant](*args))
        if not rest:
            return here()
        return tf.cond(batch < rest[0][0], here, lambda: branches(args, batch, rest))

    def run(*args):
        return shaped_outputs(keys, branches(args, tf.shape(args[carried])[0], segments), shapes)

    run.__name__ = DISPATCH_FUNCTION  # a name `inspect` can find in the written model
    return tf.function(run, input_signature=specs, autograph=False)


@dataclasses.dataclass(frozen=True)
class Variants:
    """Float32 and the low precision of one frozen signature, each imported once, as the race and the dispatch
    call them.

    Attributes:
        imported: (float32's, the low precision's) concrete functions; alone: a tf.function calling each.
        specs, keys, shapes, carried: the inputs' TensorSpecs, the output keys, their static shapes, the index of
            the input that carries the batch (dispatch_function's).
        low: the low precision's RewriteResult (its graph_def compacted as written).
        sizes: (float32's, the low precision's) frozen graph in MB.
        written: FLOAT32 or LOW, the one the race chose (what is written without the dispatch).
        graphs: (float32's, the low precision's) GraphDef as imported: what their times are kept under.
    """

    imported: tuple
    alone: tuple
    specs: list
    keys: list
    shapes: dict
    carried: int
    low: object
    sizes: tuple
    written: int
    graphs: tuple


def dispatched(function, result, float32_graph, frozen, captured, options, machine=None, weights: str = "keep",
               split="off"):
    """(the signature's function, its RewriteResult): as given, or the batch dispatch of float32 and the low
    precision where it measured faster (or MP_REWRITE_DISPATCH=force); `result.dispatch` holds a DispatchChoice,
    or None where it was not tried.

    Args:
        function, result: the frozen signature's tf.function and RewriteResult as freeze.py made them (its
            graph_def compacted).
        float32_graph: the frozen graph the pass rewrote (after the graph rules; never modified).
        frozen: its frozen_signature.FrozenSignature; captured: the (placeholder, owner) pairs its functions feed.
        options: the conversion's Options, with this graph's costs (a CostTable where they were measured).
        machine: the Options before this graph's costs replaced the machine's: their batch (--batch-size: then only
            that batch was raced, nothing to dispatch) and unknown dimensions' size (--seq-len).
        weights, split: the conversion's --weights and --split (a dispatch is not tried beside either).
    """
    mode = dispatch_mode()
    result.dispatch = None
    costs = getattr(machine or options, "costs", None)
    if _not_tried(mode, result, frozen, options, getattr(costs, "batch", None), weights, split):
        return function, result
    variants = _variants(result, float32_graph, frozen, captured, options)
    if variants is None:
        return function, result
    dim = getattr(costs, "dim", None) or DEFAULT_DIM  # as the race made them (measured_costs.measured_dim)
    feeds = {b: made_tensors(variants.specs, b, dim=dim) for b in RACE_BATCHES}
    try:
        choice, dispatch = _raced_choice(variants, feeds, mode, options.precision, dim)
    except VariantError as e:
        result.dispatch = DispatchChoice(False, f"not tried: {e}")
        return function, result
    return _written(function, result, variants, choice, dispatch)


def _raced_choice(variants: Variants, feeds: dict, mode: str, precision: str, dim: int) -> tuple:
    """(DispatchChoice, the dispatch's tf.function or None): the variants raced alone at each batch; where the
    winner changes (or forced), the dispatch at that batch raced against them, and what dispatch_verdict says
    (races an earlier conversion kept: KeptRaces)."""
    from ..analysis.profile_cache import graph_bytes
    races = KeptRaces(*map(graph_bytes, variants.graphs), dim, mode)
    alone = races.alone(lambda: {b: raced_calls(variants.alone, feeds[b], b, LOCATING_ROUNDS) for b in RACE_BATCHES})
    segments = segments_of(winners_of(alone, variants.written))
    if len(segments) == 1 and mode != "force":
        name, other = ("float32", precision)[variants.written], ("float32", precision)[1 - variants.written]
        return DispatchChoice(False, f"{other} ran faster than {name} (alone, beyond the noise) at no batch raced: "
                                     f"nothing to dispatch{races.note}", (), alone), None
    segments = segments if mode != "force" else ((1, FLOAT32), (RACE_BATCHES[1], LOW))
    dispatch = dispatch_function(variants.imported, variants.specs, variants.keys, variants.shapes, segments,
                                 variants.carried)
    times = races.with_dispatch(lambda: {b: raced_calls([*variants.alone, dispatch], feeds[b], b)
                                         for b in RACE_BATCHES})
    verdict = dispatch_verdict(times)
    if verdict.kept or mode == "force":
        forced = "" if verdict.kept else f"written as {DISPATCH_ENV}=force asks, though its times would not keep it"
        line = kept_line(verdict, times, segments, precision, variants.sizes, forced) + races.note
        return DispatchChoice(True, line, segments, alone, times), dispatch
    line = refused_line(verdict, times, segments, precision, variants.written).removeprefix("; ") + races.note
    return DispatchChoice(False, line, segments, alone, times), None


class KeptRaces:
    """A dispatch's races -- the variants alone, then with the dispatch -- read from the timing cache where an
    earlier conversion on this machine, in this serving setting, ran them on the same graphs (the dispatch then
    built but not raced: the same verdict, the same bytes, however busy the machine is now), else run and kept
    (timing_cache) -- unless other processes used more than split_timing.OTHERS cores of this machine while they
    ran (analysis.machine_load): then `note` says so, and nothing is kept.

    Args:
        *parts: what the races depend on besides the machine and the serving setting: the variants' graphs'
            bytes (profile_cache.graph_bytes), the unknown dimensions' size, the dispatch mode.
    """

    def __init__(self, *parts):
        from . import timing_cache
        from .split_timing import this_setting
        self._cache = timing_cache
        self._key = timing_cache.timing_key("dispatch", *parts, RACE_BATCHES, LOCATING_ROUNDS, this_setting())
        self._kept = _kept_races(timing_cache.load("dispatch", self._key)) or {}
        self._timed, self._disturbed = {}, False
        self.note = timing_cache.read_note(timing_cache.path("dispatch", self._key)) if self._kept else ""

    def alone(self, time) -> dict:
        """{batch: RaceTimes of the variants alone}: kept, else `time()`'s."""
        return self._get("alone", time)

    def with_dispatch(self, time) -> dict:
        """{batch: RaceTimes of the variants and the dispatch}: kept, else `time()`'s."""
        return self._get("times", time)

    def _get(self, part: str, time) -> dict:
        from ..analysis.machine_load import Span
        from .split_timing import OTHERS
        if part in self._kept:
            return self._kept[part]
        if self._kept:  # the earlier conversion kept the races alone, not this one (it was disturbed then)
            self.note += "; the race with the dispatch timed now (the earlier conversion could not keep it)"
        with Span() as span:
            self._timed[part] = time()
        if span.others is not None and span.others > OTHERS:  # a disturbed race decides this conversion only
            self.note += f"; timed while other processes used {span.others:.2f} cores of this machine: not kept, " \
                         "so the next conversion times again"
            self._disturbed = True
        elif not self._disturbed:
            self._cache.save("dispatch", self._key, {p: {str(b): [list(w) for w in t.walls] for b, t in races.items()}
                                                     for p, races in {**self._kept, **self._timed}.items()})
        return self._timed[part]


def _kept_races(found) -> dict | None:
    """{"alone": {batch: RaceTimes}, and "times" where the dispatch was raced} of what KeptRaces kept, or None."""
    from ..analysis.race_times import RaceTimes
    try:
        kept = {part: {int(batch): RaceTimes(tuple(tuple(float(ms) for ms in w) for w in walls))
                       for batch, walls in found[part].items()} for part in ("alone", "times") if part in found}
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    return kept if "alone" in kept else None


def _written(function, result, variants: Variants, choice: DispatchChoice, dispatch):
    """(function, RewriteResult) written for the signature once the dispatch was decided; the first line said."""
    if dispatch is not None:  # kept: the low precision's result stands for the signature, its line the choice
        low = variants.low
        low.rules, low.split, low.dispatch = result.rules, getattr(result, "split", None), choice
        _say(low, choice.why)
        return dispatch, low
    result.dispatch = choice
    if choice.segments:  # measured and not kept: said after what the race wrote
        decision = getattr(result.assignment, "decision", "")
        _say(result, f"{decision}; {choice.why}" if decision else choice.why)
    return function, result


def _say(result, line: str) -> None:
    """The result's first line (its assignment's decision) made `line`, where the cost assignment made one."""
    if result.assignment is not None:
        result.assignment = dataclasses.replace(result.assignment, decision=line)


def _not_tried(mode: str, result, frozen, options, batch_size, weights: str, split) -> bool:
    """Whether this signature is not a dispatch's to try: off, one batch asked for (--batch-size), the precision
    not raced at several batches (auto: the costs were not measured in the graph), --split or --weights low asked
    for, weights kept as variables, no input with a batch dimension, or effects that timing would perform."""
    table = options.costs
    if mode == "off" or batch_size or split != "off" or weights == "low" or frozen.variables:
        return True
    if _batch_input(frozen.inputs) is None:
        return True
    if mode == "auto" and not (options.assign == "cost" and getattr(table, "runs", None) is not None
                               and getattr(table, "low_units", False) and getattr(table, "decision", "")):
        return True
    return bool(not effects_policy().run and graph_effects(result.graph_def, frozen.fetches, frozen.key))


def _variants(result, float32_graph, frozen, captured, options) -> Variants | None:
    """Float32 and the low precision, compacted as written and imported: the result is one of them, the other made
    here (the cut, or the lists where the cut keeps every candidate float32); None where no node runs in the low
    precision either way."""
    from ..core.rewrite import rewrite_graph_def
    from ..rules import fold_constant_casts
    fed = {name.split(":")[0] for _, name in frozen.inputs} | {name.split(":")[0] for name, _ in frozen.captured}
    low = result if result.converted_nodes else None
    # Where the model as given (no graph rules) won, the table's node names are not this graph's: the lists' then.
    keeps = ("lists",) if getattr(options.costs, "keep", "") == SOURCE else ("", "lists")
    for keep in keeps if low is None and options.assign == "cost" else ():
        made = rewrite_graph_def(float32_graph, fetches=frozen.fetches, preserve=fed,
                                 options=dataclasses.replace(options, costs=dataclasses.replace(options.costs,
                                                                                                keep=keep)))
        if made.converted_nodes:
            made.graph_def = compact(fold_constant_casts(made.graph_def, frozen.fetches)[0], frozen.fetches)
            low = made
            break
    if low is None:
        return None
    if low is result:
        f32 = type(float32_graph)()
        f32.CopyFrom(float32_graph)
        f32 = compact(f32, frozen.fetches)
    else:
        f32 = result.graph_def
    (f32_call, specs), (low_call, _) = (imported_function(g, frozen.inputs, frozen.outputs, captured)
                                        for g in (f32, low.graph_def))
    keys = list(frozen.outputs)
    alone = tuple(_alone(f, specs, keys, frozen.shapes) for f in (f32_call, low_call))
    return Variants((f32_call, low_call), alone, specs, keys, frozen.shapes, _batch_input(frozen.inputs), low,
                    (f32.ByteSize() / 1e6, low.graph_def.ByteSize() / 1e6), LOW if low is result else FLOAT32,
                    (f32, low.graph_def))


def _batch_input(inputs):
    """The index of the first input whose first dimension is unknown (the batch), else None."""
    return next((i for i, (spec, _) in enumerate(inputs)
                 if spec.shape.rank and spec.shape.as_list()[0] is None), None)


def _alone(imported, specs, keys, shapes):
    """A tf.function calling one variant's concrete function, as the written model would."""
    import tensorflow as tf
    return tf.function(lambda *args: shaped_outputs(keys, imported(*args), shapes), input_signature=specs,
                       autograph=False)


def raced_calls(functions, feeds, batch: int, rounds: int | None = None):
    """The RaceTimes (ms per call) of `functions` called on `feeds` in alternated rounds: `rounds` of them, else
    RACE_RUNS and more, up to twice as many, while a ratio is not known to within race_times.SETTLED."""
    from ..analysis.race_times import RaceTimes
    calls = max(1, CALLS // batch)
    times = race([Calls(f, feeds, calls) for f in functions], rounds or RACE_RUNS, most=rounds,
                 names=["float32", "the low precision", "the dispatch"])
    return RaceTimes(tuple(tuple(w / calls for w in walls) for walls in times.walls))
