"""TensorBoard: the rewritten graph with every node's decision recorded as node attributes (`_mp_color`,
`_mp_dtype`, `_mp_rule`, `_mp_reason`), written as a graph event so `tensorboard --logdir LOGDIR` shows it in
the graph dashboard (click a node: its attributes say why it has its dtype)."""

from __future__ import annotations

import os

from tensorflow.core.framework import graph_pb2

from ..errors import ModelError
from .palette import dtype_label
from .wording import reason_text

ATTRS = ("_mp_color", "_mp_dtype", "_mp_rule", "_mp_reason")


def _annotations(row) -> dict:
    """attr name -> text for one NodeRow."""
    if row.cast is not None:
        return {"_mp_color": "cast", "_mp_dtype": dtype_label(row.cast.to_dtype), "_mp_rule": "inserted_cast",
                "_mp_reason": f"inserted Cast of {row.cast.src}:{row.cast.src_port}"}
    decision = row.decision
    if decision is None:
        return {"_mp_color": row.node_class, "_mp_dtype": "", "_mp_rule": "", "_mp_reason": "no type attributes"}
    return {"_mp_color": row.node_class, "_mp_dtype": dtype_label(decision.dtype_after),
            "_mp_rule": decision.reason.rule, "_mp_reason": reason_text(decision.reason)}


def _annotate(nodes, rows: dict) -> None:
    for node in nodes:
        row = rows.get(node.name)
        if row is not None:
            for key, text in _annotations(row).items():
                node.attr[key].s = text.encode()


def annotated_graph_def(result, function: str | None = None, tables=None) -> graph_pb2.GraphDef:
    """A copy of the rewritten GraphDef with the decisions as `_mp_*` string attributes on every node (also on the
    nodes of each rewritten function in its library); with `function`, that function's body graph instead.

    Raises:
        OptionError: an unknown function.
    """
    from .node_table import build_tables
    tables = build_tables(result, function, with_flops=False) if tables is None else tables
    by_name = {t.name: t for t in tables}
    source = result.graph_def if not function else by_name[function].result.graph_def
    out = graph_pb2.GraphDef()
    out.CopyFrom(source)
    _annotate(out.node, by_name[function or ""].rows)
    if not function:
        for fdef in out.library.function:
            table = by_name.get(fdef.signature.name)
            if table is not None:
                _annotate(fdef.node_def, table.rows)
    return out


def write_tensorboard(result, logdir: str, function: str | None = None, tables=None) -> str:
    """Write the annotated rewritten graph as a TensorBoard graph event under `logdir`.

    Returns:
        The path of the event file written.

    Raises:
        ModelError: the log directory cannot be written. OptionError: an unknown function.
    """
    import tensorflow as tf
    graph_def = annotated_graph_def(result, function, tables)
    try:
        os.makedirs(logdir, exist_ok=True)
        before = set(os.listdir(logdir))
        writer = tf.summary.create_file_writer(logdir)
        with writer.as_default():
            tf.summary.graph(graph_def)
        writer.close()
    except (OSError, tf.errors.OpError) as e:
        raise ModelError(f"cannot write a TensorBoard log to '{logdir}': {getattr(e, 'strerror', None) or e}") \
            from None
    new = sorted(set(os.listdir(logdir)) - before)
    return os.path.join(logdir, new[-1]) if new else logdir
