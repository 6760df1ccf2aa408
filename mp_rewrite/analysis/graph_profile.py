"""Op costs measured in the graph itself (a front end: this module runs TensorFlow).

The op table (analysis.op_costs) times each op alone. That misses what the graph does around it: TF's remapper
and oneDNN fuse a convolution with its bias and activation (Swish, Relu6) into one kernel, whose bfloat16 time
is nothing like the sum of its parts timed alone; an elementwise op reads what its producer just wrote, in cache.
Measured here on EfficientNetB0 (frozen, batch 8), the op table's cut kept the Swish chains float32 and ran 22
Casts per call, 1.59x float32, while Grappler's lists reached 2.05x.

`profile_costs` (a frozen graph), `profile_saved_model` (a SavedModel's MetaGraph) and `profile_body` (a function
body the training hook rewrites: a whole training step, run with copies of its variables) measure instead what
TensorRT's builder measures: the graph as it will run. Each runs the model as it is (float32) and as Grappler's
lists rewrite it (every candidate low precision), in alternation, traced, and reads each node's time in context:
a graph or a body in a session configured as TF serves (remapper and oneDNN fusions on), with TF's step stats; a
TF2 SavedModel as TF2 serves it, each signature called under TF's profiler (analysis.served_trace). A session
fuses less than a signature call (its inlined functions lose their traced shapes, and the remapper then leaves
ResNet-50's residual adds and Relus standalone), so the cut was priced for a model the user never runs. A
function body's node is timed under the names of the call nodes that lead to it (analysis.call_names). A node
TF fused into another has no time of its own: it is tied to the consumer that carries the fused kernel's time
(splitting them costs the kernel's time, so the cut keeps a fusion whole). The traced runs are paired run by run,
and the candidates of one op type are priced together (graph_costs.pooled_pairs: each node's least time, at its op
type's measured ratio) and go to one side together, so the noise of one measurement moves no single node. Casts
are priced per tensor size from
this machine's cast times (analysis.op_costs). The costs are cached per graph and machine
(analysis.profile_cache), so a model converted again gets the same assignment. Beside the candidates' costs the
table keeps what the runs measured for reports (analysis.run_times.RunTimes: every executed op's time counted
once, the whole runs untraced, the kernels TF ran); a cache file without it is measured again, with a message.

A frozen graph must be self-contained (no variables or tables to capture), every input a number tensor of known
shape once the batch is fixed, and without functions (the loop and branch bodies it calls are not timed under
names that map back to theirs); a body's arguments must be number tensors or variables, and it must call no
functions. `profileable` and `body_profileable` say why not otherwise, and the caller falls back to the op table.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ..core import dtypes
from ..core.assignment import CostTable
from ..core.graph_view import parse_input
from .graph_costs import MAIN, cast_costs, constant_names, pooled_pairs
from .graph_runs import LOG, FunctionRunner, Runner, VariantError, opened, saved_model_copy, traced_times
from .op_costs import onednn_settings
from .profile_cache import graph_bytes, load, profile_key, save
from .call_names import INLINED_CALLS, call_nodes, executed_names, inlined_prefixes
from .run_times import Recorded, run_times
from .served_trace import SignatureRunner
from .variant_race import demotes, distinct, feeds_by_batch, race_variants

RUNS = 5  # traced runs of each variant, alternated; the median of each node's time is kept
PROFILE_LIMIT = 2**30  # bytes of weights above which nothing is profiled: every variant run holds its own copy
UNFUSED = frozenset({"Const", "Identity", "Placeholder", "_Arg", "_Retval"})  # no time of their own, never fused


@dataclasses.dataclass(frozen=True)
class Profile:
    """What profiling measured, beside the CostTable it made.

    Attributes:
        table: the core.assignment.CostTable (label "graph").
        fp32_ms, lists_ms: median wall time of one run of each variant (traced runs, so a little slower than
            untraced ones).
    """

    table: CostTable
    fp32_ms: float
    lists_ms: float


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
                  runs: int = RUNS, progress=None, refresh: bool = False, batches=(), source=None) -> Profile:
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
        batches: the batch sizes the variants are raced at (variant_race); () races them at `batch`.
        source: the graph before the rules rewrote it into `graph_def` (None: they did not): it is raced too, as
            the baseline, and kept (the table's keep "source") where it runs fastest.

    Returns:
        A Profile.
    """
    from ..core.rewrite import rewrite_graph_def
    specs = [(spec.dtype.as_datatype_enum, spec.shape.as_list()) for spec, _ in inputs]
    feeds_at = feeds_by_batch([name for _, name in inputs], specs)
    return _profile(graph_def, lambda opts: rewrite_graph_def(graph_def, fetches=fetches, preserve=preserve,
                                                              options=opts),
                    lambda result: Runner.of_graph(result.graph_def if result else graph_def, feeds_at(batch),
                                                   fetches),
                    [specs, fetches], {MAIN: [""]}, options, machine, batch, runs, progress, refresh, fetches,
                    batches=distinct(batches, feeds_at),
                    source=None if source is None else lambda: Runner.of_graph(source, feeds_at(batch), fetches))


def profile_saved_model(export_dir, meta_graph, inputs: dict, fetches, options, machine, batch: int | None = None,
                        runs: int = RUNS, progress=None, batches=(), source=None) -> Profile:
    """Measure the cost table of a SavedModel's MetaGraph (its main graph and every function body its signatures
    call) by running it as it is and as the lists rewrite it in place: a TF2 export's signatures as TF2 serves
    them (served_trace.SignatureRunner, each call traced by TF's profiler), a TF1 export's main graph in a TF1
    session; a body node is timed under its call nodes' names, "StatefulPartitionedCall_1/.../name".

    Args:
        export_dir: the SavedModel directory (its variables are read, nothing is written there).
        meta_graph: the MetaGraphDef to profile (the one `tags` select); never modified.
        inputs: signature input tensor name -> (dtype enum, shape with None for unknown dimensions); random values
            are fed (an unknown dimension is `batch`, default 1).
        fetches: the signature output tensor names to run.
        options, machine, batch, runs, progress, batches: as for profile_costs.
        source: the MetaGraphDef as the directory holds it, when `meta_graph` is a rewrite of it (the rules'): it
            is raced too, and kept (the table's keep "source") unless a variant beats it.

    Returns:
        A Profile.
    """
    import tempfile
    from ..core.rewrite import rewrite_meta_graph_def
    export_dir = os.path.abspath(export_dir)  # the rewritten copies link to its variables
    feeds_at = feeds_by_batch(list(inputs), list(inputs.values()))
    tags = list(meta_graph.meta_info_def.tags)
    with tempfile.TemporaryDirectory(prefix="mp_rewrite_profile_") as work:
        def copy(result, graph=None) -> str:
            # float32 is `meta_graph` as given, which need not be the directory's own: in place, the rules
            # canonicalize the functions first (savedmodel.in_place.rules_before_pass), and the directory's graph
            # would be timed under names (and function names) the rewritten graph does not have.
            graph = graph or (result.meta_graph_def if result else meta_graph)
            return saved_model_copy(export_dir, graph, tempfile.mkdtemp(dir=work))

        called = {key: {arg: info.name for arg, info in signature.inputs.items()}
                  for key, signature in sorted(meta_graph.signature_def.items())
                  if signature.inputs and all(info.name in inputs for info in signature.inputs.values())}
        calls = call_nodes(meta_graph, called)

        def served(result, graph=None):  # each variant as TF2 serves it
            return SignatureRunner(copy(result, graph), tags, called, feeds_at(batch), calls)
        return _profile(meta_graph.graph_def, lambda opts: rewrite_meta_graph_def(meta_graph, options=opts),
                        served if calls else (lambda result: Runner.of_saved_model(copy(result), tags,
                                                                                    feeds_at(batch), fetches)),
                        [inputs, fetches, bool(calls)], inlined_prefixes(meta_graph.graph_def), options, machine,
                        batch, runs, progress, False, fetches, None if calls else served, distinct(batches, feeds_at),
                        None if source is None else lambda: served(None, source), " as TF serves it")


def profile_body(body, args, options, signatures, machine, batch: int | None = None, runs: int = RUNS,
                 progress=None, function=None) -> Profile:
    """Measure the cost table of one function body -- a training step's, traced by the tf.function hook -- by
    running it in float32 and as the lists rewrite it (core.body.rewrite_body, as the hook does), each in a session
    with variables of its own (analysis.graph_runs.Runner.of_body: the caller's variables are read, never written).

    Args:
        body: a core.functions.BodyGraph; never modified.
        args: one analysis.graph_runs.BodyArg per argument of the body, in order.
        options: the core.options.Options of the rewrite.
        signatures: the core.op_support.Signatures of the functions the body calls.
        machine, batch, runs, progress: as for profile_costs.
        function: the body's FunctionDef as traced. When given, the cut is raced against float32 and the lists as
            the step will run, each variant a FunctionDef called in the eager function runtime (graph_runs.
            FunctionRunner), not in the sessions that give the node times.

    Returns:
        A Profile (its table's graph label is MAIN, under which rewrite_body looks up a body's costs).
    """
    from ..core.body import rewrite_body
    from ..core.functions import graph_to_function
    specs = [(arg.dtype, list(arg.shape), arg.variable) for arg in args]
    targets = sorted(name for name in body.control_outputs if not name.startswith("^"))  # control_ret is a map
    racer = None if function is None else (lambda result: FunctionRunner(
        graph_to_function(result.graph_def if result else body.graph_def, function, signatures), args, batch))
    return _profile(body.graph_def,
                    lambda opts: rewrite_body(body.graph_def, opts, body.retvals, body.preserved(), signatures,
                                              preserve_stateful=True, label=MAIN),
                    lambda result: Runner.of_body(result.graph_def if result else body.graph_def, args,
                                                  body.retvals, targets, batch),
                    [specs, body.retvals, targets], {MAIN: [""]}, options, machine, batch, runs, progress, False,
                    body.retvals, racer, where=" as the function runs")


def body_profileable(graph_def, args) -> str:
    """"" when `profile_body` can run a body with these arguments (BodyArgs, None for one it cannot make), else
    why not (one phrase)."""
    if any(arg is None for arg in args):
        return "an argument is neither a number tensor nor a variable"
    if any(arg.variable and any(d is None or d < 0 for d in arg.shape) for arg in args):
        return "a variable's shape is unknown"
    import tensorflow as tf
    size = sum(int(np.prod(arg.shape)) * tf.as_dtype(arg.dtype).size for arg in args if arg.variable)
    if size > PROFILE_LIMIT:
        return (f"its variables hold {size / 2**30:.1f} GiB, over the {PROFILE_LIMIT / 2**30:.0f} GiB profiled "
                "(each variant run would hold a copy)")
    calls = {f.signature.name for f in graph_def.library.function}
    if any(node.op in INLINED_CALLS or node.op in calls or "f" in node.attr or "body" in node.attr
           for node in graph_def.node):
        return "the body calls functions, whose nodes step stats do not name"
    return ""


def _profile(graph_def, rewrite, run, key_parts, prefixes, options, machine, batch, runs, progress, refresh,
             fetches, racer=None, batches=None, source=None, where: str = "") -> Profile:
    """What every front end does: rewrite with the lists (`rewrite(options)` -> RewriteResult), run float32 and the
    lists' variant (`run(None or RewriteResult)` -> Runner) traced, build the table, race the variants
    (variant_race.race_variants: in those sessions, or as `racer(None or RewriteResult)` runs each, `where` saying
    how; at each of `batches`, {batch size: feeds}; with `source()`, a runner of the model as given before the
    rules) and keep the best, and cache it all, with what the runs measured (run_times.RunTimes), under a key of
    both graphs and `key_parts`."""
    lists = rewrite(_lists(options))
    # The model is timed here, under this process's oneDNN settings, whatever machine table prices its casts.
    key = profile_key(graph_bytes(graph_def), graph_bytes(lists.graph_def), *key_parts, batch, runs,
                      machine.machine, machine.precision, racer is not None, onednn_settings(), sorted(batches or ()),
                      source is not None)
    cached = None if refresh else _cached(key)
    if cached is not None:
        return cached
    with opened([]) as runners:
        traced = [Recorded(run(None)), Recorded(run(lists))]
        runners += traced
        times = traced_times(runners, runs, progress)[0]
        walls = [r.traced for r in traced]
        kernels = [r.runner.kernels() for r in traced]
        table = _table(graph_def, lists, times, walls, prefixes, machine, batch, runs, fetches)
        cut = rewrite(dataclasses.replace(options, assign="cost", costs=table))
        # The cut's own run, traced too where it is a graph of its own and runs where the others ran: reports of the
        # cut read its nodes' times from it, not from the lists' run with its float32 nodes put back (which left
        # out what the cut's Casts and split fusions cost: its sum fell ~20% short of its run).
        mine = Recorded(run(cut)) if racer is None and demotes(cut) else None
        if mine is not None:
            runners.append(mine)
            try:
                traced_times([mine], runs)
                kernels.append(mine.runner.kernels())  # before the race feeds it other batch sizes
            except VariantError:  # it fails in the race too, which says so and goes on without it
                mine.samples.clear()

        def racing(with_cut: bool):  # the float32, lists, cut and source runners to race (closed on the way out)
            if racer is None:
                runners.extend([source()] if source else [])
                return runners
            while runners:  # done with: their copies of the variables go before the racers make theirs
                runners.pop().close()
            runners.extend(racer(result) for result in (None, lists, *([cut] if with_cut else [])))
            runners.extend([source()] if source else [])
            return runners
        table, raced = race_variants(table, cut, racing, batches or {batch: None}, batch, where,
                                     source is not None)
        names = [executed_names(graph_def, prefixes), executed_names(lists.graph_def, prefixes)]
        measured = run_times(traced, names, kernels[:2], raced)
        if mine is not None and mine.samples:
            measured = dataclasses.replace(measured, cut=run_times(
                [traced[0], mine], [names[0], executed_names(cut.graph_def, prefixes)], [kernels[0], kernels[2]],
                raced))
    return _saved(key, dataclasses.replace(table, runs=measured), walls)


def _lists(options):
    return dataclasses.replace(options, assign="lists", costs=None)


def _cached(key: str) -> Profile | None:
    found = load(key)
    if found is None:
        return None
    table, fp32_ms, lists_ms, path = found
    if table.runs is None:
        LOG.warning("the costs cached in %s were measured by an earlier mp_rewrite, which timed the candidate ops "
                    "only: measuring the model again (once; the cache then holds every op's time)", path)
        return None
    return Profile(dataclasses.replace(table, note=f"{table.note}; cached in {path}"), fp32_ms, lists_ms)


def _saved(key: str, table: CostTable, walls) -> Profile:
    fp32_ms, lists_ms = _medians(walls)
    save(key, table, fp32_ms, lists_ms)
    return Profile(table, fp32_ms, lists_ms)


def _untimed_said(graph_def, untimed: list) -> str:
    """What the note says of the bodies priced from the op table: loop or branch bodies the graph calls, and
    functions nothing the graph runs calls (tf_keras keeps each layer's call functions in the library)."""
    from ..core.functions import called_functions, reachable_functions
    names = {f.signature.name for f in graph_def.library.function}
    called = set(reachable_functions(graph_def.library, called_functions(graph_def.node, names)))
    bodies, idle = sum(label in called for label in untimed), sum(label not in called for label in untimed)
    said = [f"{bodies} loop or branch bodies" if bodies else "", f"{idle} functions nothing here calls" if idle else ""]
    return f"; {' and '.join(x for x in said if x)} from the op table" if untimed else ""


def _medians(walls) -> tuple:
    """The median wall ms of each variant's traced runs (float32, then the lists')."""
    return tuple(float(np.median(w)) for w in walls)


def _table(graph_def, lists, times, walls, prefixes, machine, batch, runs, fetches) -> CostTable:
    """The CostTable of a graph and the function bodies its lists rewrite reached, from each variant's node times
    ({name: [ms in each traced run]}, named as the session ran them: a body's nodes under each of its `prefixes`)."""
    from .graph_costs import label_graphs, measure_casts
    from .shapes import result_shapes
    if measure_casts(machine):
        machine.save_to_cache()
    shapes = result_shapes(lists, batch=1 if batch is None else batch)
    parts = label_graphs(graph_def, lists)
    nodes, fusions, casts, together = {}, {}, {}, {}
    for label, (original, result) in parts.items():
        body = [n.name for n in original.node]
        called = prefixes.get(label, ())  # none for a body the session does not inline (a loop's, a branch's)
        # Each node's times per run, under the call that took longest (a body called from two places).
        timed = [{name: max((t[p + name] for p in called if p + name in t), key=np.median)
                  for name in body if any(p + name in t for p in called)} for t in times]
        ops = {n.name: n.op for n in original.node}
        together[label] = {name: ops.get(name, "") for name in result.converted_nodes}
        nodes[label] = pooled_pairs(timed[0], timed[1], together[label])
        fusions[label] = {}
        for graph, run in ((original, timed[0]), (result.graph_def, timed[1])):
            for fused, carrier in _fused_into(graph, run).items():
                ms = max(min(timed[0].get(carrier, (0.0,))), min(timed[1].get(carrier, (0.0,))))
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
    fp32_ms, lists_ms = _medians(walls)
    at = f" at batch {batch}" if batch is not None else ""
    note = (f"costs measured in this graph on this machine{at} ({runs} traced runs of each: float32 {fp32_ms:.1f} ms, "
            f"Grappler's lists {lists_ms:.1f} ms per run{_untimed_said(graph_def, untimed)})")
    return CostTable(machine.precision, nodes, casts, fusions, machine.low_units,
                     note if machine.low_units else machine.no_units_note(), together=together)


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
        if node.name in timed or node.op in UNFUSED or not _is_float(node):
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


def measured_runs(table: CostTable) -> dict:
    """The whole-model times per run a profiled table's runs measured (run_times.RunTimes), for reports that show
    them beside the per-node times: {"traced": (float32 ms, lists ms)} of the traced runs (step stats on, so
    slower), {"untraced": (float32, lists)} of untraced ones, and when the cut was raced {"raced": (float32, lists,
    cut ms)}; {} for a table not profiled in its graph (an op table, a cost file, a cache of an earlier version)."""
    runs = getattr(table, "runs", None)
    if runs is None:
        return {}
    found = {"traced": tuple(runs.traced), "untraced": tuple(runs.untraced)}
    if runs.raced:
        found["raced"] = tuple(runs.raced)
    return found
