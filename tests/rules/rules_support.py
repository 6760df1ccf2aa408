"""Real Keras 3 graphs for the rules' tests: frozen, folded by Grappler as `--freeze` folds them, run in TF, and
optimized by the Grappler TF runs before every call (remapper included) to see what it fuses."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2  # noqa: E402
from tensorflow.python.framework import convert_to_constants  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402

from mp_rewrite.analysis.grappler import FOLDING, optimize_graph  # noqa: E402


def with_nonzero_biases(model, seed: int = 0):
    """Biases and normalization statistics a trained model has: a zero bias is folded away by Grappler, and the
    fusion it would join cannot happen."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        path = weight.path
        if path.endswith("bias") or path.endswith("beta") or path.endswith("moving_mean"):
            weight.assign(rng.normal(0, 0.3, weight.shape).astype(np.float32))
        elif path.endswith("gamma") or path.endswith("moving_variance"):
            weight.assign(rng.uniform(0.5, 2, weight.shape).astype(np.float32))
    return model


def frozen(model, shape, batch=None):
    """(the model's frozen GraphDef folded as `--freeze` folds it, its fetches, its feed): the input's first
    dimension is left unknown unless `batch` is given, as in a serving signature."""
    spec = tf.TensorSpec((batch,) + tuple(shape[1:]), tf.float32, name="x")
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    constant = convert_to_constants.convert_variables_to_constants_v2(function)
    fetches = [t.name for t in constant.outputs]
    feed = constant.inputs[0].name
    return optimize_graph(constant.graph.as_graph_def(), fetches, FOLDING), fetches, feed


def run(graph_def, feed: str, fetch: str, x: np.ndarray) -> np.ndarray:
    """The value of `fetch` when `feed` is `x` (float32, TF's default optimizations on)."""
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    pruned = wrapped.prune(wrapped.graph.get_tensor_by_name(feed), wrapped.graph.get_tensor_by_name(fetch))
    return pruned(tf.constant(x)).numpy()


def runtime_graph(graph_def, fetches):
    """The graph after the Grappler TF runs before executing it on this CPU (every default optimizer, remapper
    included, two iterations); nodes are placed on the CPU first, as the placer does (the remapper fuses only
    placed nodes)."""
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    for node in meta.graph_def.node:
        node.device = "/device:CPU:0"
    meta.collection_def["train_op"].node_list.value.extend(dict.fromkeys(f.split(":")[0] for f in fetches))
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1
    return tf_optimizer.OptimizeGraph(config, meta)


def executed(graph_def, feed: str, fetch: str, x: np.ndarray) -> list:
    """[(op, fused_ops)] of what TF executes when a function of the graph (feed -> fetch) is first called on x, as
    a SavedModel signature is: its own Grappler runs on it first, remapper included, with the shapes a call has
    (where a Session's, `runtime_graph`, does not fuse a residual add)."""
    from mp_rewrite.analysis.execution import executed_nodes
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    function = wrapped.prune(wrapped.graph.get_tensor_by_name(feed), wrapped.graph.get_tensor_by_name(fetch))
    return [(n.op, tuple(s.decode() for s in n.attr["fused_ops"].list.s))
            for n in executed_nodes(function, tf.constant(x))]


def fused(graph_def) -> list:
    """[(fused op, [fused_ops])] of a runtime graph, in graph order."""
    return [(n.op, [s.decode() for s in n.attr["fused_ops"].list.s]) for n in graph_def.node
            if n.op.startswith("_Fused") or n.op.startswith("_Mkl")]


def ops(graph_def) -> list:
    """The op types of the graph's computing nodes (no Const, Identity, NoOp, Placeholder)."""
    return [n.op for n in graph_def.node if n.op not in ("Const", "Identity", "NoOp", "Placeholder")]


def assert_same(before: np.ndarray, after: np.ndarray) -> None:
    """Equal within float32 rounding of a reordered sum (and not trivially: the values are not all ~0)."""
    scale = np.abs(before).max()
    assert scale > 0.1
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5 * scale)


def dense_gelu(approximate: bool = False, units: int = 64):
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 32))
    act = (lambda t: keras.activations.gelu(t, approximate=True)) if approximate else "gelu"
    return with_nonzero_biases(keras.Model(inp, keras.layers.Dense(units, activation=act)(inp)))


def assert_within_roundoff(graph_def, new, feed: str, fetch: str, x: np.ndarray) -> None:
    """For a deep network with random weights, which amplifies float32 round-off (EfficientNetB0's outputs move by
    ~1e-5 of their scale when its input moves by one ulp): the rewrite changes the output by no more than 4 times
    what a one-ulp change of the input does."""
    before, after = run(graph_def, feed, fetch, x), run(new, feed, fetch, x)
    ulp = np.random.default_rng(0).choice([-1.0, 1.0], x.shape) * 2.0 ** -23
    sensitivity = np.abs(run(graph_def, feed, fetch, (x * (1 + ulp)).astype(np.float32)) - before).max()
    assert np.abs(before).max() > 0.1
    assert np.abs(after - before).max() <= max(4 * sensitivity, 1e-5 * np.abs(before).max())


def canonical(model, x, deep: bool = False, **options):
    """(graph before, graph after, records, fetches) of a Keras model's frozen graph and `canonicalize`'s rewrite of
    it, after checking that the input graph is untouched and that the two compute the same on x (`deep`: within
    the network's own round-off, `assert_within_roundoff`)."""
    from mp_rewrite.rules import canonicalize
    graph_def, fetches, feed = frozen(model, x.shape)
    snapshot = graph_def.SerializeToString(deterministic=True)
    new, records = canonicalize(graph_def, fetches, **options)
    assert graph_def.SerializeToString(deterministic=True) == snapshot  # the input is never modified
    for fetch in fetches:
        if deep:
            assert_within_roundoff(graph_def, new, feed, fetch, x)
        else:
            assert_same(run(graph_def, feed, fetch, x), run(new, feed, fetch, x))
    return graph_def, new, records, fetches


def keep_the_cut(monkeypatch) -> None:
    """Fix the in-place race's verdict at the cut, as measured costs that keep it say (a CostTable whose keep is
    ""): which variant wins the race on a small model depends on the machine's load, and a test of what the rules
    write needs them applied."""
    import dataclasses
    from mp_rewrite.core.assignment import CostTable
    from mp_rewrite.savedmodel import in_place

    def the_cut_kept(options, *args, **kwargs):  # what in_place_costs gives where the race keeps the cut
        if options.assign != "cost":
            return options
        return dataclasses.replace(options, costs=CostTable("bfloat16", keep="", note="the cut kept (fixed here)"))
    monkeypatch.setattr(in_place, "in_place_costs", the_cut_kept)
