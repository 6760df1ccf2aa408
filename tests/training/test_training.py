"""Training with the graph rewrite: enable/disable/context manager, the tf.function hook, loss scaling, accuracy.

Everything runs on real TensorFlow and Keras 3, on CPU: float16 is rewritten with device="cpu" (kernels checked
against TF's CPU kernels), bfloat16 with its default device. What executes is read back from the eager context
(`context.context().get_function_def(name)`), not from our own return values. The task shipped here is learnable by
tiny models in a few hundred steps: classify whether the sum of the inputs is positive.
"""

import gc
import json
import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.eager.polymorphic_function import atomic_function

from mp_rewrite.core.assign_env import ASSIGN_ENV
from mp_rewrite.analysis.op_costs import NATIVE_FLAGS, machine_facts
from mp_rewrite.training import function_hook
from mp_rewrite.training import api as training
from mp_rewrite.errors import OptionError
from mp_rewrite.training.api import wrap_optimizer
from mp_rewrite.training.loss_scale.optimizer import UNSCALE_SCOPE, LossScaleOptimizer
from mp_rewrite.training.api import (
    disable_mixed_precision_graph_rewrite,
    enable_graph_rewrite,
    enable_mixed_precision_graph_rewrite,
    mixed_precision_graph_rewrite,
    rewrite_failures,
    rewritten_functions,
)

HALF, BF16, FLOAT = tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum
LOW = {"float16": HALF, "bfloat16": BF16}
NATIVE_BF16 = bool(set(NATIVE_FLAGS["bfloat16"]) & set(machine_facts()["cpu_flags"]))
# How each precision is enabled on this CPU-only machine, with Grappler's lists (what these tests check against:
# bfloat16 on a CPU defaults to the cost assignment, tested in tests/analysis/test_cost_training.py).
ENABLE = {"float16": {"precision": "float16", "device": "cpu"},
          "bfloat16": {"precision": "bfloat16", "assign": "lists"}}


@pytest.fixture(autouse=True)
def rewrite_off():
    """Every test starts and ends with the rewrite off, float32 Keras policy, and the one-time warnings re-armed."""
    keras.mixed_precision.set_global_policy("float32")
    training._STATE["warned"].clear()
    yield
    if training.is_enabled() or function_hook.active_options() is not None:
        disable_mixed_precision_graph_rewrite()
    keras.mixed_precision.set_global_policy("float32")


# -- helpers --------------------------------------------------------------------------------------------------------


def sum_sign_data(n, shape, seed):
    """Inputs ~ N(0, 1) and labels 1.0 where their sum is positive."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype("float32")
    return x, (x.reshape(n, -1).sum(axis=1) > 0).astype("float32")[:, None]


def make_model(kind):
    keras.utils.set_random_seed(0)
    if kind == "mlp":
        return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             keras.layers.Conv2D(8, 3, padding="same", activation="relu"), keras.layers.Flatten(),
                             keras.layers.Dense(1)])


SHAPES = {"mlp": (16,), "cnn": (8, 8, 1)}
LOSS = keras.losses.BinaryCrossentropy(from_logits=True)


def make_train_step(model, opt):
    """The issue's tf_keras-style step, with a loss `factor` to force overflows."""

    @tf.function
    def train_step(x, y, factor=tf.constant(1.0)):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True)) * factor
            scaled = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def executed(name):
    """The FunctionDef the eager context runs under `name`."""
    return context.context().get_function_def(name)


def ops_in(fdef, dtype, scope=""):
    """Op types of the nodes whose "T" attr is `dtype` (optionally only names under `scope`)."""
    return {n.op for n in fdef.node_def if n.attr["T"].type == dtype and n.name.startswith(scope)}


def cf_name(fn, *args):
    name = fn.get_concrete_function(*args).name
    return name.decode() if isinstance(name, bytes) else name


def accuracy(model, x, y):
    return float(np.mean((model(x).numpy() > 0) == (y > 0.5)))


def hook_installed():
    return getattr(atomic_function.from_func_graph, "_mp_rewrite_hook", False)


# -- what executes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_executed_step_has_low_precision_matmul_conv_and_gradients(kind, precision):
    model = make_model(kind)
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **ENABLE[precision])
    step = make_train_step(model, opt)
    x, y = sum_sign_data(64, SHAPES[kind], 0)
    assert np.isfinite(step(x, y).numpy())
    name = cf_name(step, x, y)
    fdef, low = executed(name), LOW[precision]
    forward, backward = ops_in(fdef, low), ops_in(fdef, low, "gradient_tape/")
    if kind == "mlp":
        assert {"MatMul", "BiasAdd", "Relu"} <= forward and {"MatMul", "ReluGrad", "BiasAddGrad"} <= backward
    else:
        assert {"Conv2D", "MatMul"} <= forward
        assert {"Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul"} <= backward
    # The variables stay float32: their reads and updates are preserved, and the traced definition was float32.
    assert all(v.dtype == "float32" for v in model.weights)
    assert not ops_in(function_hook.original_definition(name), low)
    assert name in rewritten_functions() and rewritten_functions()[name].precision == precision
    assert "MatMul" in ops_in(step.get_concrete_function(x, y).function_def, low)  # TF's own view agrees
    # Gradients are unscaled in float32, not in the low precision of the gradient MatMuls that feed them; with
    # bfloat16's fixed scale of 1 there is nothing to unscale, and no ops do it.
    unscale = [n for n in fdef.node_def if UNSCALE_SCOPE in n.name and n.op == "Mul"]
    assert all(n.attr["T"].type == tf.float32.as_datatype_enum for n in unscale)
    assert bool(unscale) == (precision == "float16")


def test_model_fit_train_function_runs_rewritten():
    model = make_model("cnn")
    model.compile(optimizer=enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **ENABLE["float16"]),
                  loss=LOSS)
    x, y = sum_sign_data(64, SHAPES["cnn"], 0)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    names = [n for n in rewritten_functions() if "one_step_on_data" in n]
    assert names
    fdef = executed(names[0])
    assert {"Conv2D", "MatMul"} <= ops_in(fdef, HALF)
    assert {"Conv2DBackpropFilter", "Conv2DBackpropInput"} <= ops_in(fdef, HALF)


@pytest.mark.parametrize("family", ["legacy", "new"])
def test_tf_keras_model_fit_takes_the_wrapped_optimizer_and_runs_rewritten(family):
    # tf_keras's compile accepts only its own optimizer classes; the wrapped optimizer must pass as tf_keras's does.
    tf_keras = pytest.importorskip("tf_keras")
    inner = (tf_keras.optimizers.legacy.SGD if family == "legacy" else tf_keras.optimizers.SGD)(0.1)
    opt = enable_mixed_precision_graph_rewrite(inner, **ENABLE["bfloat16"])
    model = tf_keras.Sequential([tf_keras.layers.Dense(16, activation="relu", input_shape=SHAPES["mlp"]),
                                 tf_keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=opt, loss="binary_crossentropy")
    assert model.optimizer is opt and tf_keras.optimizers.get(opt) is opt
    assert type(tf_keras.optimizers.get("sgd")).__name__ == "SGD"  # everything else still goes to tf_keras
    history = model.fit(*sum_sign_data(256, SHAPES["mlp"], 0), batch_size=32, epochs=3, verbose=0,
                        callbacks=[tf_keras.callbacks.ReduceLROnPlateau(monitor="loss")])  # reads optimizer.lr
    assert history.history["loss"][-1] < history.history["loss"][0] and int(opt.iterations) == 24
    names = [n for n in rewritten_functions() if "train_function" in n]
    assert names and "MatMul" in ops_in(executed(names[0]), BF16)


def test_xla_compiled_train_function_runs_rewritten():
    # Keras compiles train functions with XLA by default when a GPU is present; XLA compiles the rewritten body.
    model = make_model("mlp")
    model.compile(optimizer=enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **ENABLE["float16"]),
                  loss=LOSS, jit_compile=True)
    history = model.fit(*sum_sign_data(256, SHAPES["mlp"], 0), batch_size=32, epochs=2, verbose=0)
    assert history.history["loss"][1] < history.history["loss"][0]
    (name,) = [n for n in rewritten_functions() if "one_step_on_data" in n]
    fdef = executed(name)
    assert fdef.attr["_XlaMustCompile"].b and {"MatMul", "ReluGrad"} <= ops_in(fdef, HALF)


def test_gradient_of_a_function_called_under_an_outer_tape():
    model = make_model("mlp")
    x, _ = sum_sign_data(64, SHAPES["mlp"], 0)
    with tf.GradientTape() as tape:
        expected = tape.gradient(tf.reduce_sum(model(x)), model.trainable_variables)
    enable_graph_rewrite(**ENABLE["float16"])

    @tf.function
    def forward(x):
        return model(x)

    with tf.GradientTape() as tape:
        out = tf.reduce_sum(forward(x))
    grads = tape.gradient(out, model.trainable_variables)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=2e-2, atol=2e-2)
    # The forward/backward pair TF built for the outer tape runs rewritten too.
    pair = [n for n in rewritten_functions() if n.startswith(("__forward_forward", "__inference___backward_forward"))]
    assert len(pair) == 2 and all("MatMul" in ops_in(executed(n), HALF) for n in pair)


def test_nested_function_traced_before_enabling_is_rewritten_as_a_child():
    w = tf.Variable(tf.random.normal([16, 16], seed=1))

    @tf.function
    def inner(x):
        return tf.nn.relu(tf.matmul(x, w))

    x = tf.ones([4, 16])
    inner_name = cf_name(inner, x)
    enable_graph_rewrite(**ENABLE["bfloat16"])

    @tf.function
    def outer(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(inner(x))
        return loss, tape.gradient(loss, w)

    loss, grad = outer(x)
    assert inner_name in rewritten_functions() and "MatMul" in ops_in(executed(inner_name), BF16)
    # Differentiating the nested call made TF build a forward/backward pair for it: both rewritten.
    assert any(n.startswith("__forward_inner") for n in rewritten_functions())
    assert any(n.startswith("__inference___backward_inner") for n in rewritten_functions())
    with tf.GradientTape() as tape:
        ref = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)))
    np.testing.assert_allclose(loss.numpy(), ref.numpy(), rtol=2e-2)
    np.testing.assert_allclose(grad.numpy(), tape.gradient(ref, w).numpy(), rtol=2e-2, atol=2e-2)


def test_tf_data_functions_are_left_alone():
    enable_graph_rewrite(**ENABLE["float16"])
    m = tf.random.normal([8, 8], seed=2)

    def mapped(v):
        return tf.cond(tf.reduce_sum(v) > 0, lambda: tf.matmul(v, m), lambda: tf.matmul(m, v))

    data = tf.data.Dataset.from_tensors(tf.ones([8, 8])).map(mapped)
    (value,) = list(data)
    np.testing.assert_array_equal(value.numpy(), tf.matmul(tf.ones([8, 8]), m).numpy())
    # The cond branches were registered (and rewritten) before the map function; they were put back.
    assert not rewritten_functions()


def test_a_failed_rewrite_runs_the_original_and_warns(caplog, monkeypatch):
    import mp_rewrite.core.body

    def broken(*args, **kwargs):
        raise RuntimeError("pass exploded")

    monkeypatch.setattr(mp_rewrite.core.body, "rewrite_body", broken)
    enable_graph_rewrite(**ENABLE["float16"])

    @tf.function
    def f(a):
        return tf.matmul(a, a)

    a = tf.constant([[1.001, 2.0], [3.0, 4.0]])
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        np.testing.assert_array_equal(f(a).numpy(), tf.matmul(a, a).numpy())  # exact: float32
    name = cf_name(f, a)
    assert "pass exploded" in rewrite_failures()[name] and name not in rewritten_functions()
    assert any(name in r.message and "runs in float32" in r.message for r in caplog.records)


def test_a_rewrite_tensorflow_could_not_run_is_never_swapped_in():
    # UNSAFE_FORCE_ALL forces SparseMatMul, whose Ta/Tb allow only float and bfloat16. TF checks a FunctionDef only
    # when it first runs it, so the hook checks dtypes and kernels itself and keeps the original.
    enable_graph_rewrite(level="UNSAFE_FORCE_ALL", **ENABLE["float16"])

    @tf.function
    def f(a):
        return tf.raw_ops.SparseMatMul(a=a, b=a) + tf.matmul(a, a)

    a = tf.ones([4, 4])
    np.testing.assert_allclose(f(a).numpy(), np.full([4, 4], 8.0))
    name = cf_name(f, a)
    fdef = executed(name)
    assert all(n.attr["Ta"].type != HALF for n in fdef.node_def if n.op == "SparseMatMul")
    assert name in rewrite_failures() or name in rewritten_functions()


def test_registry_forgets_collected_functions():
    enable_graph_rewrite(**ENABLE["float16"])

    def trace():
        @tf.function
        def f(a):
            return tf.matmul(a, a)

        f(tf.ones([2, 2]))
        return cf_name(f, tf.ones([2, 2]))

    name = trace()
    gc.collect()
    assert name not in rewritten_functions() and not context.context().has_function(name)


# -- accuracy: float32 vs rewrite + float16 (dynamic loss scale) vs rewrite + bfloat16 ------------------------------


def train_custom_loop(kind, precision, epochs=8):
    model = make_model(kind)
    if precision == "float32":
        opt = wrap_optimizer(keras.optimizers.SGD(0.05), loss_scale=None)
    else:
        opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.05), **ENABLE[precision])
    step = make_train_step(model, opt)
    x, y = sum_sign_data(1024, SHAPES[kind], 1)
    for _ in range(epochs):
        for i in range(0, len(x), 32):
            step(x[i:i + 32], y[i:i + 32])
    if precision != "float32":
        assert any(LOW[precision] in {n.attr["T"].type for n in executed(name).node_def}
                   for name in rewritten_functions())
        disable_mixed_precision_graph_rewrite()
    return accuracy(model, *sum_sign_data(512, SHAPES[kind], 2)), model.get_weights()


def train_fit(kind, precision, epochs=8):
    model = make_model(kind)
    opt = keras.optimizers.SGD(0.05)
    if precision != "float32":
        opt = enable_mixed_precision_graph_rewrite(opt, **ENABLE[precision])
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(*sum_sign_data(1024, SHAPES[kind], 1), batch_size=32, epochs=epochs, verbose=0, shuffle=False)
    if precision != "float32":
        assert any("one_step_on_data" in name for name in rewritten_functions())
        disable_mixed_precision_graph_rewrite()
    return accuracy(model, *sum_sign_data(512, SHAPES[kind], 2)), model.get_weights()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("train", [train_custom_loop, train_fit], ids=["custom_loop", "fit"])
def test_same_accuracy_in_float32_float16_and_bfloat16(kind, train):
    runs = {p: train(kind, p) for p in ("float32", "float16", "bfloat16")}
    acc = {p: a for p, (a, _) in runs.items()}
    assert acc["float32"] >= 0.85, acc
    assert abs(acc["float16"] - acc["float32"]) <= 0.03, acc
    assert abs(acc["bfloat16"] - acc["float32"]) <= 0.03, acc
    # Same initial weights and batches: the low-precision runs end near the float32 weights, but not on them.
    for p in ("float16", "bfloat16"):
        diff = max(float(np.abs(a - b).max()) for a, b in zip(runs[p][1], runs["float32"][1]))
        assert 0 < diff < 0.1, (p, diff)


# -- loss scaling through the rewritten step ------------------------------------------------------------------------


def state_of(model, opt):
    """Model weights and the inner optimizer's slots (not its step counter, which counts skipped steps too)."""
    inner = [v for v in opt.inner_optimizer.variables if "iteration" not in v.name]
    return [v.numpy().copy() for v in list(model.weights) + inner]


def test_forced_overflow_skips_the_step_bit_identically_and_halves_the_scale():
    model = make_model("mlp")
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1, momentum=0.9), **ENABLE["float16"])
    step = make_train_step(model, opt)
    x, y = sum_sign_data(64, SHAPES["mlp"], 0)
    step(x, y)  # a finite step first, so the momentum slots hold something
    before, iterations = state_of(model, opt), int(opt.iterations.numpy())
    # A loss factor whose scaled gradients overflow float16 (max 65504) but not float32: only the rewrite overflows.
    factor = tf.constant(1e4)
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x)) * factor * opt.loss_scale
    assert all(np.all(np.isfinite(g.numpy())) for g in tape.gradient(loss, model.trainable_variables))
    step(x, y, factor)
    after = state_of(model, opt)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert opt.loss_scale.numpy() == 2.0**14 and opt.dynamic_counter.numpy() == 0
    assert opt.skipped_steps.numpy() == 1 and int(opt.iterations.numpy()) == iterations + 1


def test_scale_doubles_after_dynamic_growth_steps_finite_steps():
    model = make_model("mlp")
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1),
                                               loss_scale={"initial_scale": 4.0, "dynamic_growth_steps": 3},
                                               **ENABLE["float16"])
    step = make_train_step(model, opt)
    x, y = sum_sign_data(64, SHAPES["mlp"], 0)
    seen = []
    for _ in range(3):
        step(x, y)
        seen.append((float(opt.loss_scale.numpy()), int(opt.dynamic_counter.numpy())))
    assert seen == [(4.0, 1), (4.0, 2), (8.0, 0)]


def test_checkpoint_round_trip_restores_scale_and_counter(tmp_path):
    def make():
        model = make_model("mlp")
        opt = enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1, momentum=0.9), loss_scale={"initial_scale": 64.0, "dynamic_growth_steps": 3},
            **ENABLE["float16"])
        return model, opt, make_train_step(model, opt)

    model, opt, step = make()
    x, y = sum_sign_data(64, SHAPES["mlp"], 0)
    for factor in (1.0, 1e6, 1.0, 1.0):  # one skipped step: scale 32, then two finite steps: counter 2
        step(x, y, tf.constant(factor))
    assert opt.loss_scale.numpy() == 32.0 and opt.dynamic_counter.numpy() == 2
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
    model2, opt2, step2 = make()
    opt2.build(model2.trainable_variables)
    tf.train.Checkpoint(model=model2, optimizer=opt2).restore(path).assert_consumed()
    assert opt2.loss_scale.numpy() == 32.0 and opt2.dynamic_counter.numpy() == 2
    assert opt2.skipped_steps.numpy() == 1
    for a, b in zip(state_of(model, opt), state_of(model2, opt2)):
        np.testing.assert_array_equal(a, b)
    # Both continue identically through their (identically rewritten) steps; the third finite step grows the scale.
    step(x, y)
    step2(x, y)
    assert opt2.loss_scale.numpy() == 64.0 == opt.loss_scale.numpy()
    for a, b in zip(state_of(model, opt), state_of(model2, opt2)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def mirrored():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mirrored_script.py")
    root = os.path.dirname(os.path.dirname(script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT"):])


def test_mirrored_gradients_unscaled_per_replica_and_averaged(mirrored):
    loop = mirrored["loop"]
    assert mirrored["replicas"] == 2 and loop["half_functions"]
    for start, values, expected in zip(loop["start"], loop["finite"]["vars"], loop["expected"]):
        start, expected = np.array(start), np.array(expected)
        assert np.array_equal(values[0], values[1])
        # The float32 single-device update, within float16's precision (unscaled: not 1024x; averaged: not 2x).
        update, expected_update = np.array(values[0]) - start, expected - start
        assert np.linalg.norm(update - expected_update) <= 0.02 * np.linalg.norm(expected_update)


def test_mirrored_overflow_on_one_replica_skips_on_both(mirrored):
    loop = mirrored["loop"]
    assert loop["fp32_poisoned_finite"]  # the overflow only exists in the rewritten float16 graph
    assert loop["poisoned"]["vars"] == loop["finite"]["vars"]
    assert loop["poisoned"]["scale"] == loop["finite"]["scale"] / 2 == 512.0
    assert loop["poisoned"]["skipped"] == 1 and loop["poisoned"]["counter"] == 0


def test_mirrored_fit_skips_when_one_replica_overflows(mirrored):
    fit = mirrored["fit"]
    assert fit["half_functions"] and fit["unchanged"] and fit["skipped"] == 1 and fit["scale"] == 512.0


# -- the public API: options, errors, disable, context manager ------------------------------------------------------


def test_returns_a_dynamic_loss_scale_optimizer_for_float16():
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), device="cpu")
    assert isinstance(opt, LossScaleOptimizer) and opt.dynamic
    assert opt.initial_scale == 2.0**15 and opt.dynamic_growth_steps == 2000


@pytest.mark.parametrize("loss_scale, dynamic, scale", [(128, False, 128.0), ("dynamic", True, 2.0**15),
                                                        ({"initial_scale": 8.0}, True, 8.0)])
def test_loss_scale_argument(loss_scale, dynamic, scale):
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), loss_scale, device="cpu")
    assert opt.dynamic is dynamic and float(opt.loss_scale) == scale


def test_bfloat16_defaults_to_no_loss_scaling():
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), precision="bfloat16")
    assert isinstance(opt, LossScaleOptimizer) and not opt.dynamic and float(opt.loss_scale) == 1.0
    disable_mixed_precision_graph_rewrite()
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), "dynamic", precision="bfloat16")
    assert opt.dynamic


def test_bfloat16_on_a_cpu_defaults_to_the_cost_assignment(monkeypatch):
    monkeypatch.delenv(ASSIGN_ENV, raising=False)
    enable_graph_rewrite(precision="bfloat16")
    assert function_hook.active_options().assign == "cost"
    enable_graph_rewrite(precision="bfloat16", assign="lists")
    assert function_hook.active_options().assign == "lists"
    enable_graph_rewrite(**ENABLE["float16"])  # float16 on a CPU is emulated: Grappler's lists, as asked
    assert function_hook.active_options().assign == "lists"
    monkeypatch.setenv(ASSIGN_ENV, "lists")
    enable_graph_rewrite(precision="bfloat16")
    assert function_hook.active_options().assign == "lists"
    monkeypatch.setenv(ASSIGN_ENV, "fastest")
    with pytest.raises(OptionError, match="MP_REWRITE_ASSIGN='fastest' is not an assignment"):
        enable_graph_rewrite(precision="bfloat16")


@pytest.mark.skipif(NATIVE_BF16, reason="this CPU has bfloat16 units, so the default rewrites")
def test_without_bfloat16_units_the_default_keeps_float32_and_says_so_once(monkeypatch, caplog):
    monkeypatch.delenv(ASSIGN_ENV, raising=False)
    model = make_model("mlp")
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), precision="bfloat16")
        enable_graph_rewrite(precision="bfloat16")
    assert caplog.text.count("bfloat16 is slower than float32 there") == 1 and "assign='lists'" in caplog.text
    step = make_train_step(model, opt)
    x, y = sum_sign_data(64, SHAPES["mlp"], 0)
    assert np.isfinite(step(x, y).numpy())
    assert not ops_in(executed(cf_name(step, x, y)), BF16)


@pytest.mark.parametrize("make_opt, match", [
    (lambda: object(), "must be an instance"),
    (lambda: "sgd", "must be an instance"),
    (lambda: LossScaleOptimizer(keras.optimizers.SGD(0.1)), "must not already be"),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), "must not already be"),
])
def test_rejects_non_optimizers_and_wrapped_optimizers(make_opt, match):
    with pytest.raises(ValueError, match=match):
        enable_mixed_precision_graph_rewrite(make_opt(), device="cpu")
    assert not training.is_enabled() and not hook_installed()


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_rejects_a_mixed_keras_policy(policy):
    keras.mixed_precision.set_global_policy(policy)
    with pytest.raises(ValueError, match="global Keras dtype Policy has been set to a mixed precision policy"):
        enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), device="cpu")
    assert not training.is_enabled() and not hook_installed()


def test_rejects_a_mixed_tf_keras_policy():
    import tf_keras
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with pytest.raises(ValueError, match="global Keras dtype Policy has been set to a mixed precision policy"):
            enable_mixed_precision_graph_rewrite(tf_keras.optimizers.SGD(0.1), device="cpu")
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    assert not training.is_enabled() and not hook_installed()


def test_an_optimizer_is_required_as_in_tensorflow():
    with pytest.raises(ValueError, match='"opt" must be an instance of .* but got: None'):
        enable_mixed_precision_graph_rewrite(None)
    assert not training.is_enabled() and not hook_installed()


def test_bad_options():
    with pytest.raises(OptionError, match="precision"):
        enable_graph_rewrite(precision="int8")
    with pytest.raises(TypeError, match="keep_fp32"):
        enable_graph_rewrite(device="cpu", keep_fp23=["loss"])
    assert not training.is_enabled()


def test_a_mixed_policy_set_after_enabling_stops_the_rewrite(caplog):
    enable_graph_rewrite(**ENABLE["float16"])
    keras.mixed_precision.set_global_policy("mixed_float16")

    @tf.function
    def f(a):
        return tf.matmul(a, a)

    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        f(tf.ones([2, 2]))
    assert not rewritten_functions() and "cast twice" in caplog.text


def test_float16_without_a_gpu_warns_and_does_not_rewrite_by_default(caplog):
    assert not tf.config.list_physical_devices("GPU")
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
        enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    assert opt.dynamic and training.is_enabled() and not hook_installed()
    assert caplog.text.count("no GPU found") == 1 and "device='cpu'" in caplog.text

    @tf.function
    def f(a):
        return tf.matmul(a, a)

    f(tf.ones([2, 2]))
    assert not rewritten_functions()


def test_float16_on_cpu_warns_once_that_it_is_slow(caplog):
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        enable_graph_rewrite(device="cpu")
        enable_graph_rewrite(device="cpu")
    assert caplog.text.count("float16 on CPU") == 1 and "bfloat16" in caplog.text


def matmul_function():
    @tf.function
    def f(a):
        return tf.matmul(a, a)

    return f


A = tf.constant([[1.001, 2.0], [3.0, 4.0]])  # 1.001 is not exact in float16 or bfloat16, so results differ


def test_a_rewrite_swapped_in_later_reaches_the_functions_that_call_it():
    # The cost assignment decides after a step's first calls (training.deferred), when a caller -- Keras's train
    # function calls its step -- has already been instantiated with the lists' rewrite of the step.
    from mp_rewrite.training import deferred
    enable_graph_rewrite(**ENABLE["bfloat16"])
    inner = matmul_function()

    @tf.function
    def outer(a):
        return inner(a) + 1.0

    low, f32 = outer(A).numpy(), tf.matmul(A, A).numpy() + 1.0
    assert not np.array_equal(low, f32)
    name = cf_name(inner, A)
    assert function_hook.replace_rewrite(name, rewritten_functions()[name], function_hook.original_definition(name))
    assert np.array_equal(outer(A).numpy(), low)  # TF runs the caller as first instantiated ...
    deferred._register_callers_again(name)
    np.testing.assert_array_equal(outer(A).numpy(), f32)  # ... until it is registered again


def test_disable_restores_rewritten_functions_and_stops_new_traces(caplog):
    f32 = tf.matmul(A, A).numpy()
    enable_graph_rewrite(**ENABLE["float16"])
    f = matmul_function()
    assert not np.array_equal(f(A).numpy(), f32)
    name = cf_name(f, A)
    assert disable_mixed_precision_graph_rewrite() == [name]
    assert not ops_in(executed(name), HALF) and np.array_equal(f(A).numpy(), f32)
    g = matmul_function()
    assert np.array_equal(g(A).numpy(), f32) and not rewritten_functions() and not hook_installed()
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        disable_mixed_precision_graph_rewrite()
    assert "already disabled" in caplog.text


def test_disable_without_restore_keeps_functions_rewritten():
    enable_graph_rewrite(**ENABLE["float16"])
    f = matmul_function()
    f(A)
    assert disable_mixed_precision_graph_rewrite(restore=False) == []
    assert "MatMul" in ops_in(executed(cf_name(f, A)), HALF)


def test_context_manager_scopes_the_rewrite():
    f32 = tf.matmul(A, A).numpy()
    with mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **ENABLE["bfloat16"]) as opt:
        assert isinstance(opt, LossScaleOptimizer)
        f = matmul_function()
        inside = f(A).numpy()
        name = cf_name(f, A)
        assert "MatMul" in ops_in(executed(name), BF16)
        with mixed_precision_graph_rewrite(**ENABLE["float16"]):
            g = matmul_function()
            g(A)
            assert "MatMul" in ops_in(executed(cf_name(g, A)), HALF)
        assert not ops_in(executed(cf_name(g, A)), HALF)  # the inner block's function is restored ...
        assert "MatMul" in ops_in(executed(name), BF16)  # ... the outer block's is not, and its settings are back
        h = matmul_function()
        h(A)
        assert "MatMul" in ops_in(executed(cf_name(h, A)), BF16)
    assert not training.is_enabled() and not hook_installed()
    assert not np.array_equal(inside, f32) and np.array_equal(f(A).numpy(), f32)
    k = matmul_function()
    assert np.array_equal(k(A).numpy(), f32) and not ops_in(executed(cf_name(k, A)), BF16)


def test_functions_traced_before_enabling_are_named_or_rewritten(caplog):
    f = matmul_function()
    f(A)
    name = cf_name(f, A)
    with caplog.at_level(logging.WARNING, logger="mp_rewrite"):
        enable_graph_rewrite(**ENABLE["bfloat16"])
    assert name in caplog.text and "rewrite_existing=True" in caplog.text
    assert not ops_in(executed(name), BF16)
    enable_graph_rewrite(rewrite_existing=True, **ENABLE["bfloat16"])
    assert "MatMul" in ops_in(executed(name), BF16) and name in rewritten_functions()


def test_rewrites_made_inside_training_are_dumped(monkeypatch, tmp_path):
    monkeypatch.setenv("MP_REWRITE_DUMP_DIR", str(tmp_path))
    model = make_model("mlp")
    step = make_train_step(model, enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1),
                                                                       **ENABLE["bfloat16"]))
    x, y = sum_sign_data(32, SHAPES["mlp"], 0)
    step(x, y)
    name = cf_name(step, x, y)
    assert any(name.strip("_") in f for f in os.listdir(tmp_path)), os.listdir(tmp_path)


def test_tf_cpu_emulation_variable_gives_an_emulated_step(monkeypatch):
    # TF's auto_mixed_precision_cpu reads this variable: matmuls stay float32 between float16 round-trip Casts.
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16", "1")
    model = make_model("mlp")
    opt = enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), **ENABLE["float16"])
    step = make_train_step(model, opt)
    x, y = sum_sign_data(64, SHAPES["mlp"], 0)
    assert np.isfinite(step(x, y).numpy())
    name = cf_name(step, x, y)
    fdef = executed(name)
    assert name in rewritten_functions() and rewritten_functions()[name].emulated
    assert "MatMul" in ops_in(fdef, FLOAT) and not ops_in(fdef, HALF) - {"Cast"}
    assert any(n.op == "Cast" and n.attr["DstT"].type == HALF for n in fdef.node_def)
