"""Loss scaling for mixed precision training: `LossScaleOptimizer` and `wrap_optimizer`.

`LossScaleOptimizer` has the semantics of tf_keras's `tf.keras.mixed_precision.LossScaleOptimizer` and is a
Keras 3 optimizer (a subclass of `keras.optimizers.LossScaleOptimizer`, so `model.compile` never wraps it again).
It accepts both ways of driving a loss scale optimizer:

* Keras 3 (`model.fit`, custom loops): `scale_loss(loss)` inside the tape, then `apply(grads, vars)` or
  `apply_gradients(...)` with the *scaled* gradients, which the optimizer unscales.
* tf_keras: `get_scaled_loss(loss)`, `get_unscaled_gradients(grads)`, then `apply_gradients(...)` with the
  *unscaled* gradients. `get_unscaled_gradients` sets a per-replica flag *variable* which the next apply reads
  (and clears) at run time, so the two calls may sit in different `tf.function`s or mix eager and graph code.

Dynamic scaling is bounded: the scale never drops below `MIN_LOSS_SCALE` (a warning is logged when the floor is
hit) and never grows past `MAX_LOSS_SCALE`. Skipped steps, the scale and its recent changes are observable through
`skipped_steps`, `loss_scale` and `scale_history`, and are logged to `logging.getLogger("mp_rewrite")`: INFO on each
skipped step, WARNING at the floor, DEBUG on growth (host callbacks, left out inside XLA-compiled functions).

Errors are `LossScaleError` (a ValueError) and `LossScaleTypeError` (a TypeError), both `OptionError`s, with TF's
messages. TensorFlow backend of Keras 3 only (the update is written in TF ops, for tf.distribute).
"""

import inspect
import logging
import numbers

import keras
import tensorflow as tf

from .legacy_methods import LEGACY_METHODS, LegacyWeights, legacy_method
from .dynamic_scale import UNSCALE_SCOPE, DynamicScaleUpdate, multiply  # noqa: F401  (UNSCALE_SCOPE re-exported)
from .settings import (  # noqa: F401  (the bounds and is_loss_scale_optimizer are re-exported)
    _BASE_ARGS, _KERAS, _TF_KERAS_V2, _TF_KERAS_V3, MAX_LOSS_SCALE, MIN_LOSS_SCALE, SCALE_HISTORY_SIZE, LossScaleError,
    _check_inner, _check_settings, _check_strategy_supported, deserialize_inner, is_loss_scale_optimizer,
    legacy_config)

# AutoGraph would re-convert this module's Python on every trace (~3 s); none of it needs conversion.
_no_autograph = tf.autograph.experimental.do_not_convert

logger = logging.getLogger("mp_rewrite")


class _Untracked:
    """Holds a variable out of sight of checkpoint tracking (transient per-step state)."""

    def __init__(self, variable):
        self.variable = variable


@keras.saving.register_keras_serializable(package="mp_rewrite")
class LossScaleOptimizer(DynamicScaleUpdate, LegacyWeights, keras.optimizers.LossScaleOptimizer):
    """An optimizer wrapper that scales the loss to keep float16 gradients from underflowing.

    With `dynamic=True` the scale starts at `initial_scale`; after `dynamic_growth_steps` consecutive steps with
    finite gradients it doubles (at most to `MAX_LOSS_SCALE`); a step with any non-finite gradient, on any replica,
    is skipped on every replica (variables and slots untouched, `iterations` still incremented, as in tf_keras), the
    scale halves (at least to `MIN_LOSS_SCALE`) and the counter resets. With `dynamic=False` the scale is fixed
    and every step is applied. Create it under the `tf.distribute` strategy's scope, like its inner optimizer.

    Args:
        inner_optimizer: a Keras 3 optimizer (`keras.optimizers.SGD(...)`, ...) or a tf_keras optimizer.
        dynamic: bool, dynamic (default) or fixed loss scale.
        initial_scale: the first (or the fixed) scale, in [1, 2**64]; defaults to 2**15 when dynamic, and is
            required when not.
        dynamic_growth_steps: a positive int, default 2000; must be None when not dynamic.
        name: optional name.

    Raises:
        TypeError: `dynamic` is not a bool, or `inner_optimizer` is not an optimizer or is a loss scale optimizer.
        ValueError: invalid `initial_scale`/`dynamic_growth_steps`, an inner optimizer that is already wrapped, or
            an unsupported distribution strategy (TPU, parameter server, central storage).
    """

    def __init__(self, inner_optimizer, dynamic=True, initial_scale=None, dynamic_growth_steps=None, name=None,
                 **kwargs):
        if kwargs:  # Keras's error; clipping or EMA on the wrapper would silently do nothing
            raise LossScaleError(f"Argument(s) not recognized: {kwargs}. Options of the update (clipnorm, clipvalue, "
                                 "global_clipnorm, use_ema, ...) belong to the inner optimizer")
        family = _check_inner(inner_optimizer)
        initial_scale, dynamic_growth_steps = _check_settings(dynamic, initial_scale, dynamic_growth_steps)
        _check_strategy_supported()
        # Skip keras.optimizers.LossScaleOptimizer.__init__: it rejects dynamic=False. The subclassing is only there
        # so that Keras (compile(auto_scale_loss=True), MultiOptimizer, callbacks) recognises a loss scale optimizer.
        keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name)
        self._family = family
        self._dynamic = dynamic
        self._initial_scale = initial_scale
        self._growth_steps = dynamic_growth_steps
        self._scaling_seen = False
        self.inner_optimizer = inner_optimizer
        inner_optimizer._is_wrapped_by_loss_scale_optimizer = True
        if family == _KERAS:
            inner_optimizer.loss_scale_factor = None  # the loss would otherwise be scaled twice
        self._create_state()

    def _create_state(self):
        def scalar(name, dtype, init="zeros", shape=()):
            return self.add_variable(shape, initializer=init, dtype=dtype, aggregation="only_first_replica", name=name)

        # Per replica (ON_READ): each replica records whether *its* gradients were unscaled already.
        flag = tf.Variable(0.0, trainable=False, name="grads_unscaled",
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._grads_unscaled = _Untracked(flag)
        if not self._dynamic:
            return
        self._create_dynamic_state(scalar)

    # -- properties ---------------------------------------------------------------------------------------------

    @property
    def dynamic(self):
        """bool: whether the loss scale is dynamic."""
        return self._dynamic

    @property
    def initial_scale(self):
        """float: the initial (or fixed) loss scale."""
        return self._initial_scale

    @property
    def dynamic_growth_steps(self):
        """int | None: finite steps after which a dynamic scale doubles; None for a fixed scale."""
        return self._growth_steps

    @property
    def loss_scale(self):
        """A float32 scalar Tensor: the current loss scale."""
        if self._dynamic:
            return tf.convert_to_tensor(self.dynamic_scale)
        return tf.constant(self._initial_scale, tf.float32)

    @property
    def iterations(self):
        """The inner optimizer's step counter (incremented on skipped steps too)."""
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, value):
        if self._family == _KERAS:
            self.inner_optimizer._iterations.assign(value)  # Keras 3 has no public setter
        else:
            self.inner_optimizer.iterations = value

    @property
    def learning_rate(self):
        """The inner optimizer's learning rate (the same object)."""
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    @property
    def variables(self):
        """This optimizer's variables (loss scale state included), then the inner optimizer's."""
        inner = self.inner_optimizer.variables
        return list(self._variables) + list(inner() if callable(inner) else inner)

    # -- hyperparameter delegation (tf_keras: hyperparameters yes, arbitrary attributes no) ----------------------

    def _hyperparameter_names(self):
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            return set()
        if self._family == _TF_KERAS_V2:
            names = set(inner._hyper)
            return names | {"lr"} if "learning_rate" in names else names
        # Keras 3 has no hyperparameter registry: take the numeric constructor arguments (beta_1, momentum, ...).
        names = {"learning_rate"}
        for arg in inspect.signature(type(inner).__init__).parameters:
            value = getattr(inner, arg, None) if arg not in _BASE_ARGS else None
            if (isinstance(value, numbers.Real) and not isinstance(value, bool)) or isinstance(
                    value, (tf.Variable, keras.Variable)):
                names.add(arg)
        return names

    def __getattr__(self, name):
        # Only reached when normal lookup fails.
        if not name.startswith("_") and name in self._hyperparameter_names():
            return getattr(self.inner_optimizer, name)
        if name in LEGACY_METHODS and self.__dict__.get("_family") == _TF_KERAS_V2:
            return legacy_method(self, name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        if (not name.startswith("_") and name not in self.__dict__ and not hasattr(type(self), name)
                and name in self._hyperparameter_names()):
            setattr(self.inner_optimizer, name, value)
            return
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | self._hyperparameter_names())

    # -- scaling --------------------------------------------------------------------------------------------------

    def _expect_scaled_gradients(self):
        self._scaling_seen = True
        self._grads_unscaled.variable.assign(0.0)

    @_no_autograph
    def scale_loss(self, loss):
        """Returns `loss * loss_scale` (what Keras 3's `fit` calls inside the tape).

        Args:
            loss: a scalar Tensor (any float dtype).

        Returns:
            The scaled loss, in the dtype of `loss`.
        """
        self._expect_scaled_gradients()
        loss = tf.convert_to_tensor(loss)
        return loss * tf.cast(self.loss_scale, loss.dtype)

    @_no_autograph
    def get_scaled_loss(self, loss):
        """Scales the loss by the loss scale (tf_keras API).

        Args:
            loss: a scalar Tensor, or a callable returning one.

        Returns:
            `loss * loss_scale`, or for a callable a new callable returning that.
        """
        if callable(loss):
            self._scaling_seen = True
            return lambda: self.scale_loss(loss())
        return self.scale_loss(loss)

    @_no_autograph
    def get_unscaled_gradients(self, grads):
        """Divides gradients by the loss scale (tf_keras API); the next apply then does not unscale them again.

        Args:
            grads: a list of Tensors, IndexedSlices or None.

        Returns:
            A list of the unscaled gradients; None stays None, IndexedSlices stay IndexedSlices.
        """
        self._scaling_seen = True
        reciprocal = tf.math.reciprocal(self.loss_scale)
        unscaled = [multiply(g, reciprocal) for g in grads]
        self._grads_unscaled.variable.assign(1.0)
        return unscaled

    # -- applying ------------------------------------------------------------------------------------------------

    def build(self, var_list):
        """Creates the inner optimizer's slots for `var_list` (the loss scale state exists from construction).

        Args:
            var_list: the trainable variables.
        """
        if self.built:
            return
        # Not keras.optimizers.LossScaleOptimizer.build: that would add Keras 3's own (unbounded) scale variables.
        keras.optimizers.Optimizer.build(self, var_list)
        inner = self.inner_optimizer
        if self._family == _TF_KERAS_V2:
            with tf.init_scope():
                inner._create_all_weights(var_list)
        elif self._family == _TF_KERAS_V3:
            with tf.init_scope():
                inner.build(var_list)
        elif not inner.built:
            inner.build(var_list)

    @_no_autograph
    def apply_gradients(self, grads_and_vars, *, grads_unscaled=None):
        """Applies gradients, unscaling them unless they are unscaled already; see `apply`.

        Args:
            grads_and_vars: (gradient, variable) pairs.
            grads_unscaled: None (decide from `get_unscaled_gradients`), or a bool saying whether they are.

        Returns:
            The `iterations` variable.
        """
        grads_and_vars = list(grads_and_vars)
        if grads_and_vars:
            grads, variables = zip(*grads_and_vars)
            self.apply(grads, variables, grads_unscaled=grads_unscaled)
        return self.iterations

    @_no_autograph
    def apply(self, grads, trainable_variables=None, *, grads_unscaled=None):
        """Applies one step: unscale, check finiteness on all replicas, apply or skip, update the scale.

        Args:
            grads: gradients (None entries allowed), scaled unless `get_unscaled_gradients` produced them.
            trainable_variables: the variables; may be omitted once the optimizer is built.
            grads_unscaled: None (decide from `get_unscaled_gradients`), or a bool saying whether they are.

        Raises:
            ValueError: called in a cross-replica context, or without variables before the first build.
        """
        grads = list(grads)
        if not grads:
            return
        if tf.distribute.in_cross_replica_context():
            raise LossScaleError("apply_gradients() must be called in a replica context.")
        _check_strategy_supported()
        variables = self._variables_for(trainable_variables)
        factor = self._unscale_factor(grads_unscaled)
        grads = [g if getattr(v, "overwrite_with_gradient", False) else multiply(g, factor)
                 for g, v in zip(grads, variables)]
        if self._dynamic:
            self._apply_dynamic(grads, variables)
        else:
            self._inner_apply(grads, variables)

    def _variables_for(self, trainable_variables):
        if trainable_variables is None:
            if not self.built:
                raise LossScaleError(
                    "When passing `grads` without `variables`, the optimizer must already be built on a "
                    "list of variables. Call `optimizer.build(trainable_variables)` first.")
            return list(self._trainable_variables)
        variables = list(trainable_variables)
        if not self.built:
            self.build(variables)
        return variables

    def _unscale_factor(self, grads_unscaled):
        """1 if the gradients are unscaled already, else 1/scale; consumes the `get_unscaled_gradients` flag."""
        flag = self._grads_unscaled.variable
        reciprocal = tf.math.reciprocal(self.loss_scale)
        if grads_unscaled is None:
            if not self._scaling_seen and (self._dynamic or self._initial_scale != 1.0):
                self._scaling_seen = True  # warn once
                logger.warning("LossScaleOptimizer.apply_gradients() was called, but neither scale_loss(), "
                               "get_scaled_loss() nor get_unscaled_gradients() was: the gradients are taken to be "
                               "scaled and are divided by the loss scale.")
            factor = tf.where(flag.read_value() > 0.5, tf.constant(1.0), reciprocal)
        else:
            factor = tf.constant(1.0) if grads_unscaled else reciprocal
        flag.assign(0.0)
        return factor

    def _inner_apply(self, grads, variables):
        if self._family == _KERAS:
            self.inner_optimizer.apply(grads, variables)
        else:
            self.inner_optimizer.apply_gradients(list(zip(grads, variables)))

    @_no_autograph
    def minimize(self, loss, var_list, tape=None):
        """Scales the loss, computes and unscales the gradients, applies them (tf_keras API).

        Args:
            loss: a callable returning the loss, or a Tensor computed under `tape`.
            var_list: the variables to train, or a callable returning them.
            tape: the `tf.GradientTape` that recorded a Tensor `loss`.

        Returns:
            The `iterations` variable.

        Raises:
            ValueError: a Tensor `loss` without `tape`.
        """
        if not callable(loss) and tape is None:
            raise LossScaleError(
                f"`tape` is required when a `Tensor` loss is passed. Received: loss={loss}, tape={tape}.")
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            if callable(loss):
                loss = loss()
            scaled_loss = self.get_scaled_loss(loss)
        var_list = list(var_list() if callable(var_list) else var_list)
        grads = self.get_unscaled_gradients(tape.gradient(scaled_loss, var_list))
        return self.apply_gradients(zip(grads, var_list), grads_unscaled=True)

    # -- serialization -------------------------------------------------------------------------------------------

    def get_config(self):
        """Returns the config: name, the serialized inner optimizer and the three loss scale settings."""
        config = {"name": self.name, "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
                  "dynamic": self._dynamic, "initial_scale": self._initial_scale,
                  "dynamic_growth_steps": self._growth_steps}
        if self._family == _KERAS and self._dynamic:
            del config["dynamic"]  # Keras 3's own config has no "dynamic" (it is always dynamic)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuilds an optimizer (without state) from `get_config()` output.

        Args:
            config: the dict from `get_config`.
            custom_objects: optional dict for deserializing a custom inner optimizer.

        Returns:
            A new LossScaleOptimizer.
        """
        config = legacy_config(dict(config))
        inner = deserialize_inner(config.pop("inner_optimizer"), custom_objects)
        return cls(inner, **config)
