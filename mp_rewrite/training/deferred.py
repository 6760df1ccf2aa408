"""The cost assignment decided across a step's first calls, not before its first one.

Measuring a traced step (analysis.step_profile) runs it about 50 times. Done when the hook rewrites the step, that is
what the first training step waited for: 18 s for a Transformer encoder, 32 s for ResNet-50 on an AMX CPU. Instead,
the hook swaps in Grappler's lists' rewrite at once (with Keras 3's BatchNorm fused) and hands the measuring here:
before each of the step's next calls (or a call of a function that calls it, such as Keras's train function), one
piece of it runs -- at most about one run of each variant. When it is done, the cut (or whichever coloring the race
kept) is swapped in, and every registered function that calls the step is registered again, since TensorFlow keeps
running a caller's first instantiation otherwise. The outcome is cached per machine, so the next process starts
from it. `finish()` measures whatever is pending at once (a benchmark, a test, a user who wants the decision first).

Calls are seen by wrapping `AtomicFunction.call_flat` while a measuring is pending (the other TensorFlow-internal
attribute the training hook patches, beside function_hook's `from_func_graph`); only eager calls advance it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref

from tensorflow.python.eager import context, record
from tensorflow.python.eager.polymorphic_function import atomic_function

logger = logging.getLogger("mp_rewrite")


@dataclasses.dataclass
class _Pending:
    """One step being measured: its name, the StepMeasure and its generator, what the final rewrite needs."""

    name: str
    measure: object  # analysis.step_profile.StepMeasure
    pieces: object  # its generator
    body: object  # core.functions.BodyGraph the hook rewrote (training.step_rules: BatchNorm fused, rules applied)
    options: object
    signatures: object
    traced: object  # the traced FunctionDef
    started: float = dataclasses.field(default_factory=time.perf_counter)
    calls: int = 0
    skip: int = 1  # calls to let through first: the one that traced the step runs it without a piece
    warmups: int = 0  # float32's warm-up runs seen (the second one times a run of the step)


_PENDING: dict[str, _Pending] = {}
_LOCK = threading.RLock()
_CALLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # AtomicFunction -> names it calls, transitively
_ORIGINAL = {}


def start(name: str, measure, body, options, signatures, traced) -> None:
    """Measure the step `name` across its next calls (see the module doc); says so in one line."""
    from ..analysis.op_costs import cache_dir
    with _LOCK:
        _PENDING[name] = _Pending(name, measure, measure.pieces(), body, options, signatures, traced)
        _patch_calls()
    if getattr(measure, "leader_decides", False):
        logger.warning("mp_rewrite: %s: the leader of this tf.distribute job measures the step across its next "
                       "calls; this worker runs Grappler's lists until it swaps in what the leader chose, before the "
                       "same call as the leader", name)
        return
    logger.warning("mp_rewrite: %s: measuring the step's %s costs on this machine across its next calls (float32 "
                   "and Grappler's lists with step stats, then the cut raced against both: about %d runs of the "
                   "step, a run or a few per call); it runs Grappler's lists until then. Measured once per machine "
                   "(cached in %s); mp_rewrite.finish_measuring() measures at once.", name,
                   options.precision, measure.planned_runs, cache_dir())


def pending() -> list[str]:
    """Names of the steps still being measured."""
    return list(_PENDING)


def drop(names=None) -> None:
    """Stop measuring `names` (all when None): restored or disabled steps keep what they run."""
    with _LOCK:
        for name in list(_PENDING) if names is None else names:
            pending_step = _PENDING.pop(name, None)
            if pending_step is not None:
                pending_step.pieces.close()


def finish() -> dict:
    """Measure every pending step now; returns {name: RewriteResult} of those whose decision was swapped in."""
    done = {}
    with _LOCK:
        for name in list(_PENDING):
            while name in _PENDING:
                result = _advance(_PENDING[name])
                if result is not None:
                    done[name] = result
    return done


def _advance(step: _Pending):
    """Run one piece of a step's measuring; at the end swap its decision in. Returns the RewriteResult swapped in."""
    from . import cost_hook
    step.calls += 1
    try:
        with cost_hook.paused(), record.stop_recording():
            begin = time.perf_counter()
            what = next(step.pieces)
            _say_time(step, what, time.perf_counter() - begin)
            return None
    except StopIteration as done:
        _PENDING.pop(step.name, None)
        return _swap_in(step, done.value.table)
    except Exception as error:  # noqa: BLE001 -- measuring must never break training
        _PENDING.pop(step.name, None)
        logger.warning("mp_rewrite: %s: measuring the step failed (%s: %s); it keeps running Grappler's lists",
                       step.name, type(error).__name__, str(error)[:300])
        logger.debug("mp_rewrite: %s: where the measuring failed", step.name, exc_info=True)
        return None


def _say_time(step: _Pending, what: str, seconds: float) -> None:
    step.warmups += what == "a warm-up run of float32"
    if step.warmups == 2 and what == "a warm-up run of float32":  # the first one also optimizes the graph
        logger.warning("mp_rewrite: %s: one run of the step takes %.2f s here: measuring adds about %.0f s over its "
                       "next calls", step.name, seconds, seconds * step.measure.planned_runs)


def _swap_in(step: _Pending, table):
    """Swap in what the measuring chose (its table's `keep`, analysis.step_profile): float32 as traced, Grappler's
    lists as traced (what already runs, when BatchNorm was fused for the cut), or the cut."""
    from ..core.body import rewrite_body
    from ..core.functions import graph_to_function
    from . import cost_hook, function_hook
    from .runnable import check_runnable
    took = (f"measured in {time.perf_counter() - step.started:.1f} s over {step.calls} calls" if not
            getattr(step.measure, "leader_decides", False) else f"the leader decided after {step.calls} calls")
    if table.keep == "lists" and step.measure.traced is not None:
        logger.warning("mp_rewrite: %s: %s; Grappler's lists ran fastest, and it keeps running them", step.name, took)
        return None
    try:
        if table.keep == "float32":
            result, new = None, None
        else:
            result = rewrite_body(step.body.graph_def, cost_hook.measured(step.options, table), step.body.retvals,
                                  step.body.preserved(), step.signatures, preserve_stateful=True, label=step.name)
            new = graph_to_function(result.graph_def, step.traced, step.signatures)
            check_runnable(new, result, step.signatures)
        if not function_hook.replace_rewrite(step.name, result, new):
            return None
        _register_callers_again(step.name)
    except Exception as error:  # noqa: BLE001 -- the lists' rewrite keeps running
        logger.warning("mp_rewrite: %s: the measured rewrite could not be swapped in (%s: %s); it keeps running "
                       "Grappler's lists", step.name, type(error).__name__, str(error)[:300])
        return None
    logger.warning("mp_rewrite: %s: %s; from now on it runs %s", step.name, took,
                   "float32 as traced (it ran fastest)" if result is None else result.grappler_line())
    return result


def _register_callers_again(name: str) -> None:
    """Remove and add again every registered function that calls `name`, directly or not: TensorFlow instantiates
    a function once, with the callee definitions of that moment, and keeps running that instance until the
    function is registered again."""
    ctx = context.context()
    fdefs = {n: ctx.get_function_def(n) for n in ctx.list_function_names() if n != name and ctx.has_function(n)}
    callers, grew = {name}, True
    while grew:
        found = {n for n, f in fdefs.items() if n not in callers and _calls_any(f, callers)}
        callers |= found
        grew = bool(found)
    for caller in callers - {name}:
        ctx.remove_function(caller)
        ctx.add_function_def(fdefs[caller])


def _calls_any(fdef, names) -> bool:
    return any(node.op in names or any(value.func.name in names for value in node.attr.values())
               for node in fdef.node_def)


def _called_names(atomic) -> frozenset:
    """The names of `atomic` and of every function it calls (AtomicFunction.children), cached per function."""
    known = _CALLED.get(atomic)
    if known is None:
        names, stack = set(), [atomic]
        while stack:
            current = stack.pop()
            name = current.name.decode() if isinstance(current.name, bytes) else current.name
            if name not in names:
                names.add(name)
                stack.extend(current.children)
        known = _CALLED[atomic] = frozenset(names)
    return known


def _before_call(atomic) -> None:
    """One piece of measuring for each pending step this eager call runs (itself or through a function it calls)."""
    if not _LOCK.acquire(blocking=False):
        return  # another thread is measuring: this call goes ahead
    try:
        for name in sorted(_called_names(atomic) & set(_PENDING)):
            step = _PENDING[name]
            if step.skip > 0:
                step.skip -= 1
            else:
                _advance(step)
    finally:
        _LOCK.release()


def _patch_calls() -> None:
    if "call_flat" in _ORIGINAL:
        return
    original = _ORIGINAL["call_flat"] = atomic_function.AtomicFunction.call_flat

    def call_flat(self, *args):
        if _PENDING and context.executing_eagerly():
            try:
                _before_call(self)
            except Exception as error:  # noqa: BLE001 -- the call itself must run whatever happened here
                logger.debug("mp_rewrite: measuring before a call failed: %s", error)
        return original(self, *args)

    call_flat._mp_rewrite_hook = True
    atomic_function.AtomicFunction.call_flat = call_flat
