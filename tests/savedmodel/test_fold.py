"""Folding Keras BatchNormalization into the convolution or matmul before it, in frozen graphs (rules/batchnorm.py),
and folding the Casts of constants: on real Keras models with trained-looking normalization statistics."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.rules import batchnorm as fold, constants  # noqa: E402
from mp_rewrite.analysis.grappler import FOLDING, optimize_graph  # noqa: E402
from mp_rewrite.savedmodel.frozen_function import prune  # noqa: E402
from mp_rewrite.savedmodel.frozen_signature import freeze_signature  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402

CONTRACTIONS = {"Conv2D", "DepthwiseConv2dNative", "MatMul"}


def _with_statistics(model, layers=keras.layers):
    """Give every BatchNormalization and bias values a trained model has (random init makes most of them no-ops)."""
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 2, gamma.shape), rng.normal(0, 0.5, beta.shape),
                               rng.normal(0, 0.5, mean.shape), rng.uniform(0.2, 3, variance.shape)])
        elif getattr(layer, "use_bias", False):
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, rng.normal(0, 0.3, bias.shape)])
    return model


def _cnn():
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(16, 3, padding="same")(inp)  # with a bias
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, use_bias=False)(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    x = keras.layers.Conv2D(8, 1, use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.BatchNormalization()(keras.layers.Dense(10)(x))
    return _with_statistics(keras.Model(inp, x))


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("fold") / "cnn"
    _cnn().export(str(path), verbose=False)
    return path


def _frozen_folded(path):
    """(the signature, its frozen graph after Grappler's folding, the feed and fetch names)."""
    loaded = tf.saved_model.load(str(path))  # kept alive: the signature reads its variables
    frozen = freeze_signature(loaded, "serving_default")
    signature = loaded.signatures["serving_default"]
    fetches = [t.name for t in signature.outputs]
    return optimize_graph(frozen.graph_def, fetches, FOLDING), [name for _, name in frozen.inputs], fetches


def _run(graph_def, feed, fetch, x):
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    pruned = wrapped.prune(wrapped.graph.get_tensor_by_name(feed), wrapped.graph.get_tensor_by_name(fetch))
    return pruned(tf.constant(x)).numpy()


def _after(graph_def, ops):
    """How many Mul/Add nodes read a contraction (possibly through a BiasAdd)."""
    nodes = {n.name: n for n in graph_def.node}
    count = 0
    for node in graph_def.node:
        if node.op in ops:
            for name in node.input:
                producer = nodes.get(name.split(":")[0])
                while producer is not None and producer.op in ("BiasAdd", "Identity"):
                    producer = nodes.get(producer.input[0].split(":")[0])
                count += producer is not None and producer.op in CONTRACTIONS
    return count


def test_every_normalization_is_folded_and_the_values_stay(cnn):
    graph_def, feeds, fetches = _frozen_folded(cnn)
    # Grappler pushes one multiply into the conv before it; three, and the shift after that conv, stay.
    assert _after(graph_def, {"Mul", "AddV2"}) == 4
    folded, names = fold.fold_batch_norms(graph_def, fetches)
    folded = prune(folded, fetches)
    assert len(names) == 4  # three scale-and-shift chains and one shift the conv before it kept
    assert _after(folded, {"Mul", "Add", "AddV2"}) == 0
    assert {n.op for n in folded.node} & {"Mul", "Add", "AddV2"} == set()
    x = np.random.default_rng(1).normal(size=(3, 12, 12, 3)).astype(np.float32)
    before, after = _run(graph_def, feeds[0], fetches[0], x), _run(folded, feeds[0], fetches[0], x)
    assert np.abs(before).max() > 0.1  # the check below means something
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * np.abs(before).max())


def test_the_input_graph_is_not_modified(cnn):
    graph_def, _, fetches = _frozen_folded(cnn)
    snapshot = graph_def.SerializeToString(deterministic=True)
    fold.fold_batch_norms(graph_def, fetches)
    constants.fold_constant_casts(graph_def, fetches)
    assert graph_def.SerializeToString(deterministic=True) == snapshot


def test_what_is_not_per_channel_or_is_shared_stays():
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 4), name="image")
    conv = keras.layers.Conv2D(4, 1)(inp)
    # A scale that differs per position is not a per-channel scale; a second reader of the conv output would see
    # the folded filter.
    scaled = keras.layers.Lambda(lambda t: t * tf.reshape(tf.range(36, dtype=tf.float32), (6, 6, 1)))(conv)
    shared = keras.layers.Lambda(lambda t: t * 3.0)(conv)
    model = keras.Model(inp, [scaled, shared, conv])
    from tensorflow.python.framework import convert_to_constants
    frozen = convert_to_constants.convert_variables_to_constants_v2(
        tf.function(model).get_concrete_function(tf.TensorSpec((1, 6, 6, 4))))
    fetches = [t.name for t in frozen.outputs]
    graph_def = optimize_graph(frozen.graph.as_graph_def(), fetches, FOLDING)
    _, names = fold.fold_batch_norms(graph_def, fetches)
    assert names == []


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_frozen_conversion_folds_and_matches_float32(cnn, tmp_path, precision):
    out = tmp_path / precision
    convert_saved_model(cnn, out, precision, freeze=True, device="any")
    signature = tf.saved_model.load(str(out)).signatures["serving_default"]
    ops = [n.op for f in signature.graph.as_graph_def().library.function for n in f.node_def]
    assert "Mul" not in ops and ops.count("BiasAdd") >= 4
    casts_of_constants = [n for f in signature.graph.as_graph_def().library.function for n in f.node_def
                          if n.op == "Cast" and any(m.name == n.input[0] and m.op == "Const" for m in f.node_def)]
    assert casts_of_constants == []
    x = np.random.default_rng(2).normal(size=(2, 12, 12, 3)).astype(np.float32)
    want = tf.saved_model.load(str(cnn)).signatures["serving_default"](image=tf.constant(x))
    got = signature(image=tf.constant(x))
    for key, value in want.items():
        reference = value.numpy()
        scale = np.abs(reference).max()
        assert np.abs(got[key].numpy().astype(np.float32) - reference).max() < 0.05 * scale


def _tf_keras_cnn(path):
    """tf_keras' BatchNormalization runs FusedBatchNormV3 (Keras 3's lowers to Mul/Add): after a conv with a bias,
    a depthwise conv and a conv without one."""
    import tf_keras
    layers = tf_keras.layers
    tf_keras.utils.set_random_seed(0)
    inp = tf_keras.Input((12, 12, 3), name="image")
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(inp)))
    x = layers.BatchNormalization()(layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, use_bias=False)(x))
    x = layers.BatchNormalization()(layers.Conv2D(8, 1, use_bias=False)(layers.ReLU(6.0)(x)))
    model = _with_statistics(tf_keras.Model(inp, layers.GlobalAveragePooling2D()(x)), tf_keras.layers)
    tf.saved_model.save(model, str(path))


def test_tf_keras_fused_batch_norm_is_folded(tmp_path):
    _tf_keras_cnn(tmp_path / "cnn")
    convert_saved_model(tmp_path / "cnn", tmp_path / "out", "bfloat16", freeze=True)
    signature = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    graph_def = signature.graph.as_graph_def()
    ops = [n.op for f in graph_def.library.function for n in f.node_def]
    assert not [op for op in ops if op.startswith("FusedBatchNorm")] and ops.count("BiasAdd") == 3, ops
    x = tf.constant(np.random.default_rng(2).normal(size=(2, 12, 12, 3)).astype(np.float32))
    want = tf.saved_model.load(str(tmp_path / "cnn")).signatures["serving_default"](image=x)
    for key, value in signature(image=x).items():
        reference = want[key].numpy()
        assert np.abs(reference).max() > 0.1
        np.testing.assert_allclose(value.numpy(), reference, atol=0.03 * np.abs(reference).max())


def test_folding_casts_inserts_no_attr_without_a_value():
    """A SavedModel leaves a Cast's default attrs (Truncate) out; reading one through the protobuf map would insert
    an empty AttrValue, which TF refuses to run ("Failed to bind all placeholders")."""
    graph = tf.Graph()
    with graph.as_default():
        weight = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
        tf.identity(tf.cast(weight, tf.bfloat16, name="cast"), name="out")
        tf.identity(tf.cast(weight, tf.int32, name="to_int"), name="index")  # not a weight cast: it stays
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        node.attr.pop("Truncate", None)
    folded, count = constants.fold_constant_casts(graph_def, ["out", "index"])
    assert count == 1
    assert all(value.WhichOneof("value") is not None for node in folded.node for value in node.attr.values())
    assert all("Truncate" not in node.attr for node in graph_def.node)  # the input stays as it was
