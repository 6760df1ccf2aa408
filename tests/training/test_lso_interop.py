"""LossScaleOptimizer as a drop-in for tf_keras's and Keras 3's: checkpoints across libraries, the apply_gradients
contract of each library, and TensorFlow's documented examples, with real tf_keras and Keras 3 classes."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite import LossScaleOptimizer
from mp_rewrite.training.loss_scale.settings import LossScaleError

tf_keras = pytest.importorskip("tf_keras")


def tf_keras_sgd(family, **kwargs):
    return (tf_keras.optimizers.legacy.SGD if family == "legacy" else tf_keras.optimizers.SGD)(1.0, **kwargs)


def tf_keras_lso(family, ours, **kwargs):
    inner = tf_keras_sgd(family, momentum=1.0)
    cls = LossScaleOptimizer if ours else tf_keras.mixed_precision.LossScaleOptimizer
    return cls(inner, initial_scale=4.0, dynamic_growth_steps=2, **kwargs)


def save(tmp_path, opt, var):
    return tf.train.Checkpoint(optimizer=opt, var=var).save(os.path.join(tmp_path, "ckpt"))


def checkpoint_names(path):
    return {name.replace("/.ATTRIBUTES/VARIABLE_VALUE", "") for name, _ in tf.train.list_variables(path)
            if "_CHECKPOINTABLE_OBJECT_GRAPH" not in name}


DIAGNOSTICS = {f"optimizer/.ATTRIBUTES/{name}" for name in ("skipped_steps", "scale_history_steps",
                                                             "scale_history_scales", "scale_history_count")}


def train_tf_keras(opt, var, steps=3):
    for _ in range(steps):
        opt.minimize(lambda: tf.reduce_sum(var * var), [var])


def optimizer_state(opt, var, family):
    """(iterations, loss scale, counter, slot values) of a tf_keras or mp_rewrite LossScaleOptimizer."""
    if family == "legacy":
        slots = opt.get_slot(var, "momentum").numpy().tolist()
    else:
        slots = [v.numpy().tolist() for v in opt.inner_optimizer.variables[2:]]  # after iterations, learning rate
    return int(opt.iterations.numpy()), float(opt.loss_scale.numpy()), int(opt.dynamic_counter.numpy()), slots


@pytest.mark.parametrize("family", ["legacy", "v3"])
def test_tf_keras_inner_optimizer_checkpoints_in_tf_keras_layout(tmp_path, family):
    names = {}
    for ours in (False, True):
        var = tf.Variable([1.0, 2.0])
        opt = tf_keras_lso(family, ours)
        train_tf_keras(opt, var, steps=1)
        names[ours] = checkpoint_names(save(tmp_path / str(ours), opt, var))
    assert names[True] == names[False] | DIAGNOSTICS  # the same nodes; the diagnostics are the node's own values
    if family == "legacy":
        assert {"optimizer/iter", "optimizer/loss_scale/current_loss_scale", "optimizer/loss_scale/good_steps",
                "var/.OPTIMIZER_SLOT/optimizer/momentum"} <= names[True]


@pytest.mark.parametrize("family", ["legacy", "v3"])
@pytest.mark.parametrize("save_ours", [False, True])
def test_checkpoint_restores_between_tf_keras_wrapper_and_ours(tmp_path, family, save_ours):
    var = tf.Variable([1.0, 2.0])
    source = tf_keras_lso(family, save_ours)
    train_tf_keras(source, var)
    expected = optimizer_state(source, var, family)
    assert expected[:3] == (3, 8.0, 1)  # the scale grew once, one finite step since
    path = save(tmp_path, source, var)
    var2 = tf.Variable([0.0, 0.0])
    target = tf_keras_lso(family, not save_ours)
    target.build([var2]) if family == "v3" else target.inner_optimizer._create_all_weights([var2])
    status = tf.train.Checkpoint(optimizer=target, var=var2).restore(path)
    status.assert_existing_objects_matched()
    assert optimizer_state(target, var2, family) == expected
    np.testing.assert_array_equal(var2.numpy(), var.numpy())


def keras3_lso(ours):
    cls = LossScaleOptimizer if ours else keras.optimizers.LossScaleOptimizer
    return cls(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=4.0, dynamic_growth_steps=2)


def train_keras3(opt, var, steps=3):
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_sum(var * var))
        opt.apply([tape.gradient(loss, var)], [var])


def test_keras3_inner_optimizer_checkpoints_in_keras3_layout(tmp_path):
    names = {}
    for ours in (False, True):
        var = tf.Variable([1.0, 2.0])
        opt = keras3_lso(ours)
        train_keras3(opt, var, steps=1)
        names[ours] = checkpoint_names(save(tmp_path / str(ours), opt, var))
    assert names[True] == names[False] | DIAGNOSTICS
    assert {"optimizer/dynamic_scale", "optimizer/step_counter", "optimizer/inner_optimizer/_iterations"} <= names[True]


@pytest.mark.parametrize("save_ours", [False, True])
def test_checkpoint_restores_between_keras3_wrapper_and_ours(tmp_path, save_ours):
    def state(opt):
        return (int(opt.iterations.numpy()), float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy()),
                opt.inner_optimizer.variables[2].numpy().tolist())

    var = tf.Variable([1.0, 2.0])
    source = keras3_lso(save_ours)
    train_keras3(source, var)
    expected = state(source)
    assert expected[:3] == (3, 8.0, 1)
    path = save(tmp_path, source, var)
    var2 = tf.Variable([0.0, 0.0])
    target = keras3_lso(not save_ours)
    target.build([var2])
    tf.train.Checkpoint(optimizer=target, var=var2).restore(path).assert_existing_objects_matched()
    assert state(target) == expected


@pytest.mark.parametrize("dynamic", [True, False])
def test_bare_keras3_checkpoint_into_the_wrapper_fails_loudly(tmp_path, dynamic):
    # By position it would land in the loss scale state (the momentum became the loss scale before).
    var = tf.Variable(3.0)
    bare = keras.optimizers.Adam(0.1)
    train_keras3(LossScaleOptimizer(bare, dynamic=False, initial_scale=1.0), var, steps=1)
    path = tf.train.Checkpoint(optimizer=bare, var=var).save(os.path.join(tmp_path, "bare"))
    kwargs = {} if dynamic else {"dynamic": False, "initial_scale": 8.0}
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.1), **kwargs)
    opt.build([tf.Variable(0.0)])
    with pytest.raises((LossScaleError, tf.errors.InvalidArgumentError)):
        tf.train.Checkpoint(optimizer=opt, var=tf.Variable(0.0)).restore(path)
    assert float(opt.loss_scale.numpy()) == (2.0**15 if dynamic else 8.0)


# -- the apply_gradients contract --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["legacy", "v3"])
def test_tf_keras_apply_gradients_never_unscales(family):
    opt = LossScaleOptimizer(tf_keras_sgd(family), dynamic=False, initial_scale=4.0)
    var = tf.Variable(0.0)
    opt.get_scaled_loss(var)
    opt.apply_gradients([(tf.constant(4.0), var)])  # tf_keras: the caller unscales, so this is the gradient
    assert var.numpy() == -4.0
    (grad,) = opt.get_unscaled_gradients([tf.constant(4.0)])
    opt.apply_gradients([(grad, var)])
    assert var.numpy() == -5.0


def test_keras3_apply_gradients_unscales_scaled_gradients():
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), dynamic=False, initial_scale=4.0)
    var = tf.Variable(0.0)
    opt.scale_loss(var)
    opt.apply_gradients([(tf.constant(4.0), var)])  # Keras 3: the gradient of the scaled loss
    assert var.numpy() == -1.0


def test_keras3_two_unscaled_gradient_lists_are_each_applied_as_they_are():
    # A one-bit "already unscaled" flag was consumed by the first apply: the second update shrank 4x (32768x with
    # the default scale).
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), dynamic=False, initial_scale=4.0)
    var = tf.Variable(0.0)
    first = opt.get_unscaled_gradients([tf.constant(8.0)])
    second = opt.get_unscaled_gradients([tf.constant(8.0)])
    opt.apply_gradients(zip(first, [var]))
    opt.apply_gradients(zip(second, [var]))
    assert var.numpy() == -4.0
    opt.scale_loss(var)
    opt.apply_gradients([(tf.constant(8.0), var)])  # then a Keras 3 step is unscaled again
    assert var.numpy() == -6.0


# -- TensorFlow's documented examples, with each library's optimizer ---------------------------------------------


@pytest.mark.parametrize("make_sgd", [keras.optimizers.SGD, tf_keras.optimizers.SGD,
                                      tf_keras.optimizers.legacy.SGD], ids=["keras3", "tf_keras", "legacy"])
def test_documented_example_runs_as_written(make_sgd):
    opt = LossScaleOptimizer(make_sgd(0.25))
    var = tf.Variable(1.0)
    loss_fn = lambda: var**2  # noqa: E731
    opt.minimize(loss_fn, [var])
    assert var.numpy() == 0.5
    with tf.GradientTape() as tape:
        loss = loss_fn()
        scaled_loss = opt.get_scaled_loss(loss)
    scaled_grad = tape.gradient(scaled_loss, var)
    (grad,) = opt.get_unscaled_gradients([scaled_grad])
    opt.apply_gradients([(grad, var)])
    assert var.numpy() == 0.25


def test_documented_hyperparameter_delegation():
    opt = LossScaleOptimizer(tf_keras.optimizers.legacy.Adam(beta_1=0.8, epsilon=1e-5))
    assert opt.beta_1.numpy() == np.float32(0.8)  # equivalent to opt.inner_optimizer.beta_1
    opt.beta_1 = 0.7
    assert opt.beta_1.numpy() == np.float32(0.7) and opt.inner_optimizer.beta_1.numpy() == np.float32(0.7)
    assert opt.inner_optimizer.epsilon == 1e-5
    with pytest.raises(AttributeError, match="'LossScaleOptimizer' object has no attribute 'epsilon'"):
        opt.epsilon  # noqa: B018  (not a hyperparameter: Adam never calls _set_hyper on it)
    opt.epsilon = 1e-4
    assert opt.epsilon == 1e-4 and opt.inner_optimizer.epsilon == 1e-5


def compiled_tf_keras_model(opt):
    model = tf_keras.Sequential([tf_keras.layers.Dense(4, input_shape=(3,)), tf_keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(32, 3)).astype("float32"), rng.normal(size=(32, 1)).astype("float32"),
              batch_size=8, epochs=1, verbose=0)
    return model


@pytest.mark.parametrize("family", ["legacy", "new"])
def test_tf_keras_h5_saved_with_ours_loads_in_tf_keras_as_its_own_wrapper_would(tmp_path, family):
    opt = tf_keras_lso(family, ours=True)
    saved = compiled_tf_keras_model(opt)
    saved.save(tmp_path / "m.h5")
    loaded = tf_keras.models.load_model(tmp_path / "m.h5").optimizer  # tf_keras alone: mp_rewrite not needed
    peer = tf_keras_lso(family, ours=False)
    assert type(loaded) is type(peer) and type(opt).__name__ == type(peer).__name__
    assert loaded.get_config() == opt.get_config()
    assert (loaded.initial_scale, loaded.dynamic_growth_steps) == (4.0, 2)
    if family == "legacy":  # tf_keras's .h5 keeps a legacy optimizer's state (for new ones, tf_keras's own loses it)
        assert int(loaded.iterations) == int(opt.iterations) == 4


@pytest.mark.parametrize("family", ["legacy", "new"])
def test_tf_keras_model_with_ours_saves_and_loads_in_its_native_format(tmp_path, family):
    opt = tf_keras_lso(family, ours=True)
    compiled_tf_keras_model(opt).save(tmp_path / "m.keras")
    loaded = tf_keras.models.load_model(tmp_path / "m.keras").optimizer
    assert isinstance(loaded, LossScaleOptimizer) and type(loaded) is type(opt)
    assert loaded.get_config() == opt.get_config()
