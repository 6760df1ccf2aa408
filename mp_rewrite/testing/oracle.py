"""TensorFlow's own Grappler auto mixed precision pass, run on a GraphDef: the oracle for tests and benchmarks.

This is NOT the product. mp_rewrite re-implements the pass; this module runs TF's C++ pass so tests can compare
the two node for node and benchmarks can time them side by side.

Recipe (research/grappler_amp.md §7): wrap the GraphDef in a MetaGraphDef whose ``train_op`` collection names the
fetches (Grappler preserves fetched nodes), and call ``tf_optimizer.OptimizeGraph`` with a RewriterConfig whose
``optimizers`` list names ONLY the mixed precision pass:

- ``float16`` -> ``auto_mixed_precision_cpu``: the CPU-emulation mode, which uses the CUDA fp16 lists with every
  CUDA/cuDNN version gate on, so on a machine without a GPU it is the closest stand-in for the GPU pass. The env var
  ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=0`` makes it really retype to half (by default it would
  cast back to float32 around every op). Nodes must be on the CPU (or unplaced: the virtual placer puts them on
  the CPU here).
- ``bfloat16`` -> ``auto_mixed_precision_onednn_bfloat16`` (oneDNN builds, which x86 Linux wheels are).

A non-empty ``optimizers`` list replaces the default optimizer set (no pruning, constant folding, arithmetic,
layout, remapper, ...); custom optimizers are only added if configured (none are), plugin optimizers and the
module-level TFG pipeline that runs after the main passes are switched off here explicitly, and one meta-optimizer
iteration suffices (the pass is run-once anyway). ``min_graph_nodes=-1`` keeps tiny graphs from being skipped.
Function bodies in the library are optimized too, each as its own item, as the meta-optimizer always does; unused
functions are dropped from the returned library, and the returned graph is topologically sorted.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
from typing import Iterator, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tensorflow.core.framework import graph_pb2  # noqa: E402
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2  # noqa: E402
from tensorflow.python.grappler import cluster as gcluster  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402

from mp_rewrite.errors import OptionError  # noqa: E402

EMULATE_FP16_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"
OPTIMIZER_BY_PRECISION = {
    "float16": "auto_mixed_precision_cpu",
    "bfloat16": "auto_mixed_precision_onednn_bfloat16",
}
_RewriterConfig = rewriter_config_pb2.RewriterConfig


def oracle_config(precision: str = "float16") -> config_pb2.ConfigProto:
    """The ConfigProto that runs only TF's mixed precision pass for ``precision``.

    Args:
        precision: ``"float16"`` or ``"bfloat16"``.

    Returns:
        A ConfigProto for ``tf_optimizer.OptimizeGraph``.

    Raises:
        OptionError: unknown precision.
    """
    if precision not in OPTIMIZER_BY_PRECISION:
        raise OptionError(f"precision must be one of {sorted(OPTIMIZER_BY_PRECISION)}, got {precision!r}")
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append(OPTIMIZER_BY_PRECISION[precision])
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = _RewriterConfig.ONE
    rewrite.use_plugin_optimizers = _RewriterConfig.OFF
    rewrite.disable_tfg_optimizer = True
    rewrite.fail_on_optimizer_errors = True
    return config


def oracle_meta_graph(graph_def: graph_pb2.GraphDef, fetches: Sequence[str]) -> meta_graph_pb2.MetaGraphDef:
    """A MetaGraphDef carrying ``graph_def`` (its function library included) with ``fetches`` as train_op.

    Args:
        graph_def: the graph; not modified.
        fetches: node or tensor names to preserve (``"x:0"`` is reduced to ``"x"``).

    Returns:
        The MetaGraphDef.
    """
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    nodes = meta.collection_def["train_op"].node_list.value
    nodes.extend(dict.fromkeys(f.lstrip("^").split(":")[0] for f in fetches))
    return meta


@contextlib.contextmanager
def environment(updates: dict) -> Iterator[None]:
    """Set (or, for None values, unset) environment variables for the block, then restore them.

    TF's pass reads its variables with getenv on every run, so os.environ changes reach the C++ side.
    """
    saved = {key: os.environ.get(key) for key in updates}
    try:
        for key, value in updates.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def grappler_rewrite(
    graph_def: graph_pb2.GraphDef,
    fetches: Sequence[str],
    precision: str = "float16",
    emulate_fp16: bool = False,
    cluster: gcluster.Cluster | None = None,
) -> graph_pb2.GraphDef:
    """Run TF's auto mixed precision pass (only it) on ``graph_def``.

    Args:
        graph_def: the graph to rewrite; never modified.
        fetches: node or tensor names the caller will fetch; Grappler preserves them (they stay float32).
        precision: ``"float16"`` (``auto_mixed_precision_cpu``, GPU fp16 lists) or ``"bfloat16"``
            (``auto_mixed_precision_onednn_bfloat16``).
        emulate_fp16: float16 only; keep TF's CPU emulation (ops compute in float32 between casts) instead of
            really retyping to half.
        cluster: a ``grappler.cluster.Cluster`` to reuse (each call otherwise provisions and shuts down one).

    Returns:
        The rewritten GraphDef.

    Raises:
        OptionError: unknown precision.
        tf.errors.OpError: TF's pass failed (it runs with ``fail_on_optimizer_errors``, so a failure raises instead
            of silently returning the input graph).
    """
    return grappler_rewrite_meta_graph(oracle_meta_graph(graph_def, fetches), precision, emulate_fp16, cluster)


def grappler_rewrite_meta_graph(
    meta_graph: meta_graph_pb2.MetaGraphDef,
    precision: str = "float16",
    emulate_fp16: bool = False,
    cluster: gcluster.Cluster | None = None,
) -> graph_pb2.GraphDef:
    """Run TF's auto mixed precision pass (only it) on a MetaGraphDef as it is.

    Grappler builds its item from the MetaGraphDef: fetches from the "train_op" collection and the signatures'
    outputs (it refuses a MetaGraphDef with neither), and every node a collection names is kept.

    Args:
        meta_graph: the MetaGraphDef; not modified.
        precision, emulate_fp16, cluster: as for ``grappler_rewrite``.

    Returns:
        The rewritten GraphDef.

    Raises:
        As ``grappler_rewrite``.
    """
    config = oracle_config(precision)
    with environment({EMULATE_FP16_ENV: "1" if emulate_fp16 else "0"}):
        return tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False, cluster=cluster)


_FANIN_CAST = re.compile(r"^(?P<src>.+)-(?P<port>\d+)-CastToFp32-(?P<n>\d+)-AutoMixedPrecision$")


def canonical_cast_names(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of an emulated graph with the float32 Casts one node reads from one tensor renumbered by input port.

    In its CPU emulation TF gives each input port of an emulated node its own Cast to float32, named
    ``<src>-<port>-CastToFp32-<n>-AutoMixedPrecision``; when several ports read the same tensor (MatMul(x, x)),
    the ids follow an absl hash set's order of the ports, which changes from process to process (measured: ports
    0 and 1 of CpuTest.Simple's MatMul got ids 0/1 in some runs and 1/0 in others). Renumbering by port makes two
    graphs comparable node for node. Casts read more than once by the node (shared ones) are left alone.

    Args:
        graph_def: the graph; not modified.

    Returns:
        The renamed copy.
    """
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    rename = {}
    for node in out.node:
        names = [i.split(":")[0] for i in node.input if not i.startswith("^")]
        groups = {}
        for port, name in enumerate(names):
            match = _FANIN_CAST.match(name)
            if match and names.count(name) == 1:
                groups.setdefault((match["src"], match["port"]), []).append((port, int(match["n"]), name))
        for (src, src_port), members in groups.items():
            ids = sorted(n for _, n, _ in members)
            for (_, _, name), n in zip(sorted(members), ids):
                rename[name] = f"{src}-{src_port}-CastToFp32-{n}-AutoMixedPrecision"
    if rename:
        for node in out.node:
            node.name = rename.get(node.name, node.name)
            for k, inp in enumerate(node.input):
                base, colon, port = inp.partition(":")
                if base in rename:
                    node.input[k] = rename[base] + colon + port
    return out


def time_grappler(
    graph_def: graph_pb2.GraphDef, fetches: Sequence[str], precision: str = "float16", repeats: int = 5
) -> float:
    """Median wall time of one ``grappler_rewrite`` call, as a Python caller sees it.

    The Grappler cluster is created once outside the timed region (provisioning it is not part of the pass); each
    timed call includes serializing the MetaGraphDef, the C++ GrapplerItem import, the pass and parsing the result.

    Args:
        graph_def: the graph to rewrite.
        fetches: as for ``grappler_rewrite``.
        precision: as for ``grappler_rewrite``.
        repeats: number of timed calls (after one untimed warm-up call).

    Returns:
        The median of ``repeats`` wall-clock durations, in seconds.
    """
    cluster = gcluster.Cluster()
    try:
        grappler_rewrite(graph_def, fetches, precision, cluster=cluster)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            grappler_rewrite(graph_def, fetches, precision, cluster=cluster)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        cluster.Shutdown()
