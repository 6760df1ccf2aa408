"""Where `--assign cost` gets its costs in a conversion on this machine: measured in the model itself.

With this machine's table (`this_machine`, what `convert --assign cost` uses without `--costs FILE`), each
strategy profiles what it rewrites, as TF will run it (analysis.graph_profile): `--freeze` its frozen graph, the
in-place strategy the MetaGraph (loaded in a TF1 session, function calls inlined). A table from a file (measured
on another machine), a graph that cannot run on made-up inputs, or a model TF cannot load in a session keeps the
op table, and the table's note says why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..analysis.graph_profile import PROFILE_LIMIT  # weights (or a frozen graph) above it are not profiled
from ..analysis.graph_runs import VariantError, onednn_cap
from ..core.effects import effect_line, effects_policy, graph_effects
from ..core.meta_graph import INTERNAL_PREFIX, signature_nodes
from ..core.stand_ins import StandIns, graph_without_effects, meta_graph_without_effects
from ..errors import tf_reason
from ..model.signatures import function_key
from ..rules.graph import resource_source
from .inputs import DEFAULT_DIM, unfeedable_inputs

# An unknown batch dimension is measured at this size, or at --batch-size where that is larger: a batch a server
# runs, where what low precision gains and what a Cast costs are what they will be. Per-node times at a smaller
# batch are mostly per-op overhead and make a poor cut: the Transformer converted with --batch-size 1 (node times
# at batch 1) kept float32 and ran 1.04x float32 at batch 1, where the cut made from batch 8's times ran 1.37x
# there. The variants are raced at the batch asked for (raced_batches), which decides.
MEASURED_BATCH = 8


def measured_batch(options) -> int:
    """The batch size node times are measured at: MEASURED_BATCH, or --batch-size where that is larger."""
    return max(options.costs.batch or MEASURED_BATCH, MEASURED_BATCH)


def raced_batches(options) -> tuple:
    """The batch sizes the variants are raced at to choose among them: --batch-size alone, else RACE_BATCHES (the
    best across them is kept)."""
    from ..analysis.variant_race import RACE_BATCHES
    return (options.costs.batch,) if options.costs.batch else RACE_BATCHES


def measuring(options) -> bool:
    """Whether the conversion's costs are this machine's, to be measured (not a file's, not the lists)."""
    costs = options.costs
    return options.assign == "cost" and getattr(costs, "measure", False) and costs.low_units


def frozen_costs(options, graph_def, frozen, fetches, fed: dict, source=None):
    """The options with the costs of one frozen signature's graph (frozen_signature.FrozenSignature); `source`: the
    graph before the rules rewrote it, raced as the baseline where they changed it (keep "source" where it ran
    fastest: savedmodel.freeze then rewrites it instead)."""
    from ..analysis.graph_profile import profile_costs, profileable
    if not measuring(options):
        return options
    given = graph_def
    graph_def, source, stand_ins = _frozen_stand_ins(graph_def, source, fetches, frozen.key)
    if not stand_ins.stands:
        return _op_table(options, given, fetches, _not_run(stand_ins))
    why = "it reads tables or kept variables" if frozen.captured or frozen.variables else ""
    size = graph_def.ByteSize()
    inputs = [(_sized_spec(spec, measured_dim(options)), name) for spec, name in frozen.inputs]
    why = why or (f"a {size / 2**30:.1f} GiB graph, over the {PROFILE_LIMIT / 2**30:.0f} GiB profiled"
                  if size > PROFILE_LIMIT else profileable(graph_def, inputs))
    if why:
        return _op_table(options, _with_variable_shapes(graph_def, frozen.variables), fetches, why)
    try:
        profile = profile_costs(graph_def, inputs, fetches, options, fed, options.costs,
                                measured_batch(options), batches=raced_batches(options),
                                source=None if source is None or source == graph_def else source)
    except VariantError as e:
        return _without_failed(options, graph_def, fetches, e)
    made_up = any(spec.shape.rank is not None and _inner_unknown(spec.shape.as_list()) for spec, _ in frozen.inputs)
    table = _say_stood_in(_say_made_up(profile.table, made_up, measured_dim(options)), stand_ins)
    return dataclasses.replace(options, costs=table)


def measured_dim(options, recipe=None) -> int:
    """The size unknown input dimensions other than the batch are measured and timed at: --seq-len, as the cost
    assignment holds it or, where nothing is measured (--assign lists), as the run check's inputs (`recipe`,
    inputs.InputRecipe) do; else the made-up inputs' default."""
    return getattr(options.costs, "dim", None) or getattr(recipe, "dim", None) or DEFAULT_DIM


def _sized(dims: list, dim: int) -> list:
    """A shape's dimensions (None or -1 for an unknown one) with each unknown one but the first `dim` (a sequence's
    length); the batch stays unknown (None), to be measured at the batches chosen."""
    return [d if d is not None and d >= 0 else None if i == 0 else dim for i, d in enumerate(dims)]


def _sized_spec(spec, dim: int):
    """The TensorSpec with its dimensions `_sized`."""
    import tensorflow as tf
    return spec if spec.shape.rank is None else tf.TensorSpec(_sized(spec.shape.as_list(), dim), spec.dtype, spec.name)


def _say_made_up(table, made_up: bool, dim: int):
    """The table, its note saying that an unknown dimension other than the batch was measured as `dim`, and its
    decision (the first line) too: the figures there hold at that length (keras-hub's BERT exported with its length
    unknown measured bfloat16 1.15x slower at batch 1 at the default 16 tokens and wrote float32, 1.23x faster at
    128), and the line is where a user reads what to pass."""
    if not made_up:
        return table
    decision = getattr(table, "decision", "")
    return dataclasses.replace(
        table, note=f"{table.note}; unknown dimensions other than the batch measured as {dim} (--seq-len)",
        **({"decision": f"{decision} (a length the model leaves unknown measured as {dim}: --seq-len sets the "
                        "length served)"} if decision else {}))


def _inner_unknown(dims) -> bool:
    """Whether a shape (a list, None or -1 for an unknown dimension; None for an unknown rank) has an unknown
    dimension other than the first."""
    return dims is not None and any(d is None or d < 0 for d in dims[1:])


def in_place_costs(options, source_dir, meta_graph, keys=None, source=None):
    """The options with the costs of one MetaGraph of the SavedModel at `source_dir`, profiled through the
    signatures (`keys`, else every one) whose inputs random data can make. `source`: the MetaGraph as the directory
    holds it, when `meta_graph` is the rules' rewrite of it: raced too, and kept where nothing beats it (the costs'
    keep is then "source": savedmodel.in_place writes it without the rules)."""
    from ..analysis.graph_profile import profile_saved_model
    if not measuring(options):
        return options
    given = meta_graph
    meta_graph, source, stand_ins = _in_place_stand_ins(meta_graph, source, keys)
    if not stand_ins.stands:
        return _op_table(options, given.graph_def, signature_nodes(given, outputs_only=True), _not_run(stand_ins))
    inputs, fetches, seen, made_up = {}, [], set(), False
    for key, signature in sorted(meta_graph.signature_def.items()):
        if key.startswith(INTERNAL_PREFIX) or (keys and key not in keys):
            continue
        if unfeedable_inputs(meta_graph, [key], {}):
            continue
        identity = _call_identity(meta_graph, signature)
        if identity is not None and identity in seen:  # a twin ("serve" beside "serving_default"): run once
            continue
        seen.add(identity)
        for info in signature.inputs.values():
            dims = [d.size for d in info.tensor_shape.dim]
            made_up = made_up or _inner_unknown(dims)
            inputs[info.name] = (info.dtype, _sized(dims, measured_dim(options)))
        fetches += [info.name for info in signature.outputs.values()]
    graph_fetches = signature_nodes(meta_graph, outputs_only=True)
    if not fetches:
        return _op_table(options, meta_graph.graph_def, graph_fetches, "no signature has inputs random data can make")
    weights = sum(f.stat().st_size for f in Path(source_dir, "variables").glob("*") if f.is_file())
    if weights > PROFILE_LIMIT:
        return _op_table(options, meta_graph.graph_def, graph_fetches, f"{weights / 2**30:.1f} GiB of weights, over "
                         f"the {PROFILE_LIMIT / 2**30:.0f} GiB profiled (it would be loaded twice)")
    try:
        profile = profile_saved_model(str(source_dir), meta_graph, inputs, list(dict.fromkeys(fetches)), options,
                                      options.costs, measured_batch(options), batches=raced_batches(options),
                                      source=None if source is None or source == meta_graph else source)
    except VariantError as e:
        return _without_failed(options, meta_graph.graph_def, graph_fetches, e)
    except Exception as e:  # noqa: BLE001 -- whatever TF's session loader refuses: the op table serves
        why = f"TensorFlow could not run it ({tf_reason(e)})"
        return _op_table(options, meta_graph.graph_def, graph_fetches, why)
    table = _say_stood_in(_say_made_up(profile.table, made_up, measured_dim(options)), stand_ins)
    return dataclasses.replace(options, costs=table)


def _in_place_stand_ins(meta_graph, source, keys) -> tuple:
    """(the MetaGraph to measure, the source to race, StandIns): copies in which the ops with effects of what the
    signatures run do nothing (core.stand_ins), unless the effects policy runs the model as it is."""
    if effects_policy().run:
        return meta_graph, source, StandIns()
    measured, stand_ins = meta_graph_without_effects(meta_graph, keys)
    if source is None or source is meta_graph:
        return measured, None if source is None else measured, stand_ins
    return measured, meta_graph_without_effects(source, keys)[0], stand_ins


def _frozen_stand_ins(graph_def, source, fetches, key: str) -> tuple:
    """(the frozen graph to measure, the source graph to race, StandIns), as _in_place_stand_ins."""
    if effects_policy().run:
        return graph_def, source, StandIns()
    measured, stand_ins = graph_without_effects(graph_def, graph_effects(graph_def, fetches, key), fetches)
    if source is None or source is graph_def:
        return measured, None if source is None else measured, stand_ins
    return measured, graph_without_effects(source, graph_effects(source, fetches, key), fetches)[0], stand_ins


def _not_run(stand_ins) -> str:
    """Why a model with effects no copy can stand for is priced from the op table."""
    return (f"{effect_line(stand_ins.effects)}, not run, and no copy without them stands for the model "
            f"({stand_ins.blocked[0]}); --run-effects measures the model as it is")


def _say_stood_in(table, stand_ins):
    """The table, its note saying that the model's effects were not run where it was measured."""
    if not stand_ins.effects:
        return table
    return dataclasses.replace(table, note=f"{table.note}; measured on a copy in which the ops with effects do "
                                           f"nothing ({effect_line(stand_ins.effects)})")


def _call_identity(meta_graph, signature):
    """What a signature computes, but for its names: the functions its outputs' call nodes run (their FunctionDefs
    without their names and argument names) and what else those nodes read (the variables they capture); None when
    an output is not a function call's. Twins -- a Keras export's "serve" and "serving_default" -- have one, and
    are run once: a session run of both ran the model twice at once, two calls on two cores, a regime nobody serves
    in (ResNet-50 at batch 1 read 93 ms per run where one call takes 55-65)."""
    nodes = {node.name: node for node in meta_graph.graph_def.node}
    fdefs = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    fed = {info.name.split(":")[0] for info in signature.inputs.values()}
    parts = []
    for output in sorted(info.name for info in signature.outputs.values()):
        node = nodes.get(output.split(":")[0])
        # `"f" in node.attr` first: reading a missing key of a proto map would add it to the graph to be written.
        if node is None or "f" not in node.attr or node.attr["f"].func.name not in fdefs:
            return None
        parts.append((output.partition(":")[2], function_key(fdefs[node.attr["f"].func.name]),
                      tuple(t if t.split(":")[0] not in fed else "" for t in node.input)))
    return tuple(parts)


def _with_variable_shapes(graph_def, variables: dict):
    """A copy of a frozen graph whose reads of kept variables state their shapes (`_output_shapes`): to TF's shape
    inference a variable's placeholder is a handle of no shape, and the op table would price every matmul that
    reads one at nothing."""
    if not variables:
        return graph_def
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    nodes = {node.name: node for node in out.node}
    for node in out.node:
        if node.op != "ReadVariableOp" or not node.input:
            continue
        source = resource_source(nodes, node.input[0])
        if source in variables:
            shape = node.attr["_output_shapes"].list.shape
            del shape[:]
            shape.add().CopyFrom(variables[source].shape.as_proto())
    return out


def _without_failed(options, graph_def, fetches, error):
    """The options once a variant failed while timed (graph_runs.VariantError). Float32 failing means the model
    does not run on made-up inputs: the op table serves, as before. A low-precision variant failing (a kernel this
    CPU cannot run in the precision) leaves float32, the one that runs: every op stays float32, and the note (the
    line the conversion prints) says why in TensorFlow's words. Timing the ops alone instead would run the same
    kernels, and oneDNN aborts the process on some ("could not create a primitive descriptor for the matmul")."""
    from ..core.assignment import CostTable
    if error.index == 0:
        return _op_table(options, graph_def, fetches, f"TensorFlow could not run it ({error.reason})")
    note = (f"{options.precision} cannot run here: {error}; every op stays float32, the one that runs (on this CPU "
            f"as configured{onednn_cap()})")
    return dataclasses.replace(options, costs=CostTable(options.precision, low_units=False, note=note))


def _op_table(options, graph_def, fetches, why: str):
    table = options.costs.for_graph(graph_def, options.precision, fetches=fetches)
    return dataclasses.replace(options, costs=dataclasses.replace(
        table, note=f"{table.note} (not measured in the graph: {why})"))
