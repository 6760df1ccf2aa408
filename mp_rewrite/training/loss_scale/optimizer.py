"""Loss scaling for mixed precision training: `LossScaleOptimizer`.

`LossScaleOptimizer` wraps a Keras 3 optimizer or a tf_keras optimizer (legacy or new) and behaves, for each, as
that library's own wrapper does: tf_keras's `tf_keras.mixed_precision.LossScaleOptimizer` for tf_keras optimizers,
Keras 3's `keras.optimizers.LossScaleOptimizer` for Keras 3 optimizers (it is a subclass of the latter, so
`model.compile` never wraps it again). Per family (see the modules named):

* who unscales in `apply_gradients` (`scaling_contract.py`): tf_keras — never, the caller calls
  `get_unscaled_gradients` (or `minimize`); Keras 3 — always, except gradients `get_unscaled_gradients` returned;
* what is forwarded to the inner optimizer (`delegation.py`, `legacy_methods.py`);
* the checkpoint layout (`checkpoint_layout.py`): tf_keras's for tf_keras optimizers, Keras 3's for Keras 3's.

Dynamic scaling is bounded: the scale never drops below `MIN_LOSS_SCALE` (a warning is logged when the floor is
hit) and never grows past `MAX_LOSS_SCALE`. Skipped steps, the scale and its recent changes are observable through
`skipped_steps`, `loss_scale` and `scale_history`, and are logged to `logging.getLogger("mp_rewrite")`: INFO on each
skipped step, WARNING at the floor, DEBUG on growth (host callbacks, left out inside XLA-compiled functions).

Errors are `LossScaleError` (a ValueError) and `LossScaleTypeError` (a TypeError), both `OptionError`s, with TF's
messages. TensorFlow backend of Keras 3 only (the update is written in TF ops, for tf.distribute).
"""

import keras
import tensorflow as tf

from .checkpoint_layout import TfKerasCheckpointLayout
from .delegation import InnerDelegation
from .dynamic_scale import UNSCALE_SCOPE, DynamicScaleUpdate, multiply  # noqa: F401  (UNSCALE_SCOPE re-exported)
from .legacy_methods import LegacyWeights
from .scaling_contract import aggregate_for_inner, apply_to_inner, warn_about_scaling, warn_unscaled_keras_step
from .tf_keras_compile import accept_in_tf_keras
from .settings import (  # noqa: F401  (the bounds and is_loss_scale_optimizer are re-exported)
    _KERAS, _TF_KERAS_V2, _TF_KERAS_V3, MAX_LOSS_SCALE, MIN_LOSS_SCALE, SCALE_HISTORY_SIZE, LossScaleError,
    _check_inner, _check_settings, _check_strategy_supported, _check_wrapper_kwargs, _optimizer_family,
    deserialize_inner, is_loss_scale_optimizer, legacy_config, serialize_inner)

# AutoGraph would re-convert this module's Python on every trace (~3 s); none of it needs conversion.
_no_autograph = tf.autograph.experimental.do_not_convert


class _Untracked:
    """Holds a variable out of sight of checkpoint tracking (transient per-step state)."""

    def __init__(self, variable):
        self.variable = variable


@keras.saving.register_keras_serializable(package="mp_rewrite")
class LossScaleOptimizer(TfKerasCheckpointLayout, InnerDelegation, DynamicScaleUpdate, LegacyWeights,
                         keras.optimizers.LossScaleOptimizer):
    """An optimizer wrapper that scales the loss to keep float16 gradients from underflowing.

    With `dynamic=True` the scale starts at `initial_scale`; after `dynamic_growth_steps` consecutive steps with
    finite gradients it doubles (at most to `MAX_LOSS_SCALE`); a step with any non-finite gradient, on any replica,
    is skipped on every replica (variables and slots untouched, `iterations` still incremented, as in tf_keras), the
    scale halves (at least to `MIN_LOSS_SCALE`) and the counter resets. With `dynamic=False` the scale is fixed
    and every step is applied. Create it under the `tf.distribute` strategy's scope, like its inner optimizer.

    `apply_gradients` follows the inner optimizer's library: for a tf_keras optimizer it never unscales (call
    `get_unscaled_gradients`, as with tf_keras); for a Keras 3 optimizer it unscales the gradients of the scaled
    loss, except those `get_unscaled_gradients` returned (see `scaling_contract.py`).

    Args:
        inner_optimizer: a Keras 3 optimizer (`keras.optimizers.SGD(...)`, ...) or a tf_keras optimizer.
        dynamic: bool, dynamic (default) or fixed loss scale.
        initial_scale: the first (or the fixed) scale, in (0, 2**64]; defaults to 2**15 when dynamic, and is
            required when not.
        dynamic_growth_steps: a positive int, default 2000; must be None when not dynamic.
        name: optional name.
        **kwargs: Keras 3's base optimizer options at their defaults (what Keras 3 configs carry); other values
            belong to the inner optimizer.

    Raises:
        TypeError: `dynamic` is not a bool, or `inner_optimizer` is not an optimizer or is a loss scale optimizer.
        ValueError: invalid `initial_scale`/`dynamic_growth_steps`, an option of the inner optimizer, a tf_keras
            optimizer that is already wrapped, or an unsupported distribution strategy (TPU, parameter server,
            central storage).
    """

    def __new__(cls, inner_optimizer=None, *args, **kwargs):
        # As tf_keras's BaseLossScaleOptimizer: a new (non-legacy) tf_keras optimizer gets the V3 class.
        if cls is LossScaleOptimizer and _optimizer_family(inner_optimizer) == _TF_KERAS_V3:
            cls = LossScaleOptimizerV3
        return super().__new__(cls)

    def __init__(self, inner_optimizer, dynamic=True, initial_scale=None, dynamic_growth_steps=None, name=None,
                 **kwargs):
        _check_wrapper_kwargs(kwargs)
        family = _check_inner(inner_optimizer)
        initial_scale, dynamic_growth_steps = _check_settings(dynamic, initial_scale, dynamic_growth_steps, family)
        _check_strategy_supported()
        # Skip keras.optimizers.LossScaleOptimizer.__init__: it rejects dynamic=False. The subclassing is only there
        # so that Keras (compile(auto_scale_loss=True), MultiOptimizer, callbacks) recognises a loss scale optimizer.
        keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name)
        self._family = family
        self._dynamic = dynamic
        self._initial_scale = initial_scale
        self._growth_steps = dynamic_growth_steps
        self._loss_has_been_scaled = False
        self._gradients_have_been_unscaled = False
        self._warned_unscaled = False
        self.inner_optimizer = inner_optimizer
        inner_optimizer._is_wrapped_by_loss_scale_optimizer = True
        if family == _KERAS:
            inner_optimizer.loss_scale_factor = None  # the loss would otherwise be scaled twice
        else:
            accept_in_tf_keras(LossScaleOptimizer)  # so that tf_keras's Model.compile takes it
        self._create_state()

    def _create_state(self):
        def scalar(name, dtype, init="zeros", shape=()):
            return self.add_variable(shape, initializer=init, dtype=dtype, aggregation="only_first_replica", name=name)

        # Per replica (ON_READ): how many gradient lists get_unscaled_gradients returned that no apply has taken.
        pending = tf.Variable(0.0, trainable=False, name="pending_unscaled",
                              synchronization=tf.VariableSynchronization.ON_READ,
                              aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._pending_unscaled = _Untracked(pending)
        state = {}
        if self._dynamic:
            self._create_dynamic_state(scalar)
            state = {"current_loss_scale": self.dynamic_scale, "good_steps": self.step_counter}
        self._create_layout_nodes(state)

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

    # -- scaling --------------------------------------------------------------------------------------------------

    @_no_autograph
    def scale_loss(self, loss):
        """Returns `loss * loss_scale` (Keras 3's API, what `fit` calls inside the tape).

        It starts a Keras 3 step: for a Keras 3 inner optimizer, the next apply unscales its gradients even if an
        earlier `get_unscaled_gradients` result was never applied.

        Args:
            loss: a scalar Tensor (any float dtype).

        Returns:
            The scaled loss, in the dtype of `loss`.
        """
        if self._family == _KERAS and not self._unit_scale:
            self._pending_unscaled.variable.assign(0.0)
        return self._scaled(loss)

    @property
    def _unit_scale(self) -> bool:
        """A fixed scale of 1 (the bfloat16 default): scaling and unscaling are exact no-ops, so no ops are added
        (a training step would otherwise multiply every gradient by 1)."""
        return not self._dynamic and self._initial_scale == 1.0

    def _scaled(self, loss):
        self._loss_has_been_scaled = True
        loss = tf.convert_to_tensor(loss)
        return loss if self._unit_scale else loss * tf.cast(self.loss_scale, loss.dtype)

    @_no_autograph
    def get_scaled_loss(self, loss):
        """Scales the loss by the loss scale (tf_keras API).

        Args:
            loss: a scalar Tensor, or a callable returning one.

        Returns:
            `loss * loss_scale`, or for a callable a new callable returning that.
        """
        self._loss_has_been_scaled = True
        if callable(loss):
            return lambda: self._scaled(loss())
        return self._scaled(loss)

    @_no_autograph
    def get_unscaled_gradients(self, grads):
        """Divides gradients by the loss scale (tf_keras API); an apply does not unscale them again.

        Args:
            grads: a list of Tensors, IndexedSlices or None.

        Returns:
            A list of the unscaled gradients; None stays None, IndexedSlices stay IndexedSlices.
        """
        unscaled = self._unscaled(grads)
        if self._family == _KERAS and not self._unit_scale:
            self._pending_unscaled.variable.assign_add(1.0)
        return unscaled

    def _unscaled(self, grads):
        self._gradients_have_been_unscaled = True
        if self._unit_scale:
            return list(grads)
        reciprocal = tf.math.reciprocal(self.loss_scale)
        return [multiply(g, reciprocal) for g in grads]

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
    def apply_gradients(self, grads_and_vars, name=None, experimental_aggregate_gradients=True,
                        skip_gradients_aggregation=False, *, grads_unscaled=None):
        """Applies one step; see `apply`. Takes tf_keras's arguments (legacy and new) and Keras 3's.

        Args:
            grads_and_vars: (gradient, variable) pairs.
            name: accepted for tf_keras's signature (the ops are not renamed).
            experimental_aggregate_gradients: tf_keras legacy: aggregate across replicas first (the default).
            skip_gradients_aggregation: tf_keras new optimizers: do not aggregate.
            grads_unscaled: None (the inner optimizer's library decides, see the class doc), or a bool saying
                whether the gradients are unscaled already.

        Returns:
            The `iterations` variable.
        """
        pairs = list(grads_and_vars)
        if pairs or self._family == _TF_KERAS_V2:  # tf_keras legacy raises "No gradients provided" on none
            grads, variables = (list(x) for x in zip(*pairs)) if pairs else ([], [])
            self._apply_step(grads, variables, grads_unscaled,
                             experimental_aggregate_gradients and not skip_gradients_aggregation)
        return self.iterations

    @_no_autograph
    def apply(self, grads, trainable_variables=None, *, grads_unscaled=None):
        """Applies one step: unscale (Keras 3), check finiteness on all replicas, apply or skip, update the scale.

        Args:
            grads: gradients (None entries allowed); for a Keras 3 inner optimizer the gradients of the scaled loss
                unless `get_unscaled_gradients` produced them, for a tf_keras one unscaled gradients.
            trainable_variables: the variables; may be omitted once the optimizer is built.
            grads_unscaled: None (the inner optimizer's library decides), or a bool saying whether they are.

        Raises:
            ValueError: called in a cross-replica context, or without variables before the first build.
        """
        grads = list(grads)
        if grads:
            self._apply_step(grads, self._variables_for(trainable_variables), grads_unscaled, True)

    def _apply_step(self, grads, variables, grads_unscaled, aggregate):
        if tf.distribute.in_cross_replica_context():
            raise LossScaleError("apply_gradients() must be called in a replica context.")
        _check_strategy_supported()
        if self._family != _KERAS:
            warn_about_scaling(self._loss_has_been_scaled, self._gradients_have_been_unscaled)
            pairs = aggregate_for_inner(self._family, self.inner_optimizer, zip(grads, variables), aggregate)
            grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if not self.built:
            self.build(variables)
        if not self._unit_scale:
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
        return list(trainable_variables)

    def _unscale_factor(self, grads_unscaled):
        """The factor for the gradients: 1 if they are unscaled already, else 1/scale (see the class doc)."""
        reciprocal = tf.math.reciprocal(self.loss_scale)
        if grads_unscaled is not None:
            return tf.constant(1.0) if grads_unscaled else reciprocal
        if self._family != _KERAS:
            return tf.constant(1.0)  # tf_keras's contract: the caller unscaled (or was warned)
        if not (self._loss_has_been_scaled or self._gradients_have_been_unscaled or self._warned_unscaled) and (
                self._dynamic or self._initial_scale != 1.0):
            self._warned_unscaled = True
            warn_unscaled_keras_step()
        pending = self._pending_unscaled.variable
        count = pending.read_value()
        pending.assign(tf.maximum(count - 1.0, 0.0))
        return tf.where(count > 0.5, tf.constant(1.0), reciprocal)

    def _inner_apply(self, grads, variables):
        apply_to_inner(self._family, self.inner_optimizer, grads, variables)

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
            scaled_loss = self._scaled(loss)
        var_list = list(var_list() if callable(var_list) else var_list)
        grads = self._unscaled(tape.gradient(scaled_loss, var_list))
        return self.apply_gradients(zip(grads, var_list), grads_unscaled=True)

    # -- serialization -------------------------------------------------------------------------------------------

    def get_config(self):
        """Returns the config in the peer's layout: the serialized inner optimizer and the loss scale settings.

        Around a tf_keras optimizer it is tf_keras's LossScaleOptimizer config (no name; the inner optimizer as
        tf_keras serializes it), so that tf_keras alone loads an .h5 model saved with it, into its own wrapper.
        Around a Keras 3 optimizer it is Keras 3's (with the name; "dynamic" only when the scale is fixed).
        """
        config = {"inner_optimizer": serialize_inner(self.inner_optimizer, self._family), "dynamic": self._dynamic,
                  "initial_scale": self._initial_scale, "dynamic_growth_steps": self._growth_steps}
        if self._family == _KERAS:
            config = {"name": self.name, **config}
            if self._dynamic:
                del config["dynamic"]  # Keras 3's own config has no "dynamic" (it is always dynamic)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuilds an optimizer (without state) from `get_config()` output, Keras 3's or tf_keras's config.

        Args:
            config: the dict from `get_config` (also TF <= 2.3's and Keras 3's with base optimizer options).
            custom_objects: optional dict for deserializing a custom inner optimizer.

        Returns:
            A new LossScaleOptimizer.
        """
        config = legacy_config(dict(config))
        inner = deserialize_inner(config.pop("inner_optimizer"), custom_objects)
        return cls(inner, **config)


@keras.saving.register_keras_serializable(package="mp_rewrite")
class LossScaleOptimizerV3(LossScaleOptimizer):
    """What `LossScaleOptimizer(inner)` is around a new (non-legacy) tf_keras optimizer, as in tf_keras.

    The class adds nothing; its name does the work. tf_keras's .h5 files record the optimizer's class name, and
    tf_keras loads "LossScaleOptimizerV3" into its own wrapper for new optimizers ("LossScaleOptimizer" is its
    wrapper for legacy ones, which refuses them).
    """
