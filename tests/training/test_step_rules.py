"""The graph rules in a traced training step (training.step_rules, the cost assignment, opted in with
MP_REWRITE_STEP_RULES=1: off by default, measured slower on a Transformer encoder's step): a Keras 3 Transformer block
(MultiHeadAttention, Dense, LayerNormalization) trained with a custom tf.function step through the training hook,
every node kept float32 so that the rules alone change the step. Its variables after a few steps are the plain
step's within float32 round-off; the step runs MultiHeadAttention's projections and the Dense layers as fused MatMul
+ BiasAdd kernels (what a call executed, analysis.execution); nothing the gradient reads is renamed or rewritten,
and the rules whose values the gradient reads (LayerNorm, GELU, the activation after a Dense) do not apply."""

from __future__ import annotations

import collections
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite.analysis.execution import executed_nodes
from mp_rewrite.analysis.op_costs import NATIVE_FLAGS, machine_facts
from mp_rewrite.core.assignment import CostTable
from mp_rewrite.core.functions import function_to_graph
from mp_rewrite.core.op_support import Signatures
from mp_rewrite.core.options import make_options
from mp_rewrite.training import api as training
from mp_rewrite.training import step_rules

D_MODEL, SEQ, BATCH, STEPS = 32, 16, 4, 3
FUSED = ("_MklNativeFusedMatMul", ("BiasAdd",))
NATIVE_BF16 = bool(set(NATIVE_FLAGS["bfloat16"]) & set(machine_facts()["cpu_flags"]))


@pytest.fixture(autouse=True)
def rewrite_off(monkeypatch):
    monkeypatch.setenv(step_rules.RULES_ENV, "1")  # opted in: off by default (measured slower, step_rules.rules_on)
    yield
    if training.is_enabled():
        training.disable_mixed_precision_graph_rewrite()


def _model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((SEQ, D_MODEL))
    h = keras.layers.LayerNormalization()(inp + keras.layers.MultiHeadAttention(4, D_MODEL // 4)(inp, inp))
    ffn = keras.layers.Dense(D_MODEL)(keras.layers.Dense(2 * D_MODEL, activation="gelu")(h))
    h = keras.layers.LayerNormalization()(h + ffn)
    return keras.Model(inp, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))


def _step(model, optimizer, batch):
    spec = (tf.TensorSpec([batch, SEQ, D_MODEL]), tf.TensorSpec([batch, 1]))

    @tf.function(input_signature=spec)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss
    return step


def _train(batch, rules: bool):
    """(the variables after STEPS steps, Counter of the (op, fused_ops) the first call executed, the hook's
    RewriteResult of the step or None, the model); `rules`: through the hook, every node kept float32 (the rules
    change the step)."""
    model, optimizer = _model(), keras.optimizers.SGD(0.05)
    if rules:
        # A table of no measured ops gives the rewrite at once; keep_fp32 "*": no node changes precision.
        optimizer = training.enable_mixed_precision_graph_rewrite(
            optimizer, precision="bfloat16", assign="cost", costs=CostTable("bfloat16"), keep_fp32=["*"])
    step = _step(model, optimizer, batch)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, SEQ, D_MODEL)).astype("float32")
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    ran = collections.Counter((n.op, tuple(s.decode() for s in n.attr["fused_ops"].list.s))
                              for n in executed_nodes(step, x, y))
    for _ in range(STEPS - 1):
        step(x, y)
    result = training.rewritten_functions().get(step.get_concrete_function().name.decode())
    assert not rules or result is not None, training.rewrite_failures()
    return [v.numpy() for v in model.variables], ran, result, model


@pytest.mark.parametrize("batch, fused", [(BATCH, 7), (None, 4)])
def test_the_rules_fuse_the_forward_matmuls_and_the_step_updates_every_variable_as_traced(batch, fused):
    start = [v.numpy() for v in _model().variables]
    plain, plain_ran, _, model = _train(batch, rules=False)
    ruled, ruled_ran, result, _ = _train(batch, rules=True)
    assert not result.retyped  # float32: only the rules changed the step
    # The forward MatMul + bias pairs run fused: MultiHeadAttention's 4 projections and the 3 Dense layers with a
    # known batch (as traced, only the last Dense, whose input is 2-D); with an unknown batch the q/k/v projections'
    # outputs are also read by the gradient's Shape nodes, and dense_bias declines them (their AddV2s stay).
    assert plain_ran[FUSED] == 1 and plain_ran[("BiasAdd", ())] == 3
    assert ruled_ran[FUSED] == fused and ruled_ran[("BiasAdd", ())] == 0
    for variable, a, b, s in zip(model.variables, plain, ruled, start):
        # The softmax does not depend on the key bias: its gradient is zero up to round-off.
        assert "key/bias" in variable.path or not np.allclose(a, s, rtol=0, atol=1e-6), variable.path
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=variable.path)


@pytest.mark.skipif(not NATIVE_BF16, reason="on a CPU without bfloat16 units the default keeps float32")
def test_the_default_measures_the_changed_step_and_swaps_its_cut_in(tmp_path, monkeypatch, caplog):
    # The FuncGraph's shapes once annotated a node the rules had given an old name (a 4-D shape on a 2-D Reshape):
    # TF refused the annotated step, and the measuring failed.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = _model()
    optimizer = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.05), precision="bfloat16",
                                                              assign="cost")
    step = _step(model, optimizer, None)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, SEQ, D_MODEL)).astype("float32")
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    failed_before = training.rewrite_failures()  # other tests in this process may leave failures of their own
    with caplog.at_level(logging.INFO, logger="mp_rewrite"):
        losses = [float(step(x, y))]
        training.finish_measuring()
        losses += [float(step(x, y)) for _ in range(3)]
    assert "graph rules applied" in caplog.text and "measured in" in caplog.text
    assert "failed" not in caplog.text and training.rewrite_failures() == failed_before
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_nothing_the_gradient_reads_is_renamed_or_rewritten_and_the_rules_that_would_do_not_apply(monkeypatch):
    model = _model()
    step = _step(model, keras.optimizers.SGD(0.05), None)
    concrete = step.get_concrete_function()
    traced = function_to_graph(concrete.function_def, Signatures(None))
    options = make_options("bfloat16", assign="cost", costs=CostTable("bfloat16"))
    body, changes = step_rules.rewritten_step(concrete._inference_function, traced, options, "step")
    applied = collections.Counter(change.split(" at ")[0] for change in changes)
    assert {"batch_matmul", "reshape_pair", "static_reshape", "dense_bias"} <= set(applied), applied
    assert not {"layer_norm", "gelu", "dense_activation"} & set(applied), applied
    read = step_rules.gradient_reads(traced.graph_def)
    assert any("layer_normalization" in n for n in read) and any("Gelu" in n for n in read)  # what they would change
    before = {n.name: n.op for n in traced.graph_def.node}
    after = {n.name: n.op for n in body.graph_def.node}
    assert read <= set(after), sorted(read - set(after))
    # dense_bias keeps the name of the bias add for the Reshape after it: the same tensor, which the gradient reads
    # (the Gelu's gradient, the residual add's Shape). Nothing else the gradient reads changes op.
    changed = {n: (before[n], after[n]) for n in read if after[n] != before[n]}
    assert set(changed.values()) == {("BiasAdd", "Reshape")} and len(changed) == applied["dense_bias"], changed
    # The shapes the cost model is given: the rules gave old names to nodes of another rank (a projection's
    # BiasAdd is now named as its 4-D Reshape was), so those come from shape inference, not from the FuncGraph.
    same = step_rules.unchanged_nodes(traced.graph_def, body.graph_def)
    assert not set(changed) & same
    func_graph = {op.name: [t.shape for t in op.outputs] for op in concrete.graph.get_operations()}
    shapes = step_rules.rewritten_shapes(concrete._inference_function, traced.graph_def, body.graph_def, func_graph)
    reused = {name for name, shape in shapes.items()
              if name in func_graph and [t.rank for t in shape] != [t.rank for t in func_graph[name]]}
    assert reused and not reused & same and len(shapes) > 0.9 * len(body.graph_def.node)
    _, records = step_rules.canonicalized(traced, step_rules.argument_shapes(concrete._inference_function,
                                                                             traced.graph_def), "step")
    [activation] = [r for r in records if r.rule == "dense_activation"]
    assert not activation.applied and "read outside its activation" in activation.reason
    # Grappler's lists rewrite the step as traced; so does the cost assignment unless the rules are opted in.
    lists = make_options("bfloat16", assign="lists")
    assert step_rules.rewritten_step(concrete._inference_function, traced, lists, "step") == (traced, ())
    monkeypatch.delenv(step_rules.RULES_ENV)
    assert step_rules.rewritten_step(concrete._inference_function, traced, options, "step") == (traced, ())
