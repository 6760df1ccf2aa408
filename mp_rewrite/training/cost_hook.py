"""The cost assignment (`assign="cost"`, the default for bfloat16 on a CPU) in the tf.function hook.

A traced body's costs are measured as a conversion measures a model (analysis.graph_profile): the body -- a
training step: forward, backward and update -- runs in float32 and as Grappler's lists rewrite it, in sessions of
its own whose variables are copies of the step's (read from the captured variables, never written), and TF's step
stats give each node's time in context, fusions included; the cut is then raced against both as the step will run,
each variant called as a function in the eager runtime with variables of its own (analysis.graph_runs.
FunctionRunner). `plan` decides when: at once from the cache of an earlier measuring, else across the step's first
calls (analysis.step_profile, training.deferred) while it runs the lists. A distributed step is measured once for
the job, as a copy one process can run (training.job_decision: in a job of several processes, by the leader, whose
decision every worker runs); a body that cannot run alone (an argument that is neither a number nor a
variable, such as an iterator; a call into other functions) is priced from the op table (each op timed alone), and
the log says why. Either way the hook must leave the functions registered while measuring alone, work eagerly,
and hand the cost model the shapes the FuncGraph knows (a FunctionDef keeps its arguments' shapes, not its
variables')."""

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
    core.functions.BodyGraph, the rewrite's Options and Signatures, its name, and its GraphDef as traced (None: the
    body is the traced one)."""

    atomic: object
    body: object
    options: object
    signatures: object
    name: str
    traced: object = None


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
def rewriting(atomic, body, options, signatures, name: str, traced=None):
    """Make the body the hook rewrites meanwhile known to HookSafeCosts (`atomic` None: nothing is known; `traced`:
    the body's GraphDef as traced, when the graph rules changed it)."""
    _LOCAL.body = _Body(atomic, body, options, signatures, name, traced) if atomic is not None else None
    try:
        yield
    finally:
        _LOCAL.body = None


class HookSafeCosts:
    """A machine cost table (analysis.op_costs.this_machine) as the hook's rewrite options use it: a step that `plan`
    cannot measure as it runs is priced from the op table (each op timed alone), eagerly, unseen by the hook, with
    the FuncGraph's shapes on its nodes."""

    def __init__(self, table):
        self.table, self.precision = table, table.precision

    def for_graph(self, graph_def, precision=None, fetches=(), batch=None):
        """The core.assignment.CostTable of one function body from the op table (measuring what it lacks)."""
        import tensorflow as tf
        current = getattr(_LOCAL, "body", None)
        if current is not None and current.body.graph_def is graph_def:
            graph_def = _annotated(graph_def, _func_graph_shapes(current.atomic, current.traced, graph_def))
        with paused(), tf.init_scope():
            return self.table.for_graph(graph_def, precision, fetches, batch)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the hook rewrites a traced body now, and what it measures later.

    Attributes:
        options: the Options to rewrite `body` with now (None: leave the body as traced, float32 measured fastest).
        body: the core.functions.BodyGraph to rewrite now (the traced one, or the one the graph rules changed).
        changes: what the graph rules changed in `body` (training.step_rules: BatchNorm layers fused, rewrite rules
            applied; one phrase each); empty when `body` is the traced one.
        later: a StepMeasure to finish across the next calls (training.deferred), or None.
        fused_body: the body the graph rules changed, which a measured cut rewrites (`later`'s, unannotated).
    """

    options: object
    body: object
    changes: tuple = ()
    later: object = None
    fused_body: object = None


def plan(atomic, traced, options, signatures, name: str) -> Plan:
    """How to rewrite a traced body (core.functions.BodyGraph): see Plan.

    With assign="cost", the graph rules run first (training.step_rules: Keras 3's training BatchNorms fused, then,
    opted in, the rewrite rules valid in a training step). With this machine's table (HookSafeCosts, low-precision
    units): a step measured before here (in any process) gets what that measuring chose at once -- the cut of the
    changed step, Grappler's lists or float32 as traced, whichever ran fastest; a step that runs alone the lists as
    traced now, and a StepMeasure of it across its next calls; anything else (an iterator argument, calls into other
    functions) the op table's cut of the changed step. A distributed step (tf.
    distribute: collective ops or several devices) is measured as job_decision.standalone copies it; in a job of
    several processes only the leader measures, and every worker does what it decided (job_decision), and a step
    the leader cannot measure runs Grappler's lists as traced on every worker.
    """
    from .step_rules import rewritten_step
    body, changes = rewritten_step(atomic, traced, options, name)
    costs = options.costs
    if options.assign != "cost" or not isinstance(costs, HookSafeCosts) or not costs.table.low_units:
        return Plan(options, body, changes)
    shapes = _func_graph_shapes(atomic) if atomic is not None else {}
    graph_def = _annotated(body.graph_def, _func_graph_shapes(atomic, traced.graph_def, body.graph_def))
    unfused = _annotated(traced.graph_def, shapes) if changes else None
    spread = distributed(graph_def)
    if not spread:
        measure, found, why = _measure(atomic, traced, body, graph_def, unfused, options, signatures)
        if why:
            logger.info("mp_rewrite: %s: costs from the op table: %s", name, why)
            return Plan(options, body, changes)
        return _planned(measure, found, options, traced, body, changes)
    return _distributed_plan(atomic, traced, body, changes, graph_def, unfused, options, signatures, name, spread)


def _distributed_plan(atomic, traced, body, changes, graph_def, unfused, options, signatures, name, spread) -> Plan:
    """`plan` for a step of tf.distribute (`spread` says why it is one): measured once for the job (job_decision)."""
    from . import job_decision
    try:
        share = job_decision.share_for(traced.graph_def)
    except job_decision.NoSharing as error:
        share, alone, why = None, None, str(error)
    else:
        if share is not None and not share.leader:
            return _follow(share, options, traced, body, changes, name)
        alone, why = job_decision.standalone(graph_def)
    if alone is not None and unfused is not None:
        unfused, why = job_decision.standalone(unfused)
    measure, found = None, None
    if not why:
        measure, found, why = _measure(atomic, traced, body, alone, unfused, options, signatures)
    if why:
        logger.info("mp_rewrite: %s: %s; not measured (%s), so Grappler's lists on every replica and worker", name,
                    spread, why)
        if share is not None:
            share.publish_plan("lists")
        return Plan(_lists(options), traced)
    logger.info("mp_rewrite: %s: %s; measured %s", name, spread, "here, for every replica" if share is None else
                "by this worker, the leader, for every worker")
    if share is not None:
        share.publish_plan("measuring" if found is None else "decided", found)
        measure = job_decision.LeaderMeasure(measure, share)
    return _planned(measure, found, options, traced, body, changes)


def _measure(atomic, traced, body, graph_def, unfused, options, signatures):
    """(StepMeasure, its cached Profile or None, "") of the annotated body `graph_def` (raced against `unfused`, the
    traced body annotated, when the graph rules changed the body); (None, None, why) when it cannot be measured as
    it runs."""
    import tensorflow as tf
    from ..analysis.graph_profile import body_profileable
    from ..analysis.step_profile import StepMeasure
    args, readers = _body_args(atomic, graph_def) if atomic is not None else ([None], [None])
    why = body_profileable(graph_def, args)
    if why:
        return None, None, why
    try:
        with paused(), tf.init_scope():
            measure = StepMeasure(dataclasses.replace(body, graph_def=graph_def), args, readers, options, signatures,
                                  options.costs.table, atomic.definition,
                                  traced=None if unfused is None else dataclasses.replace(traced, graph_def=unfused))
            return measure, measure.cached(), ""
    except Exception as error:  # noqa: BLE001 -- the hook must never break training
        return None, None, f"measuring it failed ({type(error).__name__}: {str(error)[:200]})"


def _planned(measure, found, options, traced, body, changes) -> Plan:
    """The lists as traced now and `measure` later, or what the cached Profile `found` chose."""
    if found is None:
        return Plan(_lists(options), traced, later=measure, fused_body=body)
    return chosen(options, found.table, traced, body, changes)


def _follow(share, options, traced, body, changes, name) -> Plan:
    """A worker other than the leader: what the leader's plan for the same step says (job_decision)."""
    from . import job_decision
    said = share.wait_plan()
    logger.info("mp_rewrite: %s: the leader's plan: %s", name, said["plan"])
    if said["plan"] == "decided":
        return chosen(options, job_decision.profile_of(said).table, traced, body, changes)
    if said["plan"] == "measuring":
        return Plan(_lists(options), traced, later=job_decision.FollowerMeasure(share, traced if changes else None),
                    fused_body=body)
    return Plan(_lists(options), traced)


def chosen(options, table, traced, fused_body, changes) -> Plan:
    """The Plan a measured table chose (StepMeasure's `keep`): float32 or Grappler's lists as traced when one of them
    ran fastest in the race (a step the graph rules left as traced gets the lists through the table, with its
    reasons), else the cut of the changed step."""
    if table.keep == "float32":
        return Plan(None, traced)
    if table.keep == "lists" and changes:
        return Plan(_lists(options), traced)
    return Plan(measured(options, table), fused_body, changes)


class _Measured:
    """A body's measured CostTable as rewrite options carry it: core.body looks a table given this way up under the
    main graph's label, as profile_body made it (a CostTable given as such is looked up under the body's name)."""

    def __init__(self, table):
        self.table, self.precision = table, table.precision

    def for_graph(self, graph_def, precision=None, fetches=(), batch=None):
        return self.table


def measured(options, table):
    """`options` rewriting a body by its measured `table` (a profile_body or StepMeasure CostTable)."""
    return dataclasses.replace(options, assign="cost", costs=_Measured(table))


def _lists(options):
    return dataclasses.replace(options, assign="lists", costs=None)


def distributed(graph_def) -> str:
    """"" for a body one process runs alone; else what makes it part of a distributed step (one phrase)."""
    collective = sorted({node.op for node in graph_def.node if node.op.startswith(("Collective", "Nccl"))})
    if collective:
        return f"the step has {', '.join(collective)} ops (tf.distribute)"
    devices = {node.device for node in graph_def.node if node.device}
    return f"the step is placed on {len(devices)} devices (tf.distribute)" if len(devices) > 1 else ""


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


def _func_graph_shapes(atomic, traced=None, graph_def=None) -> dict:
    """{node name: [TensorShape]} of the traced FuncGraph's ops; given the body's GraphDef as traced and `graph_def`,
    a rewrite of it, those of `graph_def`'s nodes (training.step_rules.rewritten_shapes: a rule may give a node of
    another shape an old name, and TF refuses a GraphDef whose _output_shapes disagree)."""
    graph = getattr(atomic, "graph", None)
    if graph is None:
        return {}
    try:
        shapes = {op.name: [t.shape for t in op.outputs] for op in graph.get_operations()}
    except Exception:  # noqa: BLE001 -- shapes are a hint; the cost model falls back to what it can infer
        return {}
    if traced is None or graph_def is None or graph_def is traced:
        return shapes
    from .step_rules import rewritten_shapes
    return rewritten_shapes(atomic, traced, graph_def, shapes)


def _body_args(atomic, graph_def) -> tuple:
    """([BodyArg], [reader]): one analysis.graph_runs.BodyArg per _Arg of the body, from its FuncGraph's inputs (in
    argument order) -- a number tensor fed made-up values, or a captured variable or value -- and beside it a
    callable that reads the captured value (None for made-up values; read only once the body is found profileable).
    The BodyArg is None for anything else (an iterator, a table, a string). A resource argument no node reads (the
    all-reduces' ordering token, a variable of tf.distribute's own, once job_decision.standalone made the all-reduces
    Identities) is a float32 scalar variable of the run's own."""
    import tensorflow as tf
    from ..analysis.graph_runs import BodyArg
    graph = getattr(atomic, "graph", None)
    arg_nodes = sorted((n for n in graph_def.node if n.op == "_Arg"), key=lambda n: n.attr["index"].i)
    if graph is None or len(graph.inputs) != len(arg_nodes):
        return [None], [None]
    captured = {internal.ref(): external for external, internal in graph.captures}
    variables = {v.handle.ref(): v for v in graph.variables if hasattr(v, "handle")}
    read = {i.split(":")[0].lstrip("^") for n in graph_def.node for i in n.input}
    args, readers = [], []
    for tensor, node in zip(graph.inputs, arg_nodes):
        external = captured.get(tensor.ref())
        if tensor.dtype == tf.resource and node.name not in read:
            args.append(BodyArg(tf.float32.as_datatype_enum, (), True))
            readers.append(None)
        elif tensor.dtype == tf.resource:
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
