"""Random graphs of real TF ops for the property tests.

A graph is drawn as a `GraphSpec`: plain, printable data (so Hypothesis shrinks it and prints a falsifying
example that `build_graph` turns back into the same GraphDef). The graph grows a pool of tensors; every step picks
an op of the catalog and draws its inputs from earlier pool tensors of a fitting shape:

- "M" tensors are [8, 8] float32 (almost everything), "C" are [8, 1] (reductions with keep_dims; they broadcast
  in elementwise ops and are MatMul right-hand sides), "V" are [8] (the SoftmaxCrossEntropyWithLogits loss;
  fetch only).
- ops from every list: allow (MatMul, BatchMatMulV2, Conv2D, Einsum), infer (AddV2, AddN, BiasAdd, Tanh,
  Sigmoid, Softmax, Log, Mul, RealDiv, AvgPool, FusedBatchNormV3), deny (Exp, Sum, Mean,
  SoftmaxCrossEntropyWithLogits; Sum/Mean are infer for bfloat16), clear (Relu, Identity, Transpose, Reshape,
  ConcatV2, Slice, Maximum, MaxPool, Greater, Select, SelectV2, IdentityN, Shape, Size) and no list (Sin, Atan,
  Cast, Square for float16; FusedBatchNorm, which the pass upgrades to the infer op FusedBatchNormV2), int tensors
  (Shape, Size, Cast to int32 and back, int AddV2), control edges, explicit CPU placement, while loops (v1
  Enter/Merge/Switch/NextIteration/Exit, or v2 functional While with its body in the library) and conditionals
  (v1 Switch/Merge, or v2 functional If).

Values stay moderate by construction (inputs of scale ~1/sqrt(8) are a fixed point of an [8, 8] MatMul); Log
only reads tensors that are positive by construction. Ops whose output is a discontinuous function of a float
input (Greater -> Select, a float -> int Cast) "taint" what they feed: low precision may legitimately flip them,
so values downstream are not compared.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st
from tensorflow.python.ops import control_flow_util

M, C, V = "M", "C", "V"
SHAPES = {M: (8, 8), C: (8, 1), V: (8,)}


@dataclasses.dataclass(frozen=True)
class Step:
    """One op (or a small block of ops) appended to the graph.

    Attributes:
        op: a key of CATALOG.
        inputs: pool indices of its inputs (see the catalog entry's slots).
        params: small op-specific values (transpose flags, modes, loop settings).
        control: pool indices whose producing ops become control inputs.
        cpu: place the step's nodes on "/device:CPU:0" explicitly.
    """

    op: str
    inputs: tuple = ()
    params: tuple = ()
    control: tuple = ()
    cpu: bool = False


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """A whole random graph: steps, the pool indices to fetch, the seed of feed and Const values."""

    steps: tuple
    fetches: tuple
    seed: int = 0
    fetch_by_node_name: bool = False


@dataclasses.dataclass(frozen=True)
class Entry:
    """What the generator knows about one pool tensor."""

    kind: str
    positive: bool = False
    tainted: bool = False
    ancestors: frozenset = frozenset()


# The initial pool: two fed Placeholders and two Consts.
INITIAL = (Entry(M), Entry(M, positive=True), Entry(M), Entry(C, positive=True))


@dataclasses.dataclass(frozen=True)
class BuiltGraph:
    """A built GraphSpec.

    Attributes:
        graph_def: the float32 graph.
        tensors: the tensor name of every pool entry (pool index -> "node:port").
        entries: the Entry of every pool entry.
        feeds: Placeholder tensor name -> value.
        fetches: what to pass to rewrite_graph_def (node or tensor names).
        fetch_tensors: the tensor name of each fetch (what to run).
        fetch_indices: the pool index of each fetch.
        log_inputs: pool indices read by a Log (must stay clearly positive for a value comparison).
        has_v2_while: the graph holds a functional While.
    """

    graph_def: tf.compat.v1.GraphDef
    tensors: tuple
    entries: tuple
    feeds: dict
    fetches: tuple
    fetch_tensors: tuple
    fetch_indices: tuple
    log_inputs: tuple
    has_v2_while: bool


# --- the op catalog -------------------------------------------------------------------------------------------
# Slot kinds: "M" an [8, 8] tensor, "A" M or C, "P" a positive M or C, "S" the same kind as slot 0.


def _kind_of(entries):
    return M if any(e.kind == M for e in entries) else C


@dataclasses.dataclass(frozen=True)
class OpKind:
    """How to draw and build one catalog entry.

    slots(params) -> slot kinds; params: a strategy of the params tuple; outputs(entries, params) -> list of
    (kind, positive, tainted) for each output; build(tensors, params, name, rng) -> list of output tensors.
    """

    params: object
    slots: object
    outputs: object
    build: object


def _unary(fn, positive=lambda e: False, slot="A"):
    return OpKind(st.just(()), lambda p: (slot,), lambda es, p: [(es[0].kind, positive(es[0]), False)],
                  lambda ts, p, name, rng: [fn(ts[0], name)])


def _binary(fn, positive):
    return OpKind(st.just(()), lambda p: ("A", "A"),
                  lambda es, p: [(_kind_of(es), positive(es[0], es[1]), False)],
                  lambda ts, p, name, rng: [fn(ts[0], ts[1], name)])


def _matmul(fn):
    def slots(p):
        return ("M", "M") if p[1] else ("M", "A")

    def build(ts, p, name, rng):
        return [fn(ts[0], ts[1], p[0], p[1], name)]
    return OpKind(st.tuples(st.booleans(), st.booleans()), slots,
                  lambda es, p: [(es[1].kind, es[0].positive and es[1].positive, False)], build)


def _conv2d(ts, p, name, rng):
    x4 = tf.raw_ops.Reshape(tensor=ts[0], shape=tf.constant([1, 8, 8, 1], name=f"{name}_4d"), name=f"{name}_in")
    size = p[0]
    filt = tf.constant(rng.normal(0, 1.0 / size, (size, size, 1, 1)).astype(np.float32), name=f"{name}_filter")
    y = tf.raw_ops.Conv2D(input=x4, filter=filt, strides=[1, 1, 1, 1], padding="SAME", name=name)
    return [tf.raw_ops.Reshape(tensor=y, shape=tf.constant([8, 8], name=f"{name}_2d"), name=f"{name}_out")]


def _bias_add(ts, p, name, rng):
    if p[0] == 0:
        bias = tf.constant(rng.normal(0, 0.3, (8,)).astype(np.float32), name=f"{name}_bias")
    elif ts[1].shape == SHAPES[C]:
        bias = tf.raw_ops.Reshape(tensor=ts[1], shape=tf.constant([8], name=f"{name}_8"), name=f"{name}_bias")
    else:
        op = tf.raw_ops.Mean if p[0] == 1 else tf.raw_ops.Sum
        bias = op(input=ts[1], axis=tf.constant(0, name=f"{name}_axis"), keep_dims=False, name=f"{name}_bias")
    return [tf.raw_ops.BiasAdd(value=ts[0], bias=bias, name=name)]


def _reduce(op):
    return OpKind(st.just(()), lambda p: ("A",), lambda es, p: [(C, es[0].positive, False)],
                  lambda ts, p, name, rng: [op(input=ts[0], axis=tf.constant([1], name=f"{name}_axis"),
                                               keep_dims=True, name=name)])


def _reshape(ts, p, name, rng):
    if p[0]:
        shape = tf.raw_ops.Shape(input=ts[1], out_type=tf.int32, name=f"{name}_shape")
    else:
        shape = tf.constant([-1, ts[0].shape[1]], name=f"{name}_shape")
    return [tf.raw_ops.Reshape(tensor=ts[0], shape=shape, name=name)]


def _concat(ts, p, name, rng):
    n, axis, pick = p
    pick = pick % n
    joined = tf.raw_ops.ConcatV2(values=list(ts[:n]), axis=tf.constant(axis, name=f"{name}_axis"), name=name)
    begin = [8 * pick, 0] if axis == 0 else [0, 8 * pick]
    return [tf.raw_ops.Slice(input=joined, begin=tf.constant(begin, name=f"{name}_begin"),
                             size=tf.constant([8, 8], name=f"{name}_size"), name=f"{name}_slice")]


def _select(ts, p, name, rng):
    cond = tf.raw_ops.Greater(x=ts[0], y=ts[1], name=f"{name}_cond")
    if p[0]:
        return [tf.raw_ops.SelectV2(condition=cond, t=ts[2], e=ts[3], name=name)]
    return [tf.raw_ops.Select(condition=cond, x=ts[2], y=ts[3], name=name)]


def _sce(ts, p, name, rng):
    loss, backprop = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=ts[0], labels=ts[1], name=name)
    return [loss, backprop]


def _size_scale(ts, p, name, rng):
    size = tf.raw_ops.Size(input=ts[0], out_type=tf.int32, name=f"{name}_size")
    as_float = tf.raw_ops.Cast(x=size, DstT=tf.float32, name=f"{name}_tofloat")
    return [tf.raw_ops.RealDiv(x=ts[0], y=as_float, name=name)]


def _int_roundtrip(ts, p, name, rng):
    as_int = tf.raw_ops.Cast(x=ts[0], DstT=tf.int32, name=f"{name}_toint")
    doubled = tf.raw_ops.AddV2(x=as_int, y=as_int, name=f"{name}_intadd")
    return [tf.raw_ops.Cast(x=doubled, DstT=tf.float32, name=name)]


# Ops a while-loop body applies to the loop value v (c is a loop-invariant tensor captured from outside).
BODY_OPS = {
    "matmul": lambda v, c: tf.raw_ops.MatMul(a=v, b=c),
    "tanh": lambda v, c: tf.raw_ops.Tanh(x=v),
    "add": lambda v, c: tf.raw_ops.AddV2(x=v, y=c),
    "relu": lambda v, c: tf.raw_ops.Relu(features=v),
    "sigmoid": lambda v, c: tf.raw_ops.Sigmoid(x=v),
    "exp": lambda v, c: tf.raw_ops.Exp(x=tf.raw_ops.Tanh(x=v)),
    "identity": lambda v, c: tf.raw_ops.Identity(input=v),
}


@contextlib.contextmanager
def control_flow_v2(enabled: bool):
    """Build tf.while_loop as v2 (functional While) or v1 (Enter/Merge/Switch/...), restoring the global flag."""
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = enabled
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


def _while(ts, p, name, rng):
    v2, iterations, body_ops = p
    x, captured = ts

    def body(i, v):
        for code in body_ops:
            v = BODY_OPS[code](v, captured)
        return i + 1, v
    with control_flow_v2(v2):
        _, out = tf.while_loop(lambda i, v: i < iterations, body, [tf.constant(0, name=f"{name}_i0"), x], name=name)
    return [out]


def _cond(ts, p, name, rng):
    v2, then_code, else_code = p
    a, c = ts
    flag = tf.compat.v1.get_default_graph().get_tensor_by_name("flag:0")
    with control_flow_v2(v2):
        return [tf.cond(flag, lambda: BODY_OPS[then_code](a, c), lambda: BODY_OPS[else_code](a, c), name=name)]


def _to_4d(x, name):
    return tf.raw_ops.Reshape(tensor=x, shape=tf.constant([1, 8, 8, 1], name=f"{name}_4d"), name=f"{name}_in")


def _to_2d(y, name):
    return tf.raw_ops.Reshape(tensor=y, shape=tf.constant([8, 8], name=f"{name}_2d"), name=f"{name}_out")


def _batch_norm(ts, p, name, rng):
    version, training = p
    const = lambda values, what: tf.constant(np.array(values, np.float32), name=f"{name}_{what}")  # noqa: E731
    stats = ([], []) if training else ([0.1], [1.5])
    op = tf.raw_ops.FusedBatchNorm if version == 1 else tf.raw_ops.FusedBatchNormV3
    y = op(x=_to_4d(ts[0], name), scale=const([1.2], "scale"), offset=const([0.1], "offset"),
           mean=const(stats[0], "mean"), variance=const(stats[1], "variance"), is_training=training, name=name)[0]
    return [_to_2d(y, name)]


def _pool(ts, p, name, rng):
    op, size = p
    x, window = _to_4d(ts[0], name), dict(ksize=[1, size, size, 1], strides=[1, 1, 1, 1], padding="SAME", name=name)
    y = tf.raw_ops.AvgPool(value=x, **window) if op == "AvgPool" else tf.raw_ops.MaxPool(input=x, **window)
    return [_to_2d(y, name)]


# Not "add": in a v1 cond branch, AddV2(a, a) (a Cond whose two inputs are one tensor) makes TF 2.21's Grappler
# build a graph that fails with "Retval[0] does not have value" -- a TF bug, float32 graph alone, no rewrite.
COND_OPS = tuple(sorted(set(BODY_OPS) - {"add"}))
EINSUM_EQUATIONS = ("ij,jk->ik", "ij,kj->ik", "ij,ij->ij")

CATALOG = {
    "Identity": _unary(lambda x, n: tf.raw_ops.Identity(input=x, name=n), lambda e: e.positive),
    "Relu": _unary(lambda x, n: tf.raw_ops.Relu(features=x, name=n)),
    "Tanh": _unary(lambda x, n: tf.raw_ops.Tanh(x=x, name=n)),
    "Sigmoid": _unary(lambda x, n: tf.raw_ops.Sigmoid(x=x, name=n), lambda e: True),
    "Softmax": _unary(lambda x, n: tf.raw_ops.Softmax(logits=x, name=n), lambda e: True),
    "Exp": _unary(lambda x, n: tf.raw_ops.Exp(x=x, name=n), lambda e: True),
    "Log": _unary(lambda x, n: tf.raw_ops.Log(x=x, name=n), slot="P"),
    "Sin": _unary(lambda x, n: tf.raw_ops.Sin(x=x, name=n)),
    "Atan": _unary(lambda x, n: tf.raw_ops.Atan(x=x, name=n)),
    "Transpose": _unary(lambda x, n: tf.raw_ops.Transpose(x=x, perm=tf.constant([1, 0], name=f"{n}_perm"), name=n),
                        lambda e: e.positive, slot="M"),
    "AddV2": _binary(lambda x, y, n: tf.raw_ops.AddV2(x=x, y=y, name=n), lambda a, b: a.positive and b.positive),
    "Mul": _binary(lambda x, y, n: tf.raw_ops.Mul(x=x, y=y, name=n), lambda a, b: a.positive and b.positive),
    "Maximum": _binary(lambda x, y, n: tf.raw_ops.Maximum(x=x, y=y, name=n), lambda a, b: a.positive or b.positive),
    "MatMul": _matmul(lambda a, b, ta, tb, n: tf.raw_ops.MatMul(a=a, b=b, transpose_a=ta, transpose_b=tb, name=n)),
    "BatchMatMulV2": _matmul(lambda a, b, ta, tb, n: tf.raw_ops.BatchMatMulV2(x=a, y=b, adj_x=ta, adj_y=tb,
                                                                               name=n)),
    "Conv2D": OpKind(st.tuples(st.sampled_from([1, 3])), lambda p: ("M",), lambda es, p: [(M, False, False)],
                     _conv2d),
    "BiasAdd": OpKind(st.tuples(st.integers(0, 2)), lambda p: ("M", "A"), lambda es, p: [(M, False, False)],
                      _bias_add),
    "Sum": _reduce(tf.raw_ops.Sum),
    "Mean": _reduce(tf.raw_ops.Mean),
    "Reshape": OpKind(st.tuples(st.booleans()), lambda p: ("A", "S"),
                      lambda es, p: [(es[0].kind, es[0].positive, False)], _reshape),
    "ConcatV2": OpKind(st.tuples(st.integers(2, 3), st.integers(0, 1), st.integers(0, 2)),
                       lambda p: ("M",) * p[0], lambda es, p: [(M, es[p[2] % p[0]].positive, False)], _concat),
    "Select": OpKind(st.tuples(st.booleans()), lambda p: ("M", "M", "M", "M"),
                     lambda es, p: [(M, es[2].positive and es[3].positive, True)], _select),
    "IdentityN": OpKind(st.tuples(st.integers(1, 3)), lambda p: ("A",) * p[0],
                        lambda es, p: [(e.kind, e.positive, False) for e in es],
                        lambda ts, p, name, rng: list(tf.raw_ops.IdentityN(input=list(ts), name=name))),
    "SoftmaxCrossEntropyWithLogits": OpKind(st.just(()), lambda p: ("M", "M"),
                                            lambda es, p: [(V, False, False), (M, False, False)], _sce),
    "SizeScale": OpKind(st.just(()), lambda p: ("A",), lambda es, p: [(es[0].kind, es[0].positive, False)],
                        _size_scale),
    "IntRoundTrip": OpKind(st.just(()), lambda p: ("A",), lambda es, p: [(es[0].kind, False, True)],
                           _int_roundtrip),
    "Square": _unary(lambda x, n: tf.raw_ops.Square(x=x, name=n)),
    "AddN": OpKind(st.tuples(st.integers(2, 3)), lambda p: ("A", "S", "S")[:p[0]],
                   lambda es, p: [(es[0].kind, all(e.positive for e in es), False)],
                   lambda ts, p, name, rng: [tf.raw_ops.AddN(inputs=list(ts), name=name)]),
    "Einsum": OpKind(st.tuples(st.sampled_from(EINSUM_EQUATIONS)), lambda p: ("M", "M"),
                     lambda es, p: [(M, es[0].positive and es[1].positive, False)],
                     lambda ts, p, name, rng: [tf.raw_ops.Einsum(inputs=list(ts), equation=p[0], name=name)]),
    "FusedBatchNorm": OpKind(st.tuples(st.sampled_from([1, 3]), st.booleans()), lambda p: ("M",),
                             lambda es, p: [(M, False, False)], _batch_norm),
    "Pool": OpKind(st.tuples(st.sampled_from(["AvgPool", "MaxPool"]), st.integers(1, 3)), lambda p: ("M",),
                   lambda es, p: [(M, es[0].positive, False)], _pool),
    "Cond": OpKind(st.tuples(st.booleans(), st.sampled_from(COND_OPS), st.sampled_from(COND_OPS)),
                   lambda p: ("M", "M"), lambda es, p: [(M, False, False)], _cond),
    "While": OpKind(st.tuples(st.booleans(), st.integers(1, 3),
                              st.lists(st.sampled_from(sorted(BODY_OPS)), min_size=1, max_size=3).map(tuple)),
                    lambda p: ("M", "M"), lambda es, p: [(M, False, False)], _while),
}
OPS = tuple(CATALOG)
# Allow-list ops are what starts a conversion; without them the pass has nothing to do, so they are drawn more.
ALLOW_OPS = ("MatMul", "BatchMatMulV2", "Conv2D", "Einsum")
WEIGHTED_OPS = OPS + ALLOW_OPS * 3


def _fits(slot: str, entry: Entry, first: Entry | None) -> bool:
    if entry.kind == V:
        return False
    if slot == "M":
        return entry.kind == M
    if slot == "P":
        return entry.positive
    if slot == "S":
        return entry.kind == first.kind
    return True


def add_step(pool: list, step: Step) -> None:
    """Append the Entries of a step's outputs to `pool` (the generator's bookkeeping, no TF)."""
    kind = CATALOG[step.op]
    inputs = [pool[i] for i in step.inputs]
    ancestors = frozenset(step.inputs).union(*(e.ancestors for e in inputs))
    tainted = any(e.tainted for e in inputs)
    for out_kind, positive, taints in kind.outputs(inputs, step.params):
        pool.append(Entry(out_kind, positive, tainted or taints, ancestors))


@st.composite
def steps_strategy(draw, ops=WEIGHTED_OPS, max_steps=10, must_include=None):
    """Draw a list of Steps (one of them `must_include`, if given) and return (steps, pool)."""
    pool = list(INITIAL)
    steps = []
    n = draw(st.integers(1, max_steps))
    forced_at = draw(st.integers(0, n - 1)) if must_include else -1
    for k in range(n):
        op = must_include if k == forced_at else draw(st.sampled_from(ops))
        kind = CATALOG[op]
        params = draw(kind.params)
        inputs = []
        for slot in kind.slots(params):
            first = pool[inputs[0]] if inputs else None
            fitting = [i for i, e in enumerate(pool) if _fits(slot, e, first)]
            # Index 0 is the most recent fitting tensor, so shrinking pulls towards chains.
            inputs.append(fitting[-1 - draw(st.integers(0, len(fitting) - 1))])
        control = ()
        if op not in ("While", "Cond") and draw(st.integers(0, 5)) == 0:
            control = (draw(st.integers(0, len(pool) - 1)),)
        cpu = draw(st.integers(0, 4)) == 0
        step = Step(op, tuple(inputs), params, control, cpu)
        add_step(pool, step)
        steps.append(step)
    return steps, pool


@st.composite
def graph_specs(draw, ops=WEIGHTED_OPS, max_steps=10, must_include=None):
    """Draw a GraphSpec: random steps over `ops` (one of them `must_include`, if given) and a random non-empty
    subset of pool tensors to fetch (always the last one, so the graph is not all dead code)."""
    steps, pool = draw(steps_strategy(ops, max_steps, must_include))
    last = len(pool) - 1
    others = draw(st.lists(st.integers(0, last - 1), max_size=3, unique=True)) if last else []
    fetches = tuple(sorted({last, *others}))
    return GraphSpec(tuple(steps), fetches, draw(st.integers(0, 2**16)), draw(st.booleans()))


def entries_of(spec: GraphSpec) -> list:
    """The pool Entries of a spec (no TF)."""
    pool = list(INITIAL)
    for step in spec.steps:
        add_step(pool, step)
    return pool


def feeds_for(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x:0": rng.normal(0, 0.35, (8, 8)).astype(np.float32),
            "xpos:0": rng.uniform(0.5, 1.5, (8, 8)).astype(np.float32),
            "flag:0": np.array(seed % 2 == 0)}


def build_graph(spec: GraphSpec) -> BuiltGraph:
    """Build a GraphSpec in a fresh tf.Graph (TF's global control-flow setting is left as it was)."""
    rng = np.random.default_rng(spec.seed + 1)
    graph = tf.Graph()
    with graph.as_default():
        pool = [tf.compat.v1.placeholder(tf.float32, SHAPES[M], name="x"),
                tf.compat.v1.placeholder(tf.float32, SHAPES[M], name="xpos"),
                tf.constant(rng.normal(0, 0.35, SHAPES[M]).astype(np.float32), name="w"),
                tf.constant(rng.uniform(0.5, 1.0, SHAPES[C]).astype(np.float32), name="col")]
        tf.compat.v1.placeholder(tf.bool, [], name="flag")
        log_inputs = []
        for k, step in enumerate(spec.steps):
            control = [pool[i].op for i in step.control]
            with tf.device("/device:CPU:0" if step.cpu else None), tf.control_dependencies(control):
                outs = CATALOG[step.op].build([pool[i] for i in step.inputs], step.params, f"s{k}", rng)
            if step.op == "Log":
                log_inputs.append(step.inputs[0])
            pool.extend(outs)
    entries = entries_of(spec)
    assert [tuple(t.shape) for t in pool] == [SHAPES[e.kind] for e in entries], "generator shape bookkeeping"
    tensors = tuple(t.name for t in pool)
    fetch_tensors = tuple(tensors[i] for i in spec.fetches)
    fetches = tuple(t[:-2] if spec.fetch_by_node_name and t.endswith(":0") else t for t in fetch_tensors)
    graph_def = graph.as_graph_def()
    has_v2_while = any(n.op in ("While", "StatelessWhile") for n in graph_def.node)
    return BuiltGraph(graph_def, tensors, tuple(entries), feeds_for(spec.seed), fetches, fetch_tensors,
                      spec.fetches, tuple(log_inputs), has_v2_while)
