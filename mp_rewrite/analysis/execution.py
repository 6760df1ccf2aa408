"""Run a self-contained GraphDef in TensorFlow (a front end: this module touches TF's runtime).

The graph is imported into a fresh ``tf.Graph`` and run by a ``tf.compat.v1.Session`` configured so that it runs
the dtypes the GraphDef says, as fast as a user's session would:

- every auto mixed precision optimizer is explicitly OFF;
- Grappler's **remapper is OFF**: it fuses MatMul/Conv2D + BiasAdd + activation (and FusedBatchNorm + Relu) into
  one kernel that keeps the intermediate in float32 and rounds once, so a low precision graph no longer rounds
  where it says it does. Measured (TF 2.21, oneDNN, this machine): on ``synthetic_graph(61)`` rewritten to
  bfloat16, fused vs unfused outputs differ by up to 3.7e-4; on float32 ``cnn_bn`` by 6.6e-7;
- everything else keeps TF's defaults. Constant folding stays ON: it evaluates all-constant subgraphs -- e.g. the
  ``Const -> Cast(float16)`` a rewrite puts on each frozen weight -- with the same CPU kernels and stores a Const
  of the same (float16) dtype; the arithmetic optimizer only drops exact no-ops (``x + 0`` with a zero bias) or
  moves casts across value-preserving ops. Measured: with the remapper off, every example graph rewritten by TF's
  pass (float16 and bfloat16) gives bitwise the same outputs as with all graph optimizations off, and each node
  that survives keeps its output dtype (``executed_graph_def`` shows what ran).

``optimize=False`` turns all graph optimization off (Grappler and the classic constant folding/CSE/inlining),
for running a graph exactly as written.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2  # noqa: E402

from mp_rewrite.errors import MpRewriteError, tf_reason  # noqa: E402

_AMP_TOGGLES = (
    "auto_mixed_precision",
    "auto_mixed_precision_mkl",
    "auto_mixed_precision_onednn_bfloat16",
    "auto_mixed_precision_cpu",
)
# TF names the failing node as "[[{{node <name>}}]]" in runtime errors, "Node '<name>'" in import errors and
# "The operation, '<name>'" for a missing feed or fetch.
_NODE_IN_MESSAGE = re.compile(r"\{\{node ([^}]+)\}\}|[Nn]ode '?([\w/.\-]+)'?|operation, '([^']+)'")


class ExecutionError(MpRewriteError):
    """TensorFlow failed to import or run a GraphDef; ``node`` names the failing node when TF said which."""

    def __init__(self, what: str, node: str | None, message: str):
        where = f" at node '{node}'" if node else ""
        super().__init__(f"TensorFlow failed to {what} the graph{where}: {message}")
        self.node = node


def tensor_name(name: str) -> str:
    """``"node"`` -> ``"node:0"``; a tensor name such as ``"node:1"`` is returned as it is.

    Args:
        name: a node name or a tensor name.

    Returns:
        The tensor name.
    """
    return name if ":" in name else f"{name}:0"


def session_config(optimize: bool = True, fuse: bool = False) -> config_pb2.ConfigProto:
    """The ConfigProto ``run_graph_def`` uses (see the module docstring for why).

    Args:
        optimize: False turns all graph optimization off (Grappler and the classic L1 optimizer).
        fuse: keep the remapper on, as TF serves a model (for timing, not for comparing outputs).

    Returns:
        A ConfigProto with TF's defaults, but auto mixed precision (and unless `fuse`, the remapper) OFF.
    """
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    for toggle in _AMP_TOGGLES:
        setattr(rewrite, toggle, rewriter_config_pb2.RewriterConfig.OFF)
    if not fuse:
        rewrite.remapping = rewriter_config_pb2.RewriterConfig.OFF
    if not optimize:
        rewrite.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = config_pb2.OptimizerOptions.L0
        config.graph_options.optimizer_options.do_constant_folding = False
    return config


def _failed(what: str, error: Exception) -> ExecutionError:
    message = tf_reason(error)
    node = getattr(getattr(error, "op", None), "name", None)
    if node is None:
        match = _NODE_IN_MESSAGE.search(str(error))
        node = next((g for g in match.groups() if g), None) if match else None
    return ExecutionError(what, node, message)


def _import(graph_def: graph_pb2.GraphDef) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf.errors.OpError) as error:
            raise _failed("import", error) from error
    return graph


def run_graph_def(
    graph_def: graph_pb2.GraphDef,
    feeds: dict[str, np.ndarray],
    fetches: Sequence[str],
    *,
    optimize: bool = True,
    run_metadata: config_pb2.RunMetadata | None = None,
) -> list[np.ndarray]:
    """Import ``graph_def`` into a fresh graph and run it once in a TF1 session.

    Args:
        graph_def: a self-contained GraphDef (no uninitialized variables; Placeholders fed by ``feeds``). A
            function library is supported.
        feeds: tensor or node name (``"x"`` means ``"x:0"``) -> value.
        fetches: tensor or node names to return.
        optimize: run TF's graph optimizations (minus AMP and the remapper), or none at all.
        run_metadata: if given, filled with the partition graphs TF executed (after Grappler).

    Returns:
        One numpy array per fetch, in order.

    Raises:
        ExecutionError: TF could not import or run the graph (names the node when TF did).
    """
    graph = _import(graph_def)
    options = config_pb2.RunOptions(output_partition_graphs=run_metadata is not None)
    with tf.compat.v1.Session(graph=graph, config=session_config(optimize)) as session:
        try:
            feed_dict = {graph.get_tensor_by_name(tensor_name(k)): v for k, v in feeds.items()}
            targets = [graph.get_tensor_by_name(tensor_name(f)) for f in fetches]
            return session.run(targets, feed_dict, options=options, run_metadata=run_metadata)
        except (KeyError, ValueError) as error:
            raise _failed("feed or fetch from", error) from error
        except tf.errors.OpError as error:
            raise _failed("run", error) from error


def executed_graph_def(
    graph_def: graph_pb2.GraphDef, feeds: dict[str, np.ndarray], fetches: Iterable[str], optimize: bool = True
) -> graph_pb2.GraphDef:
    """The graph TF actually executed for ``run_graph_def`` (after Grappler and placement), for dtype audits.

    Args:
        graph_def, feeds, fetches, optimize: as for ``run_graph_def``.

    Returns:
        A GraphDef holding the nodes of every partition graph (Send/Recv included).
    """
    metadata = config_pb2.RunMetadata()
    run_graph_def(graph_def, feeds, list(fetches), optimize=optimize, run_metadata=metadata)
    merged = graph_pb2.GraphDef()
    for partition in metadata.partition_graphs:
        merged.node.extend(partition.node)
        merged.library.function.extend(partition.library.function)
    return merged


def executed_nodes(function, *args, **kwargs) -> list:
    """The nodes of the graphs TensorFlow executed for one call `function(*args, **kwargs)` of a tf.function,
    ConcreteFunction or SavedModel signature: the partition graphs of eager run metadata, after the Grappler TF runs
    before a call (remapper included), as a user's call runs them. (A Session's graph is optimized differently:
    there a fed Placeholder of unknown batch has an unknown shape, and the remapper does not fuse a residual add.)
    Both sides of a Switch are in the graphs, the side not taken too (a split model's batch 1 routed to its rows, a
    batch dispatch): `ran_nodes` keeps the nodes that ran.

    Returns:
        [NodeDef] of every partition of every function the call ran, _Arg/_Retval/Const/NoOp/Identity left out.
    """
    from tensorflow.python.eager import context
    context.enable_run_metadata()
    try:
        context.export_run_metadata()  # drops what earlier calls left behind
        function(*args, **kwargs)
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    return [node for graph in metadata.function_graphs for partition in graph.partition_graphs
            for node in partition.node if node.op not in ("_Arg", "_Retval", "Const", "NoOp", "Identity")]


def ran_nodes(function, *args, **kwargs) -> list:
    """executed_nodes' nodes that ran in a second call, as a profiler trace of it shows them
    (served_trace.traced_call): the side of a Switch not taken does not run. The trace shows every kernel that
    computes (matmuls, convolutions, Casts, elementwise ops) but not the inline ones, Reshape and Shape, which are
    left out."""
    from .served_trace import traced_call
    nodes = executed_nodes(function, *args, **kwargs)
    stats, _ = traced_call(lambda: function(*args, **kwargs))
    ran = {node.node_name for device in stats.dev_stats for node in device.node_stats}
    return [node for node in nodes if node.name in ran]
