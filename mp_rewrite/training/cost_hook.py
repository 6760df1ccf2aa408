"""The cost assignment (`assign="cost"`) in the tf.function hook: a traced function's op costs are measured while it
is being registered, so the hook must leave the measuring functions alone, run them eagerly, and hand the cost model
the shapes the FuncGraph knows (a FunctionDef keeps its arguments' shapes, not its variables')."""

from __future__ import annotations

import contextlib
import threading

_LOCAL = threading.local()  # .depth: > 0 while measuring; .shapes: the FuncGraph shapes of the function rewritten


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
def shapes_from(atomic):
    """Make the output shapes of `atomic`'s FuncGraph ({node: [TensorShape]}) known to HookSafeCosts meanwhile."""
    _LOCAL.shapes = _func_graph_shapes(atomic) if atomic is not None else None
    try:
        yield
    finally:
        _LOCAL.shapes = None


def _func_graph_shapes(atomic) -> dict:
    graph = getattr(atomic, "graph", None)
    if graph is None:
        return {}
    try:
        return {op.name: [t.shape for t in op.outputs] for op in graph.get_operations()}
    except Exception:  # noqa: BLE001 -- shapes are a hint; the cost model falls back to what it can infer
        return {}


class HookSafeCosts:
    """A machine cost table (analysis.op_costs.this_machine) as the hook's rewrite options use it: each body's
    ops are measured eagerly, unseen by the hook, with the FuncGraph's shapes on its nodes."""

    def __init__(self, table):
        self.table, self.precision = table, table.precision

    def for_graph(self, graph_def, precision=None, fetches=(), batch=None):
        """The core.assignment.CostTable of one function body (measuring what the cache lacks)."""
        import tensorflow as tf
        shapes = getattr(_LOCAL, "shapes", None)
        if shapes:
            annotated = type(graph_def)()
            annotated.CopyFrom(graph_def)
            for node in annotated.node:
                known = shapes.get(node.name)
                if known and "_output_shapes" not in node.attr:
                    node.attr["_output_shapes"].list.shape.extend(s.as_proto() for s in known)
            graph_def = annotated
        with paused(), tf.init_scope():
            return self.table.for_graph(graph_def, precision, fetches, batch)
