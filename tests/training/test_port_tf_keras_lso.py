"""tf_keras's LossScaleOptimizer test suite, ported to run against `mp_rewrite.LossScaleOptimizer`.

Source: keras-team/tf-keras, `tf_keras/mixed_precision/loss_scale_optimizer_test.py` (TF 2.21 era). The assertions
are kept; only the harness changed: `test_combinations` became pytest parameters, `self.evaluate` reads values
eagerly, `strategy.experimental_run` is `strategy.run`, `create_lso` builds an `mp_rewrite.LossScaleOptimizer`
around a real tf_keras optimizer (legacy `OptimizerV2` or the new `tf_keras.optimizers.Optimizer`), and the
`tf_logging.warning` mock became a real log handler (no mocks of TensorFlow in this project).

Adapted, with the reason:
- TF1 graph mode (`mode="graph"`, sessions, `global_variables_initializer`): the wrapper is a Keras 3 optimizer,
  which runs eagerly or inside `tf.function`. Legacy-optimizer cases run eagerly; testFixedLossScaleAppliedToLoss-
  WithGetGradients (graph-only in tf_keras, because `get_gradients` needs a graph) runs inside a `tf.function`.
- testIsInstance: tf_keras asserts `isinstance(opt, tf_keras...BaseLossScaleOptimizer)`; a class that is not
  tf_keras's cannot pass that. Asserted against `mp_rewrite.LossScaleOptimizer` and Keras 3's base class instead.
- testSerializationWithBuiltInOptimizer/WithCustomOptimizer: tf_keras's `optimizers.serialize/deserialize` would
  rebuild tf_keras's own class; the port uses Keras's `serialize_keras_object`/`deserialize_keras_object`, which
  rebuild ours (registered as "mp_rewrite>LossScaleOptimizer") and the tf_keras inner optimizer.

Not applicable, with the reason:
- testNanOnOneReplicaOnly: needs a GPU (a second replica); covered with two logical CPUs in test_loss_scale.py
  (test_mirrored_overflow_on_one_replica_skips_on_both).
- the `lso_type="v1"` case of testSerializationWithBuiltInOptimizer: the class name "LossScaleOptimizerV1" is
  tf_keras's registry entry for its own class, not a name a Keras 3 config of this class can carry.
- testConvertToLegacyOptimizer: `tf_keras.optimizers.convert_to_legacy_optimizer` accepts only tf_keras's own
  classes (it raises for any other optimizer).
- testErrorWhenV3LsoWrapsV2Optimizer / testErrorWhenV2LsoWrapsV3Optimizer: tf_keras has one class per optimizer
  family; `mp_rewrite.LossScaleOptimizer` is one class that wraps both families.
- the Mirrored cases of testCheckpoint in graph mode: skipped by tf_keras itself (b/121381184).
"""

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

tf_keras = pytest.importorskip("tf_keras")

from tf_keras.src.mixed_precision import test_util as mp_test_util  # noqa: E402  (after importorskip)

from mp_rewrite import LossScaleOptimizer  # noqa: E402

LEGACY, V3 = "legacy", "v3"


def default_strategy_fn():
    return tf.distribute.get_strategy()


def create_mirrored_strategy():
    return tf.distribute.MirroredStrategy(["cpu:0"])


STRATEGY_FNS = [default_strategy_fn, create_mirrored_strategy]


def create_sgd(opt_cls, *args, **kwargs):
    if opt_cls == LEGACY:
        return tf_keras.optimizers.legacy.SGD(*args, **kwargs)
    return tf_keras.optimizers.SGD(*args, **kwargs)


def sgd_class(opt_cls):
    return tf_keras.optimizers.legacy.SGD if opt_cls == LEGACY else tf_keras.optimizers.SGD


def base_class(opt_cls):
    return tf_keras.optimizers.legacy.Optimizer if opt_cls == LEGACY else tf_keras.optimizers.Optimizer


def create_lso(inner_optimizer, dynamic=True, initial_scale=None, dynamic_growth_steps=None):
    return LossScaleOptimizer(inner_optimizer, dynamic=dynamic, initial_scale=initial_scale,
                              dynamic_growth_steps=dynamic_growth_steps)


# opt_and_strategy_and_mode_combinations(): the new optimizer with and without tf.function, the legacy one eagerly.
COMBINATIONS = [pytest.param(V3, s, f, id=f"v3-{s.__name__}-{'fn' if f else 'eager'}")
                for s in STRATEGY_FNS for f in (False, True)] + [
    pytest.param(LEGACY, s, False, id=f"legacy-{s.__name__}") for s in STRATEGY_FNS]
OPT_CLASSES = [LEGACY, V3]


def evaluate(value):
    if isinstance(value, (list, tuple)):
        return [evaluate(v) for v in value]
    return value.numpy() if hasattr(value, "numpy") else value


def run_fn_with_grad_check(strategy, var, opt, expected_grad):
    grad_check_fn = mp_test_util.create_identity_with_grad_check_fn(expected_grad)
    loss = lambda: grad_check_fn(var) / strategy.num_replicas_in_sync  # noqa: E731
    return lambda: opt.minimize(loss, var_list=[var])


@pytest.fixture
def tf_warnings():
    """The messages tf_logging.warning emits while the test runs (a real handler on TF's logger)."""
    records = []

    class Handler(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, tf_logger = Handler(logging.WARNING), tf.get_logger()
    tf_logger.addHandler(handler)
    yield records
    tf_logger.removeHandler(handler)


def test_is_instance():
    for inner in (tf_keras.optimizers.SGD(), tf_keras.optimizers.legacy.SGD()):
        optimizer = create_lso(inner)
        assert isinstance(optimizer, LossScaleOptimizer)
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
def test_fixed_loss_scale_applied_to_loss_with_minimize(opt_cls, strategy_fn, use_tf_function):
    with strategy_fn().scope() as strategy:
        var = tf.Variable([5.0])
        opt = create_sgd(opt_cls, 2.0)
        loss_scale = 10.0
        opt = create_lso(opt, dynamic=False, initial_scale=loss_scale)
        assert evaluate(opt.loss_scale) == loss_scale
        assert isinstance(opt.loss_scale, tf.Tensor)
        assert loss_scale % strategy.num_replicas_in_sync == 0
        run_fn = run_fn_with_grad_check(strategy, var, opt, loss_scale / strategy.num_replicas_in_sync)
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        np.testing.assert_allclose([3.0], evaluate(var))


def test_fixed_loss_scale_applied_to_loss_with_get_gradients():
    var = tf.Variable([2.0])
    opt = tf_keras.optimizers.legacy.SGD(1.0)
    loss_scale = 10.0
    opt = LossScaleOptimizer(opt, dynamic=False, initial_scale=loss_scale)
    grad_check_fn = mp_test_util.create_identity_with_grad_check_fn(loss_scale)

    @tf.function  # tf_keras runs this in a TF1 graph: get_gradients needs one
    def run_op():
        loss = grad_check_fn(var)
        return opt.get_gradients(loss, [var])

    # The assertion op that create_identity_with_grad_check_fn added runs here.
    (grad,) = run_op()
    np.testing.assert_allclose(evaluate(grad), [1.0])


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_dynamic_attrs_with_fixed_loss_scale(opt_cls):
    opt = create_lso(create_sgd(opt_cls), dynamic=False, initial_scale=2.0)
    assert not opt.dynamic
    assert opt.dynamic_counter is None
    assert opt.dynamic_growth_steps is None


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_get_scaled_loss(opt_cls):
    opt = create_lso(create_sgd(opt_cls), dynamic=False, initial_scale=2.0)
    loss = tf.convert_to_tensor(5.0)
    assert evaluate(opt.get_scaled_loss(loss)) == 10.0
    assert evaluate(opt.get_scaled_loss(lambda: loss)()) == 10.0
    loss = tf.convert_to_tensor(5.0, dtype="float16")
    assert evaluate(opt.get_scaled_loss(loss)) == 10.0
    assert evaluate(opt.get_scaled_loss(lambda: loss)()) == 10.0


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_get_unscaled_gradients(opt_cls):
    opt = create_lso(create_sgd(opt_cls), dynamic=False, initial_scale=2)
    scaled_grads = [tf.convert_to_tensor(3.0), None, tf.convert_to_tensor(-4.0, dtype="float16")]
    grads = opt.get_unscaled_gradients(scaled_grads)
    grads = [evaluate(g) if g is not None else g for g in grads]
    assert grads == [1.5, None, -2.0]


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_get_unscaled_sparse_gradients(opt_cls):
    opt = create_lso(create_sgd(opt_cls), dynamic=False, initial_scale=2)
    sparse_scaled_grad = tf.IndexedSlices(
        tf.convert_to_tensor([[4.0, 2.0], [8.0, 5.0]]), tf.convert_to_tensor([1, 3], dtype="int32"),
        dense_shape=tf.convert_to_tensor([5, 2], dtype="int32"))
    sparse_grad = opt.get_unscaled_gradients([sparse_scaled_grad])[0]
    assert isinstance(sparse_grad, tf.IndexedSlices)
    np.testing.assert_array_equal([[2.0, 1.0], [4.0, 2.5]], evaluate(sparse_grad.values))


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
def test_dynamic_loss_scale(opt_cls, strategy_fn, use_tf_function):
    strategy = strategy_fn()
    learning_rate = 2.0
    expected_gradient = tf.Variable(learning_rate / strategy.num_replicas_in_sync)
    with strategy.scope():
        var = tf.Variable([5.0])
        opt = create_lso(create_sgd(opt_cls, learning_rate), initial_scale=2, dynamic_growth_steps=1)
        assert opt.initial_scale == 2.0
        assert isinstance(opt.initial_scale, float)
        assert opt.dynamic_growth_steps == 1
        assert isinstance(opt.dynamic_growth_steps, int)
        assert opt.initial_scale % strategy.num_replicas_in_sync == 0
        run_fn = run_fn_with_grad_check(strategy, var, opt, expected_gradient)
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        np.testing.assert_allclose([3.0], evaluate(var))
        # The loss scale doubled, so the expected gradient doubles too.
        expected_gradient.assign(2 * learning_rate / strategy.num_replicas_in_sync)
        strategy.run(run_fn)
        np.testing.assert_allclose([1.0], evaluate(var))


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_dynamic_loss_scale_default_values(opt_cls):
    opt = create_lso(create_sgd(opt_cls))
    assert opt.initial_scale == 2**15
    assert opt.dynamic_growth_steps == 2000
    assert evaluate(opt.loss_scale) == 2**15


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
@pytest.mark.parametrize("clip_type", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping(opt_cls, strategy_fn, use_tf_function, clip_type):
    strategy = strategy_fn()
    learning_rate = 2.0
    with strategy.scope():
        var = tf.Variable([5.0])
        opt = create_sgd(opt_cls, learning_rate, **{clip_type: 2.0})
        opt = create_lso(opt, initial_scale=2, dynamic_growth_steps=1)
        if opt_cls == LEGACY:
            assert getattr(opt, clip_type) == 2.0  # only OptimizerV2 exposes the clipping attributes
        assert opt.initial_scale % strategy.num_replicas_in_sync == 0
        loss = lambda: var * 4 / strategy.num_replicas_in_sync  # noqa: E731
        run_fn = lambda: opt.minimize(loss, var_list=[var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        # The gradient is 4 but is clipped to 2: 5 - 2 * 2 == 1
        np.testing.assert_allclose([1.0], evaluate(var))
        assert evaluate(opt.loss_scale) == 4
        if opt_cls == V3:
            return  # the new optimizer does not expose the clipping attributes
        setattr(opt, clip_type, 3.0)
        strategy.run(run_fn)
        # The gradient is 4 but is clipped to 3: 1 - 3 * 2 == -5
        np.testing.assert_allclose([-5.0], evaluate(var))
        assert evaluate(opt.loss_scale) == 8
        # Inf gradients are still skipped instead of being clipped
        loss = lambda: var * float("Inf")  # noqa: E731
        run_fn = lambda: opt.minimize(loss, var_list=[var])  # noqa: E731
        strategy.run(run_fn)
        np.testing.assert_allclose([-5.0], evaluate(var))
        assert evaluate(opt.loss_scale) == 4


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
def test_dynamic_update(opt_cls, strategy_fn, use_tf_function):
    with strategy_fn().scope() as strategy:
        var = tf.Variable([1.0, 2.0])
        opt = create_lso(create_sgd(opt_cls, 1.0), initial_scale=2, dynamic_growth_steps=1)
        loss = lambda: var * 2.0 / strategy.num_replicas_in_sync  # noqa: E731
        run_fn = lambda: opt.minimize(loss, var_list=[var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        np.testing.assert_allclose([-1.0, 0.0], evaluate(var))  # gradient 2 subtracted
        assert evaluate(opt.loss_scale) == 4.0  # doubled from 2 to 4
        loss = lambda: var * float("NaN")  # noqa: E731
        run_fn = lambda: opt.minimize(loss, var_list=[var])  # noqa: E731
        strategy.run(run_fn)
        np.testing.assert_allclose(evaluate(var), [-1.0, 0.0])  # NaN gradients: unchanged
        assert evaluate(opt.loss_scale) == 2.0  # halved


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
def test_dynamic_loss_scale_with_float16_loss(opt_cls, strategy_fn, use_tf_function):
    strategy = strategy_fn()
    with strategy.scope():
        var = tf.Variable([5.0])
        opt = create_lso(create_sgd(opt_cls, 2.0), initial_scale=2, dynamic_growth_steps=1)

        def loss():
            return tf.cast(var / strategy.num_replicas_in_sync, "float16")

        run_fn = lambda: opt.minimize(loss, var_list=[var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        np.testing.assert_allclose([3.0], evaluate(var))


def test_custom_aggregater():
    def gradient_aggregator(grads_and_vars):
        # Simulate an all-reduce where a replica has a NaN gradient by setting the last gradient to NaN
        grads_and_vars = list(grads_and_vars)
        last_grad, last_var = grads_and_vars[-1]
        grads_and_vars[-1] = (last_grad * float("NaN"), last_var)
        return grads_and_vars

    var = tf.Variable([1.0, 2.0])
    opt = tf_keras.optimizers.legacy.SGD(1.0, gradient_aggregator=gradient_aggregator)
    opt = LossScaleOptimizer(opt, initial_scale=2, dynamic_growth_steps=2)
    opt.minimize(lambda: var * 2, var_list=[var])
    np.testing.assert_allclose(evaluate(var), [1.0, 2.0])  # NaN gradients: unchanged
    assert evaluate(opt.loss_scale) == 1.0  # halved


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
def test_dynamic_loss_scale_with_slots(opt_cls, strategy_fn, use_tf_function):
    with strategy_fn().scope() as strategy:
        var = tf.Variable([1.0, 2.0])
        opt = create_sgd(opt_cls, 1.0, momentum=1.0)  # SGD with momentum has slot variables
        initial_scale = 2.0
        opt = create_lso(opt, initial_scale=initial_scale, dynamic_growth_steps=1)
        loss = lambda: var / strategy.num_replicas_in_sync  # noqa: E731
        run_fn = lambda: opt.minimize(loss, var_list=[var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        # The accumulator goes 0 -> 1 (the gradient), and is subtracted from the variable.
        np.testing.assert_allclose([0.0, 1.0], evaluate(var))
        assert evaluate(opt.loss_scale) == initial_scale * 2
        strategy.run(run_fn)
        # The accumulator goes 1 -> 2.
        np.testing.assert_allclose([-2.0, -1.0], evaluate(var))
        assert evaluate(opt.loss_scale) == initial_scale * 4
        if opt_cls == LEGACY:
            assert opt.get_slot_names() == ["momentum"]


def test_iterations():
    opt = tf_keras.optimizers.legacy.SGD(2.0)
    lso = LossScaleOptimizer(opt, dynamic=False, initial_scale=10.0)
    lso.iterations = 7
    assert lso.iterations == 7
    assert opt.iterations == 7


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function", COMBINATIONS)
def test_iterations_incremented(opt_cls, strategy_fn, use_tf_function):
    with strategy_fn().scope() as strategy:
        opt = create_lso(create_sgd(opt_cls, 1.0))
        var = tf.Variable([5.0])
        loss = lambda: var * 2.0 / strategy.num_replicas_in_sync  # noqa: E731
        run_fn = lambda: opt.minimize(loss, [var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        assert evaluate(var) == 3.0  # grad is 2, so var is 5 - 2
        assert evaluate(opt.iterations) == 1
        # iterations is incremented even if gradients are not applied due to NaN gradients.
        loss = lambda: var * float("NaN")  # noqa: E731
        run_fn = lambda: opt.minimize(loss, [var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        assert evaluate(var) == 3.0
        assert evaluate(opt.iterations) == 2


def test_weight_methods():
    var = tf.Variable([1.0])
    opt = tf_keras.optimizers.legacy.SGD(1.0)
    opt = LossScaleOptimizer(opt, initial_scale=2.0, dynamic_growth_steps=1)
    opt.minimize(lambda: var * 2, [var])
    assert len(opt.weights) == 1  # the 'iterations' weight
    assert evaluate(opt.weights[0]) == 1
    assert opt.get_weights()[0] == 1
    assert evaluate(opt.variables()[0]) == 1
    opt.set_weights([np.array(2.0)])
    assert evaluate(opt.variables()[0]) == 2


def test_hyper_parameters_exposed_lso_v3():
    opt = tf_keras.optimizers.Adam(learning_rate=1.0, beta_1=0.5, beta_2=0.9)
    lso = LossScaleOptimizer(opt)
    lso.learning_rate = tf.Variable(0.005)
    np.testing.assert_allclose(evaluate(lso.learning_rate), 0.005)
    assert lso.learning_rate is opt.learning_rate
    lso.use_ema = True
    assert lso.use_ema is True
    assert opt.use_ema is True
    lso.ema_momentum = 0.88
    assert lso.ema_momentum == 0.88
    assert opt.ema_momentum == 0.88


def test_hyper_parameters_exposed():
    opt = tf_keras.optimizers.legacy.Adam(learning_rate=1.0, beta_1=0.5, beta_2=0.9)
    lso = LossScaleOptimizer(opt)
    opt.lr  # force the hyperparameters to be created
    assert evaluate(lso.beta_1) == 0.5
    assert isinstance(lso.beta_1, tf.Variable)
    assert evaluate(lso.lr) == 1.0
    assert lso.lr is opt.lr
    assert lso.lr is lso.learning_rate
    lso.beta_1 = 0.25
    assert evaluate(lso.beta_1) == 0.25
    assert evaluate(opt.beta_1) == 0.25
    assert lso.beta_1 is opt.beta_1
    opt.beta_1 = 0.75
    assert evaluate(lso.beta_1) == 0.75
    assert evaluate(opt.beta_1) == 0.75
    assert lso.beta_1 is opt.beta_1
    lso.lr = 2.0
    assert evaluate(lso.lr) == 2.0
    assert evaluate(lso.learning_rate) == 2.0
    assert evaluate(opt.lr) == 2.0
    assert evaluate(opt.learning_rate) == 2.0
    assert lso.lr is opt.lr

    # An attribute of the LossScaleOptimizer that is also a hyperparameter of the wrapped optimizer.
    class MyOpt(tf_keras.optimizers.legacy.SGD):
        def __init__(self):
            super().__init__()
            self._set_hyper("loss_scale", 123.0)

    lso = LossScaleOptimizer(MyOpt())
    with pytest.raises(AttributeError):
        lso.loss_scale = 2.0


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_arbitrary_attributes_not_exposed(opt_cls):
    opt = create_sgd(opt_cls)
    lso = create_lso(opt)
    assert not opt.nesterov
    with pytest.raises(AttributeError, match="'LossScaleOptimizer(V3)?' object has no attribute 'nesterov'"):
        lso.nesterov
    lso.nesterov = True
    assert lso.nesterov
    assert not opt.nesterov


def test_dir():
    lso = LossScaleOptimizer(tf_keras.optimizers.legacy.SGD())
    dir_result = dir(lso)
    assert "learning_rate" in dir_result  # hyperparameter
    assert "lr" in dir_result  # hyperparameter
    assert "minimize" in dir_result  # attribute
    assert "loss_scale" in dir_result  # attribute
    assert "nesterov" not in dir_result  # attribute on the inner optimizer
    assert "nesterov" in dir(lso.inner_optimizer)


def test_apply_gradients_gets_unwrapped_tensors():
    # The gradients passed to the inner apply_gradients are raw Tensors, not PerReplica values: optimizer
    # subclasses that override apply_gradients expect raw Tensors.
    seen = []

    class MyOptimizer(tf_keras.optimizers.legacy.SGD):
        def apply_gradients(self, grads_and_vars, name=None, experimental_aggregate_gradients=True):
            grads_and_vars = list(grads_and_vars)
            seen.extend(isinstance(grad, tf.Tensor) for grad, _ in grads_and_vars)
            return super().apply_gradients(grads_and_vars, name, experimental_aggregate_gradients)

    with create_mirrored_strategy().scope() as strategy:
        var = tf.Variable([5.0])
        opt = LossScaleOptimizer(MyOptimizer(learning_rate=1.0), dynamic=False, initial_scale=1)
        strategy.run(lambda: opt.minimize(lambda: var * 2.0, [var]))
    assert seen and all(seen)


@pytest.mark.parametrize("use_tf_function", [False, True])
def test_apply_gradients_gets_unwrapped_tensors_with_new_optimizer(use_tf_function):
    seen = []

    class MyOptimizer(tf_keras.optimizers.SGD):
        def apply_gradients(self, grads_and_vars, skip_gradients_aggregation=False,
                            experimental_aggregate_gradients=True):
            grads_and_vars = list(grads_and_vars)
            seen.extend(isinstance(grad, tf.Tensor) for grad, _ in grads_and_vars)
            return super().apply_gradients(grads_and_vars, skip_gradients_aggregation=skip_gradients_aggregation)

    with create_mirrored_strategy().scope() as strategy:
        var = tf.Variable([5.0])
        opt = LossScaleOptimizer(MyOptimizer(learning_rate=1.0), dynamic=False, initial_scale=1)
        run_fn = lambda: opt.minimize(lambda: var * 2.0, [var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
    assert seen and all(seen)


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_loss_scale_delegation_with_wrapper(opt_cls):
    # learning_rate is exposed when the LossScaleOptimizer wraps another wrapper.
    class MyOptimizer(base_class(opt_cls)):
        def __init__(self):
            super().__init__("MyOptimizer")
            self.inner_optimizer = create_sgd(opt_cls, learning_rate=1.0)

        @property
        def learning_rate(self):
            return self.inner_optimizer.learning_rate

        @learning_rate.setter
        def learning_rate(self, value):
            self.inner_optimizer.learning_rate = value

        def get_config(self):
            return {}

    opt = create_lso(MyOptimizer())
    opt.learning_rate  # force the hyperparameters to be created
    assert evaluate(opt.learning_rate) == 1.0
    assert evaluate(opt.inner_optimizer.inner_optimizer.learning_rate) == 1.0
    opt.learning_rate = 2.0
    assert evaluate(opt.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.inner_optimizer.learning_rate) == 2.0


CHECKPOINT_COMBINATIONS = [
    pytest.param(c, s, f, save, restore, id=f"{c}-{s.__name__}-{'fn' if f else 'eager'}-save{save:d}-restore{restore:d}")
    for c, fns in ((LEGACY, (False,)), (V3, (False, True)))
    for s in STRATEGY_FNS for f in fns
    for save, restore in ((False, True), (True, False), (True, True))]


@pytest.mark.parametrize("opt_cls,strategy_fn,use_tf_function,save_with_ls,restore_with_ls",
                         CHECKPOINT_COMBINATIONS)
def test_checkpoint(tmp_path, opt_cls, strategy_fn, use_tf_function, save_with_ls, restore_with_ls):
    class MySGD(sgd_class(opt_cls)):
        """A custom optimizer that tracks an extra variable."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.my_var = tf.Variable(0.0)
            self._track_trackable(self.my_var, "my_var")

    strategy = strategy_fn()
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        # Build and run a simple model.
        var = tf.Variable([2.0])
        opt = inner_opt = MySGD(1.0, momentum=1.0)
        if save_with_ls:
            opt = create_lso(opt, initial_scale=1.0, dynamic_growth_steps=2.0)
        run_fn = lambda: opt.minimize(lambda: var / replicas + 1.0, var_list=[var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        assert evaluate(var) == 1.0
        if save_with_ls:
            assert evaluate(opt.loss_scale) == 1.0
            assert evaluate(opt.dynamic_counter) == 1
        if opt_cls == LEGACY:
            slot_var = opt.get_slot(var, "momentum")
            assert evaluate(slot_var).item() == -1
        assert evaluate(opt.iterations) == 1
        # Arbitrary optimizer attributes are saved and restored.
        inner_opt.my_var.assign(1.0)
        checkpoint = tf.train.Checkpoint(optimizer=opt, var=var)
        save_path = checkpoint.save(os.path.join(tmp_path, "ckpt"))

        # A new model, restored.
        var = tf.Variable([2.0])
        opt = inner_opt = MySGD(1.0, momentum=1.0)
        if restore_with_ls:
            opt = create_lso(opt, initial_scale=1.0, dynamic_growth_steps=2.0)
        checkpoint = tf.train.Checkpoint(optimizer=opt, var=var)
        status = checkpoint.restore(save_path)
        if save_with_ls:
            status.assert_existing_objects_matched()
        else:
            status.assert_nontrivial_match()
        assert evaluate(var) == 1.0
        if save_with_ls and restore_with_ls:
            assert evaluate(opt.loss_scale) == 1.0
            assert evaluate(opt.dynamic_counter) == 1
        elif restore_with_ls:
            assert evaluate(opt.loss_scale) == 1.0
            assert evaluate(opt.dynamic_counter) == 0
        assert evaluate(opt.iterations) == 1

        # Run the model again.
        run_fn = lambda: opt.minimize(lambda: var / replicas + 1.0, var_list=[var])  # noqa: E731
        if use_tf_function:
            run_fn = tf.function(run_fn)
        strategy.run(run_fn)
        status.run_restore_ops()
        assert evaluate(var) == -1
        if opt_cls == LEGACY:
            slot_var = opt.get_slot(var, "momentum")
            assert evaluate(slot_var).item() == -2
        assert evaluate(opt.iterations) == 2
        assert evaluate(inner_opt.my_var) == 1

        # Restore again, after the slots exist.
        status = checkpoint.restore(save_path)
        if save_with_ls and restore_with_ls:
            status.assert_consumed()
        elif save_with_ls:
            status.assert_existing_objects_matched()
        elif restore_with_ls:
            status.assert_nontrivial_match()
        status.run_restore_ops()
        assert evaluate(var) == 1
        if opt_cls == LEGACY:
            assert evaluate(slot_var).item() == -1


TF_2_3_SGD = {"class_name": "SGD", "config": {"learning_rate": 2.0, "momentum": 0.5, "decay": 0.0,
                                              "nesterov": False, "name": "SGD"}}


def config_round_trip(config_version, **lso_kwargs):
    if config_version == "v2":
        opt = LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(2.0, momentum=0.5), **lso_kwargs)
    elif config_version == "v3":
        opt = LossScaleOptimizer(tf_keras.optimizers.SGD(2.0, momentum=0.5), **lso_kwargs)
    else:
        return None
    return LossScaleOptimizer.from_config(opt.get_config())


def check_usable(opt):
    var = tf.Variable([5.0])
    run_fn_with_grad_check(tf.distribute.get_strategy(), var, opt, 2)()
    assert evaluate(var) == [3.0]


@pytest.mark.parametrize("config_version", ["v2", "tf2_3", "v3"])
def test_get_config_fixed(config_version):
    opt = config_round_trip(config_version, dynamic=False, initial_scale=2)
    if opt is None:
        config = {"optimizer": TF_2_3_SGD,
                  "loss_scale": {"class_name": "FixedLossScale", "config": {"loss_scale_value": 2.0}}}
        opt = LossScaleOptimizer.from_config(config)
    opt.learning_rate  # force the hyperparameters to be created
    assert evaluate(opt.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.momentum) == 0.5
    assert evaluate(opt.loss_scale) == 2.0
    assert opt.initial_scale == 2.0
    assert opt.dynamic_growth_steps is None
    assert opt.dynamic_counter is None
    assert not opt.dynamic
    check_usable(opt)


@pytest.mark.parametrize("config_version", ["v2", "tf2_3", "v3"])
def test_get_config_dynamic(config_version):
    opt = config_round_trip(config_version, initial_scale=2, dynamic_growth_steps=3)
    if opt is None:
        config = {"optimizer": TF_2_3_SGD,
                  "loss_scale": {"class_name": "DynamicLossScale",
                                 "config": {"initial_loss_scale": 2.0, "increment_period": 3, "multiplier": 2.0}}}
        opt = LossScaleOptimizer.from_config(config)
    opt.learning_rate  # force the hyperparameters to be created
    assert evaluate(opt.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.momentum) == 0.5
    assert evaluate(opt.loss_scale) == 2.0
    assert opt.initial_scale == 2.0
    assert opt.dynamic_growth_steps == 3.0
    assert opt.dynamic
    check_usable(opt)
    assert evaluate(opt.dynamic_counter) == 1


def test_from_config_with_invalid_multiplier():
    config = {"optimizer": TF_2_3_SGD,
              "loss_scale": {"class_name": "DynamicLossScale",
                             "config": {"initial_loss_scale": 2.0, "increment_period": 3, "multiplier": 4.0}}}
    expected_error = ("Cannot deserialize LossScaleOptimizer with a DynamicLossScale whose multiplier is not 2. "
                      "Got DynamicLossScale: DynamicLossScale\\(")
    with pytest.raises(ValueError, match=expected_error):
        LossScaleOptimizer.from_config(config)


@pytest.mark.parametrize("lso_type", ["v2", "v3"])
def test_serialization_with_built_in_optimizer(lso_type):
    if lso_type == "v2":
        opt = LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(2.0, momentum=0.5), initial_scale=2.0,
                                 dynamic_growth_steps=3.0)
    else:
        opt = LossScaleOptimizer(tf_keras.optimizers.SGD(2.0, momentum=0.5), initial_scale=2.0,
                                 dynamic_growth_steps=3)
    config = keras.saving.serialize_keras_object(opt)
    opt = keras.saving.deserialize_keras_object(config)
    opt.learning_rate  # force the hyperparameters to be created
    assert evaluate(opt.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.momentum) == 0.5
    assert evaluate(opt.loss_scale) == 2.0
    assert opt.dynamic_growth_steps == 3.0
    assert opt.dynamic
    assert isinstance(opt, LossScaleOptimizer)  # named as tf_keras names its class for each optimizer family
    assert type(opt).__name__ == ("LossScaleOptimizer" if lso_type == "v2" else "LossScaleOptimizerV3")
    check_usable(opt)
    assert evaluate(opt.dynamic_counter) == 1


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_serialization_with_custom_optimizer(opt_cls):
    class MySGD(sgd_class(opt_cls)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.my_attribute = 123

    opt = create_lso(MySGD(2.0, momentum=0.5), initial_scale=2.0, dynamic_growth_steps=3.0)
    config = keras.saving.serialize_keras_object(opt)
    opt = keras.saving.deserialize_keras_object(config, custom_objects={"MySGD": MySGD})
    opt.learning_rate  # force the hyperparameters to be created
    assert evaluate(opt.learning_rate) == 2.0
    assert evaluate(opt.inner_optimizer.momentum) == 0.5
    assert evaluate(opt.loss_scale) == 2.0
    assert opt.dynamic_growth_steps == 3.0
    assert opt.inner_optimizer.my_attribute == 123


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_unsupported_strategy(opt_cls):
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    expected_error = ("Loss scaling is not supported with the tf.distribute.Strategy: CentralStorageStrategy. "
                      "Try using a different Strategy, e.g. a MirroredStrategy")
    with strategy.scope(), pytest.raises(ValueError, match=expected_error):
        create_lso(create_sgd(opt_cls))
    opt = create_lso(create_sgd(opt_cls))
    with strategy.scope():
        var = tf.Variable(1.0)
        loss = lambda: var * 2.0  # noqa: E731
        run_fn = lambda: opt.minimize(loss, [var])  # noqa: E731
        with pytest.raises(ValueError, match=expected_error):
            strategy.run(run_fn)


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_invalid_args_with_fixed_loss_scale(opt_cls):
    with pytest.raises(ValueError, match='"initial_scale" must be specified if "dynamic" is False'):
        create_lso(create_sgd(opt_cls), dynamic=False)
    with pytest.raises(ValueError, match='"dynamic_growth_steps" must be None if "dynamic" is False, but got: 2'):
        create_lso(create_sgd(opt_cls), dynamic=False, initial_scale=1, dynamic_growth_steps=2)


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_dynamic_must_be_bool(opt_cls):
    with pytest.raises(TypeError, match="\"dynamic\" argument to LossScaleOptimizer.__init__ must be a bool, "
                                        "but got: 'dynamic'"):
        create_lso(create_sgd(opt_cls), "dynamic")


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_scaling_warning(opt_cls, tf_warnings):
    var = tf.Variable(1.0)
    lso = create_lso(create_sgd(opt_cls))
    lso.apply_gradients([(tf.constant(1.0), var)])
    assert ("You forgot to call LossScaleOptimizer.get_scaled_loss() and "
            "LossScaleOptimizer.get_unscaled_gradients() before") in tf_warnings[0]
    tf_warnings.clear()
    lso = create_lso(create_sgd(opt_cls))
    lso.get_scaled_loss(tf.constant(1.0))
    lso.apply_gradients([(tf.constant(1.0), var)])
    assert "You forgot to call LossScaleOptimizer.get_unscaled_gradients() before" in tf_warnings[0]
    tf_warnings.clear()
    lso = create_lso(create_sgd(opt_cls))
    lso.get_unscaled_gradients([tf.constant(1.0)])
    lso.apply_gradients([(tf.constant(1.0), var)])
    assert "You forgot to call LossScaleOptimizer.get_scaled_loss() before" in tf_warnings[0]


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_scaling_no_warning(opt_cls, tf_warnings):
    var = tf.Variable(1.0)
    lso = create_lso(create_sgd(opt_cls))
    lso.get_scaled_loss(tf.constant(1.0))
    lso.get_unscaled_gradients([tf.constant(1.0)])
    lso.apply_gradients([(tf.constant(1.0), var)])
    assert not [m for m in tf_warnings if "LossScaleOptimizer" in m]


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_error_when_nesting(opt_cls):
    opt = create_lso(create_sgd(opt_cls))
    with pytest.raises(TypeError, match="LossScaleOptimizer cannot wrap another LossScaleOptimizer"):
        create_lso(opt)


@pytest.mark.parametrize("opt_cls", OPT_CLASSES)
def test_error_wrapping_same_optimizer_multiple_times(opt_cls):
    inner_opt = create_sgd(opt_cls)
    create_lso(inner_opt)
    with pytest.raises(ValueError, match='"inner_optimizer" is already wrapped by a LossScaleOptimizer.'):
        create_lso(inner_opt)


def test_error_when_wrapping_non_optimizer():
    with pytest.raises(TypeError, match='"inner_optimizer" must be an instance of `tf.keras.optimizers.Optimizer` '
                                        "or `tf.keras.optimizers.experimental.Optimizer`, but got: 1"):
        LossScaleOptimizer(1)
