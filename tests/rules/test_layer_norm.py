"""LayerNormalization as one `_MklLayerNorm`: Keras 3's layer (center and scale on and off, several epsilons, rank 2
and 3), keras-hub's, in a Transformer block; equal in float32 to the graph as Keras wrote it, and fused by TF's own
Grappler. TF 2.21's remapper runs the fused kernel with epsilon 0.001 whatever the graph says; the rule rescales
the input so that any epsilon comes out exact, and these tests would see it if it did not (epsilon 1e-12 and 1e-6
change the output by ~1e-3 otherwise)."""

from __future__ import annotations

import numpy as np
import pytest

from rules_support import canonical, executed, fused, keras, runtime_graph, with_nonzero_biases
from mp_rewrite.rules import fusion_groups
from mp_rewrite.rules.graph import EditableGraph
from mp_rewrite.rules.layer_norm import match_layer_norm

X3 = np.random.default_rng(7).normal(size=(4, 16, 48)).astype(np.float32)


def _norm_model(rank: int, **options):
    keras.utils.set_random_seed(0)
    inp = keras.Input(X3.shape[1:] if rank == 3 else X3.shape[2:])
    hidden = keras.layers.Dense(48)(inp)
    return with_nonzero_biases(keras.Model(inp, keras.layers.Dense(24)(keras.layers.LayerNormalization(**options)(
        hidden))))


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("center, scale, epsilon", [(True, True, 1e-3), (False, False, 1e-3), (True, False, 1e-12),
                                                    (False, True, 1e-6)])
def test_keras_layer_norm_is_one_fused_kernel(rank, center, scale, epsilon):
    model = _norm_model(rank, center=center, scale=scale, epsilon=epsilon)
    x = X3 if rank == 3 else X3[:, 0, :]
    before, after, records, fetches = canonical(model, x)  # equal in float32 (checked there)
    applied = [r for r in records if r.rule == "layer_norm"]
    assert [r.applied for r in applied] == [True] and f"epsilon {epsilon:.3g}" in applied[0].reason
    assert "_MklLayerNorm" not in [op for op, _ in fused(runtime_graph(before, fetches))]
    assert [op for op, _ in fused(runtime_graph(after, fetches))].count("_MklLayerNorm") == 1
    assert [g.op for g in fusion_groups(after, fetches)].count("_MklLayerNorm") == 1


def test_layer_norm_before_pooling_is_one_fused_kernel():
    """A Transformer's last LayerNorm feeds GlobalAveragePooling1D: the pooling Mean (over the sequence) reads only
    the normalization and a constant, and joined its region until reductions over another axis were kept out."""
    keras.utils.set_random_seed(0)
    inp = keras.Input(X3.shape[1:])
    norm = keras.layers.LayerNormalization()(keras.layers.Dense(48)(inp))
    model = with_nonzero_biases(keras.Model(inp, keras.layers.Dense(24)(
        keras.layers.GlobalAveragePooling1D()(norm))))
    _, after, records, fetches = canonical(model, X3)
    assert [r.applied for r in records if r.rule == "layer_norm"] == [True]
    ran = [op for op, _ in executed(after, "x:0", fetches[0], X3)]
    assert "_MklLayerNorm" in ran and ran.count("Mean") == 1, ran


def test_a_mean_that_is_not_a_layer_norm_is_left_alone():
    keras.utils.set_random_seed(0)
    inp = keras.Input(X3.shape[1:])
    hidden = keras.layers.Dense(48)(inp)
    centered = hidden - keras.ops.mean(hidden, axis=-1, keepdims=True)  # a Mean, no normalization
    model = with_nonzero_biases(keras.Model(inp, keras.layers.Dense(24)(centered * 2.0)))
    _, after, records, fetches = canonical(model, X3)
    assert not [r for r in records if r.rule == "layer_norm"]
    assert "_MklLayerNorm" not in [op for op, _ in fused(runtime_graph(after, fetches))]


def test_a_normalization_over_another_axis_declines_with_its_reason():
    model = _norm_model(3, axis=1)
    before, _, records, _ = canonical(model, X3)
    declined = [r for r in records if r.rule == "layer_norm"]
    assert declined and not declined[0].applied and "not over the last axis" in declined[0].reason
    graph = EditableGraph(before)
    means = [n for n in before.node if n.op == "Mean"]
    assert all(match_layer_norm(graph, graph.nodes[m.name]) is None or not match_layer_norm(
        graph, graph.nodes[m.name]).ok for m in means)


def test_tf_keras_layer_norm_frozen_is_one_fused_kernel():
    """tf_keras's LayerNormalization (epsilon at least 1.001e-5) is a FusedBatchNormV3 in training mode between
    Reshapes, then `* gamma + beta`: TF's remapper fuses it (its first pattern) only where the output's shape is
    symbolically the input's, so the Reshape back by `Shape(x)` must stay one (static_reshape made it a constant
    with -1, a batch dimension of its own, and the frozen model ran a FusedBatchNormV3, Fills and the Mul and Add)."""
    import tf_keras
    tf_keras.utils.set_random_seed(0)
    inp = tf_keras.Input(X3.shape[1:])
    norm = tf_keras.layers.LayerNormalization()(tf_keras.layers.Dense(48)(inp))
    model = tf_keras.Model(inp, tf_keras.layers.Dense(24)(norm))
    rng = np.random.default_rng(0)
    for weight in model.weights:
        weight.assign(rng.normal(0.5, 0.3, weight.shape).astype(np.float32))
    _, after, _, fetches = canonical(model, X3)
    ran = [op for op, _ in executed(after, "x:0", fetches[0], X3)]
    assert "_MklLayerNorm" in ran and not [op for op in ran if "BatchNorm" in op or op in ("Fill", "Mul")], ran
