"""Running variants of one model side by side, timed (a front end: this module runs TensorFlow).

Each variant -- a GraphDef, or a SavedModel directory -- runs in its own TF1 session configured as TF serves a
model (remapper and oneDNN fusions on, auto mixed precision off: the graph says its own dtypes), on the same
made-up inputs, in alternation, so that whatever else runs on the machine disturbs them alike. `traced_times`
reads each node's time from TF's step stats (analysis.graph_profile builds costs from them); `race` times whole
runs, of sessions, of a tf.function body's variants in the eager function runtime (FunctionRunner), or of
SavedModels as TF2 serves them (analysis.served_trace.SignatureRunner).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import time

import numpy as np

from ..errors import tf_reason
from .machine_load import Span
from .race_times import MORE_ROUNDS, RaceTimes
from .run_times import op_interval

WARMUP = 2  # untimed runs of each variant first (graph optimization, oneDNN primitive caches)
# What the runners given to traced_times and race are, by position: every caller (analysis.graph_profile) passes
# float32 first, then Grappler's lists, then the cut.
VARIANTS = ("float32", "Grappler's lists", "the cut")
LOG = logging.getLogger("mp_rewrite")


class VariantError(Exception):
    """A variant raised while it was timed (a kernel this CPU cannot run in the precision: "could not create a
    primitive descriptor"). Not an MpRewriteError: whoever times variants decides what runs instead.

    Attributes:
        index: the runner's position (VARIANTS names it).
        reason: TensorFlow's first words (tf_reason).
    """

    def __init__(self, index: int, reason: str):
        self.index, self.reason = index, reason
        super().__init__(f"{variant_name(index)} failed to run: {reason}")


def variant_name(index: int) -> str:
    """"float32", "Grappler's lists", "the cut" for a runner's position."""
    return VARIANTS[index] if index < len(VARIANTS) else f"variant {index + 1}"


def made_up_values(specs, batch: int | None) -> list:
    """Random values for [(dtype enum, shape with None or -1 for unknown dimensions)]: floats in [0, 1), zeros for
    integers (a valid id for any embedding or table); an unknown dimension is `batch` (default 1)."""
    import tensorflow as tf
    rng = np.random.default_rng(0)
    values = []
    for dtype, shape in specs:
        dtype = tf.as_dtype(dtype)
        shape = [(1 if batch is None else batch) if d is None or d < 0 else d for d in shape]
        values.append(rng.uniform(0, 1, shape).astype(dtype.as_numpy_dtype) if dtype.is_floating
                      else np.zeros(shape, dtype.as_numpy_dtype))
    return values


def onednn_cap() -> str:
    """", oneDNN held to AVX2 by ONEDNN_MAX_CPU_ISA" where that variable (or its old name) caps the instructions
    oneDNN may use (bfloat16 kernels then may not exist: "could not create a primitive descriptor"); else ""."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        if os.environ.get(name):
            return f", oneDNN held to {os.environ[name]} by {name}"
    return ""


@dataclasses.dataclass(frozen=True)
class BodyArg:
    """One argument of a function body run in a session (Runner.of_body).

    Attributes:
        dtype: its dtype enum (a variable's value dtype for a resource argument).
        shape: its shape (a variable's shape for a resource argument); None or -1 for an unknown dimension.
        variable: a resource argument: a variable of its own is created in the session, set to `value` once.
        value: a numpy array, or None for made-up values (analysis.graph_runs.made_up_values).
    """

    dtype: int
    shape: tuple
    variable: bool = False
    value: object = None


class Runner:
    """One variant in its own session (feeds and fetches named as tensors, "x:0", or as nodes, "x"; targets are
    nodes run each time without fetching anything, such as a training step's variable updates)."""

    def __init__(self, session, feeds, fetches, targets=()):
        from .execution import tensor_name
        graph = session.graph
        self.session = session
        self.feed(feeds)
        self.fetches = [graph.get_tensor_by_name(tensor_name(f)) for f in fetches]
        self.fetches += [graph.get_operation_by_name(t) for t in targets]

    def feed(self, feeds) -> None:
        """Run on these inputs from now on ({name: value}, as given to the constructor)."""
        from .execution import tensor_name
        self.feed_dict = {self.session.graph.get_tensor_by_name(tensor_name(k)): v for k, v in feeds.items()}

    @classmethod
    def of_graph(cls, graph_def, feeds, fetches, targets=(), init=None) -> "Runner":
        """A graph's variant; `init` (nodes, {tensor: value}) is run once first (variables set to their values)."""
        import tensorflow as tf
        from .execution import session_config
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        session = tf.compat.v1.Session(graph=graph, config=session_config(fuse=True))
        if init is not None and init[0]:
            session.run([graph.get_operation_by_name(n) for n in init[0]],
                        {graph.get_tensor_by_name(k): v for k, v in init[1].items()})
        return cls(session, feeds, fetches, targets)

    @classmethod
    def of_body(cls, body_graph_def, args, fetches, targets=(), batch: int | None = None) -> "Runner":
        """A function body's variant (core.functions.function_to_graph's GraphDef: _Arg and _Retval nodes), run as
        a graph: each `args[i]` (BodyArg) feeds its _Arg, a resource argument is a variable of the session's own
        (its values copied in once, so running the body -- a training step -- never touches the caller's), and a
        _Retval becomes an Identity of the same name."""
        graph_def, init = runnable_body(body_graph_def, args)
        names = {node.attr["index"].i: node.name for node in body_graph_def.node if node.op == "_Arg"}
        feeds = {names[i]: value for i, value in _fed_values(args, batch).items()}
        return cls.of_graph(graph_def, feeds, fetches, targets, init)

    @classmethod
    def of_saved_model(cls, export_dir: str, tags, feeds, fetches) -> "Runner":
        import tensorflow as tf
        from tensorflow.python.util import deprecation
        from .execution import session_config
        session = tf.compat.v1.Session(graph=tf.Graph(), config=session_config(fuse=True))
        with session.graph.as_default(), deprecation.silence():  # the TF1 loader says to use tf.saved_model.load
            tf.compat.v1.saved_model.loader.load(session, tags, export_dir)
        return cls(session, feeds, fetches)

    def run(self, metadata=None) -> float:
        """One run (traced into `metadata`'s step stats when given); returns its wall ms."""
        from tensorflow.core.protobuf import config_pb2
        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE) if metadata else None
        begin = time.perf_counter()
        self.session.run(self.fetches, self.feed_dict, options=options, run_metadata=metadata)
        return (time.perf_counter() - begin) * 1e3

    def kernels(self) -> dict:
        """{executed node name: kernel label} of one run, from the partition graphs TF reports: the op it ran, and
        the ops fused into it ("_MklNativeFusedConv2D: BiasAdd+Relu6"; run_times.kernel_label)."""
        from tensorflow.core.protobuf import config_pb2
        from .run_times import kernel_label
        metadata = config_pb2.RunMetadata()
        self.session.run(self.fetches, self.feed_dict, options=config_pb2.RunOptions(output_partition_graphs=True),
                         run_metadata=metadata)
        return {node.name: kernel_label(node) for graph in metadata.partition_graphs for node in graph.node}

    def close(self) -> None:
        self.session.close()


class FunctionRunner:
    """A function body's variant run as TF runs a traced tf.function: its FunctionDef registered in the eager
    context under a name of its own and called as an op, with made-up inputs (`args`, as for Runner.of_body) and,
    for each resource argument, a variable of its own set to the argument's value (running it -- a training step --
    never touches the caller's variables). No step stats: it is for `race`, where a step should be timed in the
    runtime it will run in (a session and the function runtime can rank a small step's variants differently)."""

    _names = itertools.count()

    def __init__(self, fdef, args, batch: int | None = None):
        import tensorflow as tf
        from tensorflow.python.eager import context
        self._ctx = context.context()
        own = type(fdef)()
        own.CopyFrom(fdef)
        own.signature.name = self.name = f"{fdef.signature.name}_mp_rewrite_race_{next(self._names)}"
        fed = _fed_values(args, batch)
        self._variables = {i: tf.Variable(_variable_value(arg)) for i, arg in enumerate(args) if arg.variable}
        self._inputs = [self._variables[i].handle if i in self._variables else tf.constant(fed[i])
                        for i in range(len(args))]
        self._outputs = len(own.signature.output_arg)
        self._ctx.add_function_def(own)

    def run(self) -> list:
        """One call; returns its outputs (eager Tensors)."""
        from tensorflow.python.eager import execute
        return execute.execute(self.name, self._outputs, self._inputs, (), self._ctx)

    def close(self) -> None:
        self._ctx.remove_function(self.name)
        self._variables.clear()


def _variable_value(arg):
    """The starting value of a resource argument's own variable: the caller's value, else made up."""
    return made_up_values([(arg.dtype, arg.shape)], 1)[0] if arg.value is None else arg.value


def _fed_values(args, batch) -> dict:
    """{index: value} of the BodyArgs that are not variables: their own value, else made up."""
    fed = [(i, arg) for i, arg in enumerate(args) if not arg.variable]
    made_up = made_up_values([(a.dtype, a.shape) for _, a in fed], batch)
    return {i: made if arg.value is None else arg.value for (i, arg), made in zip(fed, made_up)}


def runnable_body(body_graph_def, args):
    """(GraphDef, init) of a function body a session can run: each _Arg a Placeholder, or for a resource argument
    a VarHandleOp of the same name with an AssignVariableOp from a placeholder (`init`: those assignments and
    {placeholder tensor: value}); each _Retval an Identity. Node names are kept, so step stats name the body's
    nodes."""
    from tensorflow.core.framework import graph_pb2
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(body_graph_def.versions)
    graph_def.library.CopyFrom(body_graph_def.library)
    assigns, values = [], {}
    for node in body_graph_def.node:
        if node.op == "_Arg":
            arg = args[node.attr["index"].i]
            shape = [-1 if d is None else d for d in arg.shape]
            if arg.variable:
                _add(graph_def, node.name, "VarHandleOp", [], dtype=arg.dtype, shape=shape, shared_name=node.name)
                value = _add(graph_def, f"{node.name}/mp_rewrite_value", "Placeholder", [], dtype=arg.dtype,
                             shape=shape)
                assigns.append(_add(graph_def, f"{node.name}/mp_rewrite_init", "AssignVariableOp",
                                    [node.name, value.name], dtype=arg.dtype).name)
                values[f"{value.name}:0"] = _variable_value(arg)
            else:
                _add(graph_def, node.name, "Placeholder", [], dtype=arg.dtype, shape=shape)
        elif node.op == "_Retval":
            _add(graph_def, node.name, "Identity", list(node.input), T=node.attr["T"].type)
        else:
            graph_def.node.add().CopyFrom(node)
    return graph_def, (assigns, values)


def _add(graph_def, name, op, inputs, **attrs):
    node = graph_def.node.add(name=name, op=op, input=inputs)
    for key, value in attrs.items():
        if key in ("dtype", "T"):
            node.attr[key].type = value
        elif key == "shape":
            node.attr[key].shape.SetInParent()  # a scalar's shape has no dims, but is set
            for d in value:
                node.attr[key].shape.dim.add(size=d)
        else:
            node.attr[key].s = value.encode()
    return node


@contextlib.contextmanager
def opened(stack: list):
    """Close every Runner (or FunctionRunner) appended to `stack` on the way out."""
    try:
        yield stack
    finally:
        for runner in stack:
            runner.close()


def saved_model_copy(export_dir: str, meta_graph_def, directory: str) -> str:
    """Write into `directory` a SavedModel holding `meta_graph_def` whose variables and assets are links to
    `export_dir`'s (nothing is copied, nothing of `export_dir` is written)."""
    from tensorflow.core.protobuf import saved_model_pb2
    model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    model.meta_graphs.add().CopyFrom(meta_graph_def)
    with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
        f.write(model.SerializeToString())
    for part in ("variables", "assets"):
        if os.path.isdir(os.path.join(export_dir, part)):
            shutil.copytree(os.path.join(export_dir, part), os.path.join(directory, part), copy_function=os.symlink)
    return directory


def traced_times(runners, runs: int, progress=None):
    """Per runner, {node name: [its op's ms in context in each traced run it ran in]} (the median of the run's
    executions, where it ran more than once), and the wall ms of each traced run. Run k of every runner ran back to
    back, so the k-th times of two runners are paired (graph_costs.measured_pair).

    Raises:
        VariantError: a runner raised (the first to do so; its position and TensorFlow's words).
    """
    from tensorflow.core.protobuf import config_pb2
    samples = [{} for _ in runners]
    walls = [[] for _ in runners]
    for i, runner in enumerate(runners):
        for _ in range(WARMUP):
            _run_variant(runner, i)
    for done in range(runs):
        for i, runner in enumerate(runners):
            metadata = config_pb2.RunMetadata()
            begin = time.perf_counter()
            _run_variant(runner, i, metadata)
            walls[i].append((time.perf_counter() - begin) * 1e3)
            this_run = {}
            for device in metadata.step_stats.dev_stats:
                for stat in device.node_stats:
                    begin, end = op_interval(stat)
                    this_run.setdefault(stat.node_name.split(":")[0], []).append((end - begin) / 1e6)
            for name, ms in this_run.items():
                samples[i].setdefault(name, []).append(float(np.median(ms)))
        if progress is not None:
            progress(done + 1, runs)
    return samples, walls


class Calls:
    """A race's runner: `calls` calls of a function on fixed inputs per run, keeping each run's overlap -- this
    process's CPU time over the run's wall time: how many cores the calls got -- and the cores the rest of the
    machine used meanwhile (machine_load.Span; not kept where unknown)."""

    def __init__(self, function, feeds, calls: int):
        self.function, self.feeds, self.calls = function, feeds, calls
        self.overlaps, self.others = [], []

    def run(self) -> None:
        with Span() as span:
            for _ in range(self.calls):
                self.function(*self.feeds)
        self.overlaps.append(span.overlap)
        if span.others is not None:
            self.others.append(span.others)


def race(runners, runs: int, warmup: int = WARMUP, names=VARIANTS, most: int | None = None,
         settled=RaceTimes.settled) -> RaceTimes:
    """Wall ms of each runner's untraced runs, round by round: `runs` alternated rounds after `warmup`, then more,
    one round at a time up to `most` (default race_times.MORE_ROUNDS x runs), until `settled(times)` (default:
    every ratio of two runners known to within race_times.SETTLED; a busy machine makes the race longer, not its
    answer different). A
    runner that raises is out of the race: its time is infinite (so any other wins), and a line on the `mp_rewrite`
    logger says why in TensorFlow's words, naming it by `names`. If every runner fails, VariantError (the first's).

    Returns:
        A RaceTimes (its `medians`: the median ms per run of each runner)."""
    out = {}
    for i, runner in enumerate(runners):
        try:
            for _ in range(warmup):
                _run_variant(runner, i)
        except VariantError as e:
            out[i] = e
            LOG.warning("%s failed to run: %s; it is out of the race, the conversion goes on with what runs",
                        names[i] if i < len(names) else variant_name(i), e.reason)
    if len(out) == len(runners):
        raise out[0]
    walls = [[] for _ in runners]
    most = MORE_ROUNDS * runs if most is None else most
    for done in itertools.count(1):
        for i, runner in enumerate(runners):
            if i in out:
                continue
            begin = time.perf_counter()
            _run_variant(runner, i)
            walls[i].append((time.perf_counter() - begin) * 1e3)
        times = RaceTimes(tuple(tuple(w) for w in walls))
        if done >= most or (done >= runs and settled(times)):
            return times


def _run_variant(runner, index: int, metadata=None) -> None:
    """One run of the runner at `index`; TensorFlow's error becomes a VariantError naming the variant."""
    try:
        runner.run(metadata) if metadata is not None else runner.run()
    except Exception as e:  # noqa: BLE001 -- OpError, and what the function runtime raises (InternalError, ...)
        raise VariantError(index, tf_reason(e)) from None
