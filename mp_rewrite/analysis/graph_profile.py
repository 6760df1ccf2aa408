"""Op costs measured in the graph itself (a front end: this module runs TensorFlow).

The op table (analysis.op_costs) times each op alone. That misses what the graph does around it: TF's remapper
and oneDNN fuse a convolution with its bias and activation (Swish, Relu6) into one kernel, whose bfloat16 time
is nothing like the sum of its parts timed alone; an elementwise op reads what its producer just wrote, in cache.
Measured here on EfficientNetB0 (frozen, batch 8), the op table's cut kept the Swish chains float32 and ran 22
Casts per call, 1.59x float32, while Grappler's lists reached 2.05x.

`profile_costs` (a frozen graph) and `profile_saved_model` (a SavedModel's MetaGraph) measure instead what
TensorRT's builder measures: the graph as it will run. Each runs the model as it is (float32) and as Grappler's
lists rewrite it (every candidate low precision), in alternation, with TF's step stats, in a session configured as
TF serves (remapper and oneDNN fusions on), and reads each node's time in context. A TF1 session inlines a
SavedModel's function calls, so a body's node is timed under the names of the call nodes that lead to it. A node
TF fused into another has no time of its own: it is tied to the consumer that carries the fused kernel's time
(splitting them costs the kernel's time, so the cut keeps a fusion whole). Casts are priced per tensor size from
this machine's cast times (analysis.op_costs). The costs are cached per graph and machine
(analysis.profile_cache), so a model converted again gets the same assignment.

A frozen graph must be self-contained (no variables or tables to capture), every input a number tensor of known
shape once the batch is fixed, and without functions (the loop and branch bodies it calls are not timed under
names that map back to theirs);
`profileable` says why not otherwise, and the caller falls back to the op table.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from ..core import dtypes
from ..core.assignment import CostTable
from ..core.graph_view import parse_input
from .graph_costs import MAIN, cast_costs, constant_names, within_noise
from .profile_cache import graph_bytes, load, profile_key, save

RUNS = 5  # traced runs of each variant, alternated; the median of each node's time is kept
WARMUP = 2
INLINED_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})  # what a TF1 session inlines
MAX_PREFIXES = 8  # call sites followed per function


@dataclasses.dataclass(frozen=True)
class Profile:
    """What profiling measured, beside the CostTable it made.

    Attributes:
        table: the core.assignment.CostTable (label "graph").
        fp32_ms, lists_ms: median wall time of one run of each variant (traced runs, so a little slower than
            untraced ones).
        seconds: what profiling took, both rewrites and all runs included.
    """

    table: CostTable
    fp32_ms: float
    lists_ms: float
    seconds: float


def profileable(graph_def, inputs) -> str:
    """"" when `profile_costs` can run the graph, else why not (one phrase).

    Args:
        graph_def: the graph.
        inputs: [(TensorSpec, placeholder tensor name)] it is fed by.
    """
    if len(graph_def.library.function):
        return "the graph calls functions (control flow or loops), whose nodes step stats do not name"
    for spec, _ in inputs:
        if not (spec.dtype.is_floating or spec.dtype.is_integer or spec.dtype.is_bool):
            return f"input {spec.name or '?'} is {spec.dtype.name}, which cannot be made up"
        if spec.shape.rank is None or any(d is None for d in spec.shape.as_list()[1:]):
            return f"input {spec.name or '?'} has an unknown shape {spec.shape}"
    return ""


def profile_costs(graph_def, inputs, fetches, options, preserve, machine, batch: int | None = None,
                  runs: int = RUNS, progress=None, refresh: bool = False) -> Profile:
    """Measure the cost table of one self-contained graph (a frozen signature) by running it in float32 and as the
    lists make it.

    Args:
        graph_def: the float32 graph; never modified.
        inputs: [(TensorSpec, placeholder tensor name)]; random values of these shapes are fed (an unknown leading
            dimension is `batch`, default 1).
        fetches: the output tensors.
        options: the core.options.Options of the conversion (its lists, keep_fp32, ... make the low variant).
        preserve: as for rewrite_graph_def (the fed placeholders).
        machine: an analysis.op_costs.MachineCosts of this machine: its cast times price the casts.
        runs: traced runs of each variant.
        progress: optional callable (done, total).
        refresh: measure even when the cache holds this graph's costs (and cache the new ones).

    Returns:
        A Profile.
    """
    from ..core.rewrite import rewrite_graph_def
    start = time.perf_counter()
    lists = rewrite_graph_def(graph_def, fetches=fetches, preserve=preserve, options=_lists(options))
    specs = [(spec.dtype.as_datatype_enum, spec.shape.as_list()) for spec, _ in inputs]
    key = profile_key(graph_bytes(graph_def), graph_bytes(lists.graph_def), specs, fetches, batch, runs,
                      machine.machine, machine.precision)
    cached = None if refresh else _cached(key, start)
    if cached is not None:
        return cached
    feeds = {name: value for (_, name), value in zip(inputs, _values(specs, batch))}
    variants = [_Runner.of_graph(g, feeds, fetches) for g in (graph_def, lists.graph_def)]
    times, walls = _alternate(variants, runs, progress)
    return _profile(graph_def, lists, times, walls, {MAIN: [""]}, machine, batch, runs, start, key, fetches)


def profile_saved_model(export_dir, meta_graph, inputs: dict, fetches, options, machine, batch: int | None = None,
                        runs: int = RUNS, progress=None) -> Profile:
    """Measure the cost table of a SavedModel's MetaGraph (its main graph and every function body its signatures
    call) by running it as it is and as the lists rewrite it in place, each loaded in a TF1 session (which inlines
    the function calls: a body node is timed under its call nodes' names, "StatefulPartitionedCall_1/.../name").

    Args:
        export_dir: the SavedModel directory (its variables are read, nothing is written there).
        meta_graph: the MetaGraphDef to profile (the one `tags` select); never modified.
        inputs: signature input tensor name -> (dtype enum, shape with None for unknown dimensions); random values
            are fed (an unknown dimension is `batch`, default 1).
        fetches: the signature output tensor names to run.
        options, machine, batch, runs, progress: as for profile_costs.

    Returns:
        A Profile.
    """
    import shutil
    import tempfile
    from tensorflow.core.protobuf import saved_model_pb2
    from ..core.rewrite import rewrite_meta_graph_def
    start = time.perf_counter()
    export_dir = os.path.abspath(export_dir)  # the rewritten copy links to its variables
    lists = rewrite_meta_graph_def(meta_graph, options=_lists(options))
    key = profile_key(graph_bytes(meta_graph.graph_def), graph_bytes(lists.graph_def), inputs, fetches, batch, runs,
                      machine.machine, machine.precision)
    cached = _cached(key, start)
    if cached is not None:
        return cached
    feeds = dict(zip(inputs, _values(list(inputs.values()), batch)))
    tags = list(meta_graph.meta_info_def.tags)
    with tempfile.TemporaryDirectory(prefix="mp_rewrite_profile_") as rewritten:
        model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
        model.meta_graphs.add().CopyFrom(lists.meta_graph_def)
        with open(os.path.join(rewritten, "saved_model.pb"), "wb") as f:
            f.write(model.SerializeToString())
        for part in ("variables", "assets"):
            if os.path.isdir(os.path.join(export_dir, part)):
                shutil.copytree(os.path.join(export_dir, part), os.path.join(rewritten, part),
                                copy_function=os.symlink)
        variants = [_Runner.of_saved_model(d, tags, feeds, fetches) for d in (str(export_dir), rewritten)]
        times, walls = _alternate(variants, runs, progress)
    return _profile(meta_graph.graph_def, lists, times, walls, _inlined_prefixes(meta_graph.graph_def), machine,
                    batch, runs, start, key, fetches)


def _lists(options):
    return dataclasses.replace(options, assign="lists", costs=None)


def _cached(key: str, start: float) -> Profile | None:
    found = load(key)
    if found is None:
        return None
    table, fp32_ms, lists_ms, path = found
    return Profile(dataclasses.replace(table, note=f"{table.note}; cached in {path}"), fp32_ms, lists_ms,
                   time.perf_counter() - start)


def _profile(graph_def, lists, times, walls, prefixes, machine, batch, runs, start, key, fetches) -> Profile:
    """The CostTable of a graph and the function bodies its lists rewrite reached, from each variant's node times
    (named as the session ran them: a body's nodes under each of its `prefixes`), cached under `key`."""
    from ..core.functions import function_to_graph
    from ..core.op_support import Signatures
    from .graph_costs import measure_casts
    from .shapes import result_shapes
    if measure_casts(machine):
        machine.save_to_cache()
    shapes = result_shapes(lists, batch=1 if batch is None else batch)
    signatures = Signatures(graph_def.library)
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    parts = {MAIN: (graph_def, lists)}
    parts.update((name, (function_to_graph(fdefs[name], signatures).graph_def, result))
                 for name, result in lists.functions.items() if name in fdefs)
    nodes, fusions, casts = {}, {}, {}
    for label, (original, result) in parts.items():
        body = [n.name for n in original.node]
        called = prefixes.get(label, ())  # none for a body the session does not inline (a loop's, a branch's)
        timed = [{name: max(t[p + name] for p in called if p + name in t)
                  for name in body if any(p + name in t for p in called)} for t in times]
        nodes[label] = {name: within_noise(timed[0].get(name, 0.0), timed[1].get(name, 0.0))
                        for name in result.converted_nodes}
        fusions[label] = {}
        for graph, run in ((original, timed[0]), (result.graph_def, timed[1])):
            for fused, carrier in _fused_into(graph, run).items():
                ms = max(timed[0].get(carrier, 0.0), timed[1].get(carrier, 0.0))
                fusions[label][(fused, carrier)] = max(fusions[label].get((fused, carrier), 0.0), ms)
        casts[label] = cast_costs(machine, shapes.get("" if label == MAIN else label, {}), constant_names(original))
    # A loop or branch body runs without being inlined, so none of its nodes has a time of its own: its ops are
    # priced from the op table instead (timed alone), rather than left to the casts around them.
    untimed = [label for label, (_, result) in parts.items()
               if result.converted_nodes and not any(max(ms) for ms in nodes[label].values())]
    if untimed and machine.low_units:
        alone = machine.for_graph(graph_def, machine.precision, fetches=fetches)
        for label in untimed:
            nodes[label], fusions[label] = dict(alone.nodes.get(label, {})), dict(alone.fusions.get(label, {}))
    fp32_ms, lists_ms = (float(np.median(w)) for w in walls)
    note = (f"costs measured in this graph on this machine ({runs} traced runs of each: float32 {fp32_ms:.1f} ms, "
            f"Grappler's lists {lists_ms:.1f} ms per run"
            + (f"; {len(untimed)} loop or branch bodies from the op table)" if untimed else ")"))
    table = CostTable(machine.precision, nodes, casts, fusions, machine.low_units,
                      note if machine.low_units else machine.no_units_note())
    save(key, table, fp32_ms, lists_ms)
    return Profile(table, fp32_ms, lists_ms, time.perf_counter() - start)


def _inlined_prefixes(graph_def) -> dict:
    """{label: [prefix]}: how a TF1 session names the nodes of each function it inlines -- the names of the call
    nodes that lead to it, joined by "/" ("" for the main graph). A function called from two places has two."""
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    prefixes, stack = {MAIN: [""]}, [("", graph_def.node)]
    while stack:
        prefix, nodes = stack.pop()
        for node in nodes:
            called = node.attr["f"].func.name if node.op in INLINED_CALLS else ""
            if called in fdefs and len(prefixes.get(called, ())) < MAX_PREFIXES:
                prefixes.setdefault(called, []).append(f"{prefix}{node.name}/")
                stack.append((f"{prefix}{node.name}/", fdefs[called].node_def))
    return prefixes


def _values(specs, batch: int | None) -> list:
    """Random values for [(dtype enum, shape with None or -1 for unknown dimensions)]: floats in [0, 1), zeros for
    integers (a valid id for any embedding or table)."""
    import tensorflow as tf
    rng = np.random.default_rng(0)
    values = []
    for dtype, shape in specs:
        dtype = tf.as_dtype(dtype)
        shape = [(1 if batch is None else batch) if d is None or d < 0 else d for d in shape]
        values.append(rng.uniform(0, 1, shape).astype(dtype.as_numpy_dtype) if dtype.is_floating
                      else np.zeros(shape, dtype.as_numpy_dtype))
    return values


class _Runner:
    """One variant in its own session, configured as TF serves it (AMP off: the graph says its own dtypes)."""

    def __init__(self, session, feeds, fetches):
        graph = session.graph
        self.session = session
        self.feed_dict = {graph.get_tensor_by_name(k): v for k, v in feeds.items()}
        self.fetches = [graph.get_tensor_by_name(f) for f in fetches]

    @classmethod
    def of_graph(cls, graph_def, feeds, fetches):
        import tensorflow as tf
        from .execution import session_config
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        return cls(tf.compat.v1.Session(graph=graph, config=session_config(fuse=True)), feeds, fetches)

    @classmethod
    def of_saved_model(cls, export_dir: str, tags, feeds, fetches):
        import tensorflow as tf
        from .execution import session_config
        from tensorflow.python.util import deprecation
        session = tf.compat.v1.Session(graph=tf.Graph(), config=session_config(fuse=True))
        with session.graph.as_default(), deprecation.silence():  # the TF1 loader says to use tf.saved_model.load
            tf.compat.v1.saved_model.loader.load(session, tags, export_dir)
        return cls(session, feeds, fetches)

    def run(self, metadata=None):
        from tensorflow.core.protobuf import config_pb2
        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE) if metadata else None
        self.session.run(self.fetches, self.feed_dict, options=options, run_metadata=metadata)


def _alternate(variants, runs: int, progress):
    """Per variant, {node name: median ms of its op in context} and the wall time of each traced run."""
    from tensorflow.core.protobuf import config_pb2
    samples = [{} for _ in variants]
    walls = [[] for _ in variants]
    try:
        for variant in variants:
            for _ in range(WARMUP):
                variant.run()
        for done in range(runs):
            for i, variant in enumerate(variants):
                metadata = config_pb2.RunMetadata()
                begin = time.perf_counter()
                variant.run(metadata)
                walls[i].append((time.perf_counter() - begin) * 1e3)
                for device in metadata.step_stats.dev_stats:
                    for stat in device.node_stats:
                        ms = (stat.op_end_rel_micros - stat.op_start_rel_micros) / 1e3
                        samples[i].setdefault(stat.node_name.split(":")[0], []).append(ms)
            if progress is not None:
                progress(done + 1, runs)
    finally:
        for variant in variants:
            variant.session.close()
    return [{name: float(np.median(ms)) for name, ms in s.items()} for s in samples], walls


def _fused_into(graph_def, timed: dict) -> dict:
    """{node: the node whose kernel it ran in} for the float nodes TF fused away: a node without a time of its own
    whose one data consumer (followed while that too has none) has one."""
    readers = {}
    for node in graph_def.node:
        for t in node.input:
            if not t.startswith("^"):
                readers.setdefault(parse_input(t)[0], set()).add(node.name)
    ops = {node.name: node.op for node in graph_def.node}
    fused = {}
    for node in graph_def.node:
        if node.name in timed or node.op in ("Const", "Identity", "Placeholder") or not _is_float(node):
            continue
        carrier, seen = node.name, set()
        while carrier not in timed and len(readers.get(carrier, ())) == 1 and carrier not in seen:
            seen.add(carrier)
            carrier = next(iter(readers[carrier]))
        if carrier in timed and carrier != node.name and ops.get(carrier) != "Cast":
            fused[node.name] = carrier
    return fused


def _is_float(node) -> bool:
    return node.attr["T"].type in (dtypes.FLOAT, *dtypes.LOW) if "T" in node.attr else False
