"""A keras-hub GPT-2 backbone (built from its constructor, random weights, non-zero biases): every projection and
FFN becomes a fused MatMul in TF, every LayerNorm one _MklLayerNorm, the groups fusion_groups names are the ones TF fuses, and the outputs are equal."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

from rules_support import fused, keras, runtime_graph, with_nonzero_biases
from mp_rewrite.rules import canonicalize, fusion_groups
from mp_rewrite.analysis.grappler import FOLDING, optimize_graph


def _run(graph_def, feeds, fetches, values):
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    get = wrapped.graph.get_tensor_by_name
    pruned = wrapped.prune([get(f) for f in feeds], [get(f) for f in fetches])
    return [t.numpy() for t in pruned(*[tf.constant(values[f]) for f in feeds])]


def test_gpt2_backbone_fuses_every_projection_and_ffn():
    import keras_hub
    keras.utils.set_random_seed(0)
    model = with_nonzero_biases(keras_hub.models.GPT2Backbone(
        vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128, max_sequence_length=32))
    # Sequence length unknown too, as in a serving signature: Keras 3 then keeps its Einsums (a dynamic shape).
    specs = {k: tf.TensorSpec((None, None), tf.int32, name=k) for k in ("token_ids", "padding_mask")}
    function = tf.function(lambda inputs: model(inputs, training=False)).get_concrete_function(specs)
    constant = convert_to_constants.convert_variables_to_constants_v2(function)
    fetches, feeds = [t.name for t in constant.outputs], [t.name for t in constant.inputs]
    graph_def = optimize_graph(constant.graph.as_graph_def(), fetches, FOLDING)
    new, records = canonicalize(graph_def, fetches)
    assert not [r for r in records if not r.applied]
    assert fused(runtime_graph(graph_def, fetches)) == []
    after = collections.Counter(tuple(ops) for _, ops in fused(runtime_graph(new, fetches)))
    # 2 layers x (4 projections + 1 FFN); 2 layers x 2 LayerNorms + the final one, each one _MklLayerNorm
    assert after == {("BiasAdd",): 10, ("BiasAdd", "GeluApproximate"): 2, (): 5}
    assert sum(op == "_MklLayerNorm" for op, _ in fused(runtime_graph(new, fetches))) == 5
    assert collections.Counter(g.fused_ops for g in fusion_groups(new, fetches)) == after
    rng = np.random.default_rng(0)
    values = {f: (rng.integers(0, 1000, (2, 32)) if "token" in f else np.ones((2, 32))).astype(np.int32)
              for f in feeds}
    for before, now in zip(_run(graph_def, feeds, fetches, values), _run(new, feeds, fetches, values)):
        assert np.abs(before).max() > 0.1
        np.testing.assert_allclose(now, before, rtol=1e-5, atol=1e-5 * np.abs(before).max())


def test_gpt2_at_a_known_sequence_length_fuses_its_feed_forward_residuals_and_transposes_no_scores():
    """Served at a fixed sequence length, each feed-forward output runs with its residual add (residual_rows); the
    attention output's add is declined with its reason: its other addend passed through the padding mask, a second
    input whose batch may broadcast over the tokens'. (Each layer also builds the causal mask from its own input's
    batch, which after the first attention is the tokens' and the padding mask's broadcast: no rule can prove the
    layers' masks one.) The attention scores, which TF's einsum computes as key @ query and then transposes, are
    computed as query @ key^T (matmul_transpose): one Transpose of [batch, heads, T, T] fewer per layer."""
    import keras_hub
    from mp_rewrite.analysis.execution import executed_nodes
    keras.utils.set_random_seed(0)
    model = with_nonzero_biases(keras_hub.models.GPT2Backbone(
        vocabulary_size=1000, num_layers=3, num_heads=4, hidden_dim=64, intermediate_dim=128, max_sequence_length=32))
    specs = {k: tf.TensorSpec((None, 32), tf.int32, name=k) for k in ("token_ids", "padding_mask")}
    function = tf.function(lambda inputs: model(inputs, training=False)).get_concrete_function(specs)
    constant = convert_to_constants.convert_variables_to_constants_v2(function)
    fetches, feeds = [t.name for t in constant.outputs], [t.name for t in constant.inputs]
    graph_def = optimize_graph(constant.graph.as_graph_def(), fetches, FOLDING)
    new, records = canonicalize(graph_def, fetches)
    residual = [r for r in records if r.rule == "residual_rows"]
    assert sum(r.applied for r in residual) == 3 and all("not proven" in r.reason for r in residual if not r.applied)
    assert len(residual) == 6

    rng = np.random.default_rng(0)
    values = {f: (rng.integers(0, 1000, (2, 32)) if "token" in f else np.ones((2, 32))).astype(np.int32)
              for f in feeds}

    def kernels(graph):
        wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph, name=""), [])
        call = wrapped.prune([wrapped.graph.get_tensor_by_name(f) for f in feeds],
                             [wrapped.graph.get_tensor_by_name(f) for f in fetches])
        return collections.Counter((n.op, tuple(s.decode() for s in n.attr["fused_ops"].list.s))
                                   for n in executed_nodes(call, *[tf.constant(values[f]) for f in feeds]))

    ran, ran_before = kernels(new), kernels(graph_def)
    assert sum(n for (op, ops), n in ran.items() if "FusedMatMul" in op and ops == ("BiasAdd", "Add")) == 3, ran
    assert [r.applied for r in records if r.rule == "matmul_transpose"] == [True] * 3

    def transposes(counts):
        return sum(n for (op, _), n in counts.items() if op.endswith("Transpose"))
    assert transposes(ran) == transposes(ran_before) - 3, (ran_before, ran)
    for before, now in zip(_run(graph_def, feeds, fetches, values), _run(new, feeds, fetches, values)):
        assert np.abs(before).max() > 0.1
        np.testing.assert_allclose(now, before, rtol=1e-5, atol=1e-5 * np.abs(before).max())
