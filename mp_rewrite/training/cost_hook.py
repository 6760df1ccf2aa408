"""The cost assignment (`assign="cost"`) in the tf.function hook.

A traced body's costs are measured while the hook rewrites it, as a conversion measures a model
(analysis.graph_profile): the body -- a training step: forward, backward and update -- runs in float32 and as
Grappler's lists rewrite it, in sessions of its own whose variables are copies of the step's (read once from the
captured variables, never written), and TF's step stats give each node's time in context, fusions included; the
cut is then raced against both as the step will run, each variant called as a function in the eager runtime with
variables of its own (analysis.graph_runs.FunctionRunner). A body that cannot run that way (an argument that is
neither a number nor a variable, such as an iterator; a call into other functions; a body that fails to run)
is priced from the op table instead (each op timed alone), and the log says why. Either way the hook must leave
the functions registered while measuring alone, work eagerly, and hand the cost model the shapes the FuncGraph
knows (a FunctionDef keeps its arguments' shapes, not its variables')."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading

logger = logging.getLogger("mp_rewrite")

_LOCAL = threading.local()  # .depth: > 0 while measuring; .body: the _Body being rewritten


@dataclasses.dataclass(frozen=True)
class _Body:
    """The body the hook is rewriting: its AtomicFunction (FuncGraph shapes, captured variables), its
    core.functions.BodyGraph, the rewrite's Options and Signatures, and its name."""

    atomic: object
    body: object
    options: object
    signatures: object
    name: str


def is_paused() -> bool:
    """True while this thread measures op costs: functions registered meanwhile are the timer's own."""
    return getattr(_LOCAL, "depth", 0) > 0


@contextlib.contextmanager
def paused():
    """Leave the functions registered meanwhile in this thread alone."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


@contextlib.contextmanager
def rewriting(atomic, body, options, signatures, name: str):
    """Make the body the hook rewrites meanwhile known to HookSafeCosts (`atomic` None: nothing is known)."""
    _LOCAL.body = _Body(atomic, body, options, signatures, name) if atomic is not None else None
    try:
        yield
    finally:
        _LOCAL.body = None


class HookSafeCosts:
    """A machine cost table (analysis.op_costs.this_machine) as the hook's rewrite options use it: each body is
    profiled as it runs when it can be, else its ops are measured alone; either way eagerly, unseen by the hook, with
    the FuncGraph's shapes on its nodes."""

    def __init__(self, table):
        self.table, self.precision = table, table.precision

    def for_graph(self, graph_def, precision=None, fetches=(), batch=None):
        """The core.assignment.CostTable of one function body (measuring what the caches lack)."""
        import tensorflow as tf
        current = getattr(_LOCAL, "body", None)
        if current is not None and current.body.graph_def is not graph_def:
            current = None  # a graph the hook is not rewriting: nothing of it is known
        if current is not None:
            graph_def = _annotated(graph_def, _func_graph_shapes(current.atomic))
        with paused(), tf.init_scope():
            if current is not None and self.table.low_units:
                table, why = self._profiled(current, graph_def)
                if table is not None:
                    return table
                logger.info("mp_rewrite: %s: costs from the op table: %s", current.name, why)
            return self.table.for_graph(graph_def, precision, fetches, batch)

    def _profiled(self, current, graph_def):
        """(the CostTable of the body `current` measured as it runs, "") or (None, why it cannot be)."""
        from ..analysis.graph_profile import body_profileable, profile_body
        args, readers = _body_args(current.atomic, graph_def)
        why = body_profileable(graph_def, args)
        if why:
            return None, why
        try:
            args = [dataclasses.replace(arg, value=read()) if read else arg for arg, read in zip(args, readers)]
            return profile_body(dataclasses.replace(current.body, graph_def=graph_def), args, current.options,
                                current.signatures, self.table, function=current.atomic.definition).table, ""
        except Exception as error:  # noqa: BLE001 -- the hook must never break training
            return None, f"measuring it failed ({type(error).__name__}: {str(error)[:200]})"


def _annotated(graph_def, shapes: dict):
    """A copy of `graph_def` with `shapes` ({node: [TensorShape]}) as the `_output_shapes` of nodes without."""
    if not shapes:
        return graph_def
    annotated = type(graph_def)()
    annotated.CopyFrom(graph_def)
    for node in annotated.node:
        known = shapes.get(node.name)
        if known and "_output_shapes" not in node.attr:
            node.attr["_output_shapes"].list.shape.extend(s.as_proto() for s in known)
    return annotated


def _func_graph_shapes(atomic) -> dict:
    graph = getattr(atomic, "graph", None)
    if graph is None:
        return {}
    try:
        return {op.name: [t.shape for t in op.outputs] for op in graph.get_operations()}
    except Exception:  # noqa: BLE001 -- shapes are a hint; the cost model falls back to what it can infer
        return {}


def _body_args(atomic, graph_def) -> tuple:
    """([BodyArg], [reader]): one analysis.graph_runs.BodyArg per _Arg of the body, from its FuncGraph's inputs (in
    argument order) -- a number tensor fed made-up values, or a captured variable or value -- and beside it a
    callable that reads the captured value (None for made-up values; read only once the body is found profileable).
    The BodyArg is None for anything else (an iterator, a table, a string)."""
    import tensorflow as tf
    from ..analysis.graph_runs import BodyArg
    graph = getattr(atomic, "graph", None)
    arg_nodes = sorted((n for n in graph_def.node if n.op == "_Arg"), key=lambda n: n.attr["index"].i)
    if graph is None or len(graph.inputs) != len(arg_nodes):
        return [None], [None]
    captured = {internal.ref(): external for external, internal in graph.captures}
    variables = {v.handle.ref(): v for v in graph.variables if hasattr(v, "handle")}
    args, readers = [], []
    for tensor, node in zip(graph.inputs, arg_nodes):
        external = captured.get(tensor.ref())
        if tensor.dtype == tf.resource:
            variable = variables.get(external.ref()) if external is not None else None
            args.append(None if variable is None else BodyArg(
                variable.dtype.as_datatype_enum, tuple(variable.shape.as_list()), True))
            readers.append(None if variable is None else variable.numpy)
        elif tensor.dtype.as_datatype_enum != node.attr["T"].type or tensor.shape.rank is None or not (
                tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            args.append(None)
            readers.append(None)
        else:
            args.append(BodyArg(tensor.dtype.as_datatype_enum, tuple(tensor.shape.as_list())))
            readers.append(external.numpy if external is not None and hasattr(external, "numpy") else None)
    return args, readers
