"""Keras 3's LossScaleOptimizer test suite, ported to run against `mp_rewrite.LossScaleOptimizer`.

Source: keras-team/keras, `keras/src/optimizers/loss_scale_optimizer_test.py` (Keras 3.15, shipped in the venv).
The assertions are kept; `LossScaleOptimizer` is ours, wrapping Keras 3's `SGD`, and `self.assert*` became plain
asserts. `test_config` uses Keras's own `run_class_serialization_test`.

Not applicable, with the reason:
- the `stateless` variants (test_finite_step, test_infinite_step, ...): `stateless_apply` is JAX-only; Keras
  itself skips them on the TensorFlow backend, which is the only backend mp_rewrite supports.

Recorded difference:
- test_init_dynamic_arg: Keras 3 refuses `dynamic=False` ("set `loss_scale_factor` on the inner optimizer").
  mp_rewrite accepts `dynamic=False` with an `initial_scale` (tf_keras's API, and the fixed scales of
  `enable_mixed_precision_graph_rewrite(opt, loss_scale=128)` need it); without one it raises tf_keras's ValueError,
  which also names Keras 3's `loss_scale_factor`. The second half of the test asserts what mp_rewrite does.
"""

import numpy as np
import pytest
from keras.src import backend, ops, testing
from keras.src.optimizers.sgd import SGD

from mp_rewrite import LossScaleOptimizer


def assert_all_close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-4, atol=1e-4)


def test_config():
    inner_optimizer = SGD(learning_rate=0.5, momentum=0.06, nesterov=True, weight_decay=0.004)
    optimizer = LossScaleOptimizer(inner_optimizer)
    testing.TestCase("run_class_serialization_test").run_class_serialization_test(optimizer)


def test_apply_with_no_vars():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5))
    grads = [ops.array([1.0, 6.0, 7.0, 2.0]) * optimizer.initial_scale]
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.build(vars)
    optimizer.apply(grads)
    assert_all_close(vars[0], [0.5, -1.0, -0.5, 3.0])


def test_finite_step():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5))
    grads = [ops.array([1.0, 6.0, 7.0, 2.0]) * optimizer.initial_scale]
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.apply(grads, vars)
    assert_all_close(vars[0], [0.5, -1.0, -0.5, 3.0])


def test_finite_step_with_inner_loss_scale():
    # The inner loss scale does not interfere with the update.
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5, loss_scale_factor=100))
    grads = [ops.array([1.0, 6.0, 7.0, 2.0]) * optimizer.initial_scale]
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.apply(grads, vars)
    assert_all_close(vars[0], [0.5, -1.0, -0.5, 3.0])


def test_infinite_step():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5))
    grads = [ops.array([np.inf, np.inf, np.inf, np.inf])]
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.apply(grads, vars)
    assert_all_close(vars[0], [1.0, 2.0, 3.0, 4.0])


def test_finite_step_with_overwrite():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5))
    grads = [ops.array([1.0, 6.0, 7.0, 2.0])]
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    vars[0].overwrite_with_gradient = True
    optimizer.apply(grads, vars)
    assert_all_close(vars[0], grads[0])


def test_downscaling():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5), initial_scale=400.0)
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.build(vars)
    grads = [ops.array([np.inf, np.inf, np.inf, np.inf])]
    for _ in range(4):
        optimizer.apply(grads, vars)
    assert_all_close(optimizer.scale_loss(1.0), 25.0)


def test_upscaling():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5), initial_scale=2.0, dynamic_growth_steps=2)
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.build(vars)
    grads = [ops.array([1.0, 6.0, 7.0, 2.0])]
    for _ in range(8):
        optimizer.apply(grads, vars)
    assert_all_close(optimizer.scale_loss(1.0), 32.0)


def test_iterations_update():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5))
    vars = [backend.Variable([1.0, 2.0, 3.0, 4.0])]
    optimizer.build(vars)
    grads = [ops.array([1.0, 6.0, 7.0, 2.0])]
    assert optimizer.iterations.value == 0
    for i in range(3):
        optimizer.apply(grads, vars)
        assert optimizer.iterations.value == i + 1


def test_serialization():
    optimizer = LossScaleOptimizer(SGD(learning_rate=0.5), initial_scale=3.0, dynamic_growth_steps=2,
                                   name="test_opt")
    config = optimizer.get_config()
    assert len(config) == 4
    assert config["name"] == "test_opt"
    assert config["initial_scale"] == 3.0
    assert config["dynamic_growth_steps"] == 2
    assert "inner_optimizer" in config
    LossScaleOptimizer.from_config(config)


def test_init_dynamic_arg():
    inner_optimizer = SGD(learning_rate=0.5)
    # dynamic=True is supported
    LossScaleOptimizer(inner_optimizer, dynamic=True)
    # dynamic=False without a scale is refused, and the message points Keras 3 users to `loss_scale_factor`.
    with pytest.raises(ValueError, match="set `loss_scale_factor`"):
        LossScaleOptimizer(inner_optimizer, dynamic=False)
    # Recorded difference: a fixed scale is accepted (tf_keras's API; the graph rewrite's fixed scales need it).
    fixed = LossScaleOptimizer(SGD(learning_rate=0.5), dynamic=False, initial_scale=8.0)
    assert not fixed.dynamic and float(fixed.scale_loss(1.0)) == 8.0


def test_init_unsupported_arg():
    inner_optimizer = SGD(learning_rate=0.5)
    with pytest.raises(ValueError, match="arguments: `foo`, `bar`"):
        LossScaleOptimizer(inner_optimizer, foo=True, bar=3)


@pytest.mark.parametrize("arg_name,arg_value", [
    ("weight_decay", 0.5), ("clipnorm", 0.5), ("global_clipnorm", 0.5), ("clipvalue", 0.5), ("use_ema", True),
    ("ema_momentum", 0.5), ("ema_overwrite_frequency", 2), ("loss_scale_factor", 0.5),
    ("gradient_accumulation_steps", 2)])
def test_init_base_optimizer_unsupported_args(arg_name, arg_value):
    inner_optimizer = SGD(learning_rate=0.5)
    with pytest.raises(ValueError, match="on the `inner_optimizer`"):
        LossScaleOptimizer(inner_optimizer, **{arg_name: arg_value})


def test_deserialization_backwards_compatibility():
    # A config with all the base optimizer arguments that are no longer serialized.
    base = {"weight_decay": None, "clipnorm": None, "global_clipnorm": None, "clipvalue": None, "use_ema": False,
            "ema_momentum": 0.99, "ema_overwrite_frequency": None, "loss_scale_factor": None,
            "gradient_accumulation_steps": None}
    config = {
        "name": "loss_scale_optimizer", **base,
        "inner_optimizer": {"module": "keras.optimizers", "class_name": "SGD",
                            "config": {"name": "SGD", "learning_rate": 0.5, **base, "momentum": 0.0,
                                       "nesterov": False},
                            "registered_name": None},
        "initial_scale": 2.0,
        "dynamic_growth_steps": 2,
    }
    LossScaleOptimizer.from_config(config)
