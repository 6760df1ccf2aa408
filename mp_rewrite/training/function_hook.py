"""The tf.function hook: while it is installed, every function TensorFlow registers in the eager context runs
rewritten.

How it works. Every traced function reaches the runtime through one call, `atomic_function.from_func_graph(name,
func_graph, attrs, ...)`: `tf.function` traces (ConcreteFunction.from_func_graph), the forward/backward pairs built
when a function is differentiated from outside (concrete_function._create_forward_backward_with_graph), the
branch and body functions of `tf.cond`/`tf.while_loop` (control_flow_util_v2), `wrap_function` and SavedModel
loading. It turns the FuncGraph into a FunctionDef, registers it in the eager context and returns an
AtomicFunction that calls the function *by name*. The hook wraps that call: once the original has registered the
function, it reads the FunctionDef back from the context, rewrites the body as Grappler rewrites a function item
(arguments and return values keep their dtypes, stateful ops are preserved), and swaps the definition in the
context (`remove_function` + `add_function_def`). Every later call, eager or from an outer function, runs the new
body; an outer function traced later copies the rewritten definition into its own library, because
`Graph._add_function` reads it from the context too. The FuncGraph Python keeps (for gradients, shapes) stays the
traced float32 graph, which is what keeps gradient construction working: signatures do not change.

Left alone: tf.data functions and all they call (Grappler never rewrites them; one rewritten while its tf.data
caller was traced is put back), parametrised functions, bodies without an allow-list op (Grappler's "nothing to
do"). A body the pass cannot handle, or whose rewrite TF could not run (a dtype its OpDef does not allow, no kernel
on this machine: checked before the swap, as TF validates a FunctionDef only when it first runs it), keeps its
original and a warning is logged. `restore` puts traced definitions back; records of collected functions are
dropped. This module alone patches `from_func_graph` (training.deferred wraps `AtomicFunction.call_flat`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import weakref

from tensorflow.core.framework import function_pb2
from tensorflow.python.eager import context
from tensorflow.python.eager.polymorphic_function import atomic_function
from tensorflow.python.framework import errors, op_def_registry

from . import cost_hook, deferred
from .runnable import check_runnable
from ..errors import MpRewriteError
from ..core.functions import function_to_graph, graph_to_function, is_polymorphic, is_tf_data_function
from ..core.library import skipped_functions
from ..core.op_support import Signatures

logger = logging.getLogger("mp_rewrite")

_PATCHED_ATTR = "from_func_graph"
_MAX_CHECKED = 100_000  # names of bodies found to need no rewrite; forgotten in bulk past this size


@dataclasses.dataclass
class FunctionRecord:
    """One function whose definition in the eager context was replaced: its name there, its FunctionDef as traced
    (what `restore` puts back), the RewriteResult of its body, the order of the rewrite (`restore(since=...)`), and
    a weak reference to its AtomicFunction when the hook saw it."""

    name: str
    original: function_pb2.FunctionDef
    result: object
    seq: int
    atomic: object = None  # weakref to the AtomicFunction, when known


class _Hook:
    """The hook's state: the active rewrite (or None), the veto, what was rewritten, what failed."""

    def __init__(self):
        self.lock = threading.RLock()
        self.options = None
        self.veto = None
        self.original_from_func_graph = None
        self.records: dict[str, FunctionRecord] = {}
        self.failures: dict[str, str] = {}
        self.checked: set[str] = set()
        self.seq = 0


_HOOK = _Hook()


def install(options, veto=None) -> None:
    """Make every function registered from now on run rewritten with `options`.

    Installing again replaces the options (functions rewritten before keep their rewrite).

    Args:
        options: a validated `core.options.Options` (see `core.options.make_options`).
        veto: optional callable returning a reason (str) to skip rewriting at this moment, or None to go ahead.

    Raises:
        MpRewriteError: this TensorFlow has no `atomic_function.from_func_graph` to hook (TF before 2.14).
    """
    current = getattr(atomic_function, _PATCHED_ATTR, None)
    if current is None:
        import tensorflow as tf

        raise MpRewriteError(f"TensorFlow {tf.__version__} has no atomic_function.{_PATCHED_ATTR}, where the "
                             "tf.function hook sits; the training rewrite needs TensorFlow 2.14 or newer")
    with _HOOK.lock:
        _HOOK.options, _HOOK.veto = options, veto
        if not getattr(current, "_mp_rewrite_hook", False):
            _HOOK.original_from_func_graph = current
            setattr(atomic_function, _PATCHED_ATTR, _make_hooked(current))


def uninstall() -> None:
    """Stop rewriting new functions (already rewritten ones keep running rewritten; see `restore`)."""
    with _HOOK.lock:
        _HOOK.options, _HOOK.veto = None, None
        current = getattr(atomic_function, _PATCHED_ATTR)
        # Only unpatch if nobody patched on top of us; otherwise our wrapper stays in the chain as a pass-through.
        if getattr(current, "_mp_rewrite_hook", False) and _HOOK.original_from_func_graph is not None:
            setattr(atomic_function, _PATCHED_ATTR, _HOOK.original_from_func_graph)
            _HOOK.original_from_func_graph = None


def active_options():
    """Return the `core.options.Options` new functions are rewritten with, or None when the hook is not installed."""
    return _HOOK.options


def _make_hooked(original):
    @functools.wraps(original)
    def from_func_graph(*args, **kwargs):
        atomic = original(*args, **kwargs)
        options = _HOOK.options
        if options is not None and not cost_hook.is_paused():
            _after_registration(atomic, options)
        return atomic

    from_func_graph._mp_rewrite_hook = True
    return from_func_graph


def _after_registration(atomic, options) -> None:
    """Rewrite a just-registered function and the children it calls; never raises."""
    name = atomic.name.decode()
    try:
        veto = _HOOK.veto() if _HOOK.veto is not None else None
        if veto:
            logger.debug("not rewriting %s: %s", name, veto)
            return
        ctx = context.context()
        fdef = ctx.get_function_def(name)
        if is_tf_data_function(fdef):
            _restore_data_children(ctx, atomic)
            return
        rewrite_registered(name, options, fdef, atomic)
        for child in atomic.children:
            child_name = child.name.decode()
            if child_name not in _HOOK.records and child_name not in _HOOK.checked:
                rewrite_registered(child_name, options, atomic=child)
    except Exception as error:  # noqa: BLE001 -- the hook must never break tracing
        logger.warning("mp_rewrite: the function hook failed on '%s' (%s: %s); the function runs as traced",
                       name, type(error).__name__, error)


def rewrite_registered(name: str, options, fdef: function_pb2.FunctionDef | None = None, atomic=None):
    """Rewrite the function `name` registered in the eager context, in place, and record it.

    Args:
        name: the function's name in the eager context.
        options: a `core.options.Options`.
        fdef: its current FunctionDef, if the caller read it already.
        atomic: its AtomicFunction, if known: its cached definition is refreshed, and the record is dropped when
            TF collects it.

    Returns:
        The RewriteResult if the definition was replaced; None if there was nothing to do, the function is one
        Grappler skips, or the rewrite failed (a warning is logged and the original stays registered).
    """
    from ..core.body import rewrite_body

    ctx = context.context()
    with _HOOK.lock:
        if name in _HOOK.records:
            return None
        if fdef is None:
            try:
                fdef = ctx.get_function_def(name)
            except errors.NotFoundError:  # collected by TF since it was listed (a function of a dropped object)
                return None
        if is_polymorphic(fdef) or is_tf_data_function(fdef) or not _has_allow_op(fdef, options):
            _remember_checked(name)
            return None
        try:
            signatures = Signatures(_called_library(ctx, fdef))
            traced = function_to_graph(fdef, signatures)
            plan = cost_hook.plan(atomic, traced, options, signatures, name)
            body, now = plan.body, plan.options
            if now is None:  # measured here before: float32 as traced ran fastest
                _remember_checked(name)
                return None
            with cost_hook.rewriting(atomic if now.assign == "cost" else None, body, now, signatures, name,
                                     traced.graph_def if plan.changes else None):
                result = rewrite_body(body.graph_def, now, body.retvals, body.preserved(), signatures,
                                      preserve_stateful=True, label=name)
            if not result.retyped and not result.emulated and not plan.changes:  # emulated: retypes nothing, adds Casts
                _remember_checked(name)
                return None
            new = graph_to_function(result.graph_def, fdef, signatures)
            check_runnable(new, result, signatures)
            _swap(ctx, name, new, fdef, atomic)
        except Exception as error:  # noqa: BLE001 -- any failure leaves the original running
            _HOOK.failures[name] = f"{type(error).__name__}: {error}"
            logger.warning("mp_rewrite: could not rewrite tf.function '%s' (%s: %s); it runs in float32 as traced",
                           name, type(error).__name__, error)
            return None
        _HOOK.seq += 1
        _HOOK.records[name] = FunctionRecord(name, fdef, result, _HOOK.seq,
                                             weakref.ref(atomic) if atomic is not None else None)
        if atomic is not None:
            weakref.finalize(atomic, _forget, name).atexit = False
        logger.info("mp_rewrite: %s: %s", name, result.grappler_line())
        if plan.later is not None and result.retyped:
            deferred.start(name, plan.later, plan.fused_body, options, signatures, fdef)
        return result


def replace_rewrite(name: str, result, fdef: function_pb2.FunctionDef) -> bool:
    """Swap another rewrite of a recorded function in (the cost assignment decided after its first calls, training.
    deferred); `result` None puts the traced definition back. False when the function is no longer recorded."""
    ctx = context.context()
    with _HOOK.lock:
        record = _HOOK.records.get(name)
        if record is None or not ctx.has_function(name):
            return False
        _swap(ctx, name, fdef or record.original, ctx.get_function_def(name), record.atomic and record.atomic())
        if result is None:
            _HOOK.records.pop(name)
        record.result = result
        return True


def _has_allow_op(fdef, options) -> bool:
    """Grappler's "no allowlist ops found, nothing to do", checked before building any view."""
    return bool(options.force_low or options.force_all) or any(n.op in options.lists.allow for n in fdef.node_def)


def _called_library(ctx, fdef) -> function_pb2.FunctionDefLibrary:
    """The FunctionDefs of functions the body calls directly by op name (their signatures are the op's)."""
    library = function_pb2.FunctionDefLibrary()
    for op in sorted({node.op for node in fdef.node_def}):
        if op_def_registry.get(op) is None and ctx.has_function(op):
            library.function.append(ctx.get_function_def(op))
    return library


def _swap(ctx, name, new, original, atomic=None) -> None:
    ctx.remove_function(name)
    try:
        ctx.add_function_def(new)
    except Exception:
        ctx.add_function_def(original)
        raise
    if atomic is not None:
        # AtomicFunction caches its FunctionDef on first read (ConcreteFunction.function_def shows that copy).
        atomic._cached_definition = None  # pylint: disable=protected-access


def _remember_checked(name: str) -> None:
    if len(_HOOK.checked) >= _MAX_CHECKED:
        _HOOK.checked.clear()
    _HOOK.checked.add(name)


def _forget(name: str) -> None:
    """Drop the record of a function TensorFlow removed from the context (its AtomicFunction was collected)."""
    try:
        if context.context().has_function(name):
            return  # another AtomicFunction of the same name still holds it
    except Exception:  # noqa: BLE001 -- interpreter shutdown
        return
    with _HOOK.lock:
        _HOOK.records.pop(name, None)


def _restore_data_children(ctx, atomic) -> None:
    """Put back the original of every function a tf.data function calls (Grappler leaves them alone)."""
    names = {child.name.decode() for child in atomic.children}
    library = function_pb2.FunctionDefLibrary()
    library.function.extend(ctx.get_function_def(n) for n in names if ctx.has_function(n))
    library.function.append(ctx.get_function_def(atomic.name.decode()))
    with _HOOK.lock:
        for name in skipped_functions(library):
            _restore_one(ctx, name)
            _remember_checked(name)


def _restore_one(ctx, name: str) -> bool:
    record = _HOOK.records.pop(name, None)
    if record is None or not ctx.has_function(name):
        return False
    current = ctx.get_function_def(name)
    _swap(ctx, name, record.original, current, record.atomic() if record.atomic is not None else None)
    return True


def restore(since: int = 0) -> list[str]:
    """Put the traced definitions back for functions rewritten after `since` (see `mark`); forget their records.

    Returns:
        The names of the functions restored (those still registered in the eager context).
    """
    ctx = context.context()
    with _HOOK.lock:
        names = [n for n, r in sorted(_HOOK.records.items(), key=lambda item: item[1].seq) if r.seq > since]
        deferred.drop(names)
        restored = [n for n in names if _restore_one(ctx, n)]
        _HOOK.checked.clear()
        return restored


def mark() -> int:
    """Return a point in the rewrite history, for `restore(since=...)`."""
    return _HOOK.seq


def existing_candidates(options) -> list[str]:
    """Functions registered in the eager context that this rewrite would change but the hook has not rewritten
    (traced before the hook was installed, or restored since): not tf.data, not parametrised, with an allow op.
    """
    ctx = context.context()
    library = function_pb2.FunctionDefLibrary()
    for name in ctx.list_function_names():
        if name not in _HOOK.records and name not in _HOOK.checked and ctx.has_function(name):
            library.function.append(ctx.get_function_def(name))
    skipped = skipped_functions(library)
    return [f.signature.name for f in library.function
            if f.signature.name not in skipped and _has_allow_op(f, options)]


def rewritten() -> dict:
    """Return {function name: RewriteResult} for every function whose definition the hook replaced and which is
    still registered in the eager context, in the order they were rewritten."""
    ctx = context.context()
    with _HOOK.lock:
        gone = [n for n in _HOOK.records if not ctx.has_function(n)]
        for name in gone:
            del _HOOK.records[name]
        return {n: r.result for n, r in sorted(_HOOK.records.items(), key=lambda item: item[1].seq)}


def original_definition(name: str) -> function_pb2.FunctionDef | None:
    """Return the traced (float32) FunctionDef of a rewritten function, or None if it was not rewritten."""
    record = _HOOK.records.get(name)
    return record.original if record is not None else None


def failures() -> dict:
    """Return {function name: "ErrorType: message"} for every function the rewrite failed on (they run as traced)."""
    return dict(_HOOK.failures)
