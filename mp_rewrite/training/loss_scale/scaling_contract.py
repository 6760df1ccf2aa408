"""Who unscales the gradients, and how gradients reach the inner optimizer, per optimizer family.

The `apply_gradients` contract follows the library the inner optimizer comes from:

* tf_keras optimizers (legacy and new): `apply_gradients` never unscales. The caller unscales with
  `get_unscaled_gradients` (or uses `minimize`), and tf_keras's warnings (through `tf_logging`, its three texts)
  say when `get_scaled_loss` or `get_unscaled_gradients` was not called. Gradients are transformed and aggregated
  with the inner optimizer's own hooks first (legacy `gradient_aggregator`, `aggregate_gradients`), then checked
  for finiteness, then applied with aggregation off, as tf_keras does: a NaN that aggregation introduces (or
  that one replica contributes) skips the step.
* Keras 3 optimizers: `apply`/`apply_gradients` take the gradients of the scaled loss (`scale_loss`) and unscale
  them, as Keras 3 does. Gradients that came from `get_unscaled_gradients` (tf_keras's API, which Keras 3's
  wrapper lacks) are not unscaled again: each call of it lets the next apply take its gradients as they are,
  counted per replica at run time, so two `get_unscaled_gradients` calls cover the next two applies.
"""

import importlib
import logging

import tensorflow as tf

from .settings import _KERAS, _TF_KERAS_V2, _TF_KERAS_V3

logger = logging.getLogger("mp_rewrite")

_EXAMPLE = """
    with tf.GradientTape() as tape:
      loss = loss_fn()
      scaled_loss = opt.get_scaled_loss(loss)
    scaled_grads = tape.gradient(scaled_loss, vars)
    grads = opt.get_unscaled_gradients(scaled_grads)
    opt.apply_gradients([(grads, var)])"""
_MORE = ("\nFor more information, see "
         "https://www.tensorflow.org/api_docs/python/tf/tf_keras/mixed_precision/LossScaleOptimizer")


def warn_about_scaling(loss_has_been_scaled, gradients_have_been_unscaled):
    """tf_keras's `_maybe_warn_about_scaling`: its three warnings, through `tf_logging`, with its texts.

    Args:
        loss_has_been_scaled: whether `get_scaled_loss` was ever called on the optimizer.
        gradients_have_been_unscaled: whether `get_unscaled_gradients` was ever called on it.
    """
    if loss_has_been_scaled and gradients_have_been_unscaled:
        return
    if not loss_has_been_scaled and not gradients_have_been_unscaled:
        text = ("You forgot to call LossScaleOptimizer.get_scaled_loss() and "
                "LossScaleOptimizer.get_unscaled_gradients() before calling "
                "LossScaleOptimizer.apply_gradients(). This will likely result in worse model quality, so please "
                "call them in the correct places! ")
    elif not loss_has_been_scaled:
        text = ("You forgot to call LossScaleOptimizer.get_scaled_loss() before calling "
                "LossScaleOptimizer.apply_gradients() (you did call get_unscaled_gradients() however). This will "
                "likely result in worse model quality, so please call get_scaled_loss() in the correct place! ")
    else:
        text = ("You forgot to call LossScaleOptimizer.get_unscaled_gradients() before calling "
                "LossScaleOptimizer.apply_gradients() (you did call get_scaled_loss() however). This will likely "
                "result in worse model quality, so please call get_unscaled_gradients() in the correct place! ")
    tf.compat.v1.logging.warning(f"{text}For example:{_EXAMPLE}{_MORE}")


def warn_unscaled_keras_step():
    """The Keras 3 family's warning when no scaling method was ever called (logged once per optimizer)."""
    logger.warning("LossScaleOptimizer.apply_gradients() was called, but neither scale_loss(), get_scaled_loss() "
                   "nor get_unscaled_gradients() was: the gradients are taken to be scaled and are divided by "
                   "the loss scale.")


def aggregate_for_inner(family, inner, grads_and_vars, aggregate):
    """tf_keras's order: transform and aggregate with the inner optimizer's hooks before the finiteness check.

    Args:
        family: the inner optimizer's family.
        inner: the inner optimizer.
        grads_and_vars: (gradient, variable) pairs.
        aggregate: whether the caller asked for aggregation (tf_keras's `experimental_aggregate_gradients` and
            not `skip_gradients_aggregation`).

    Returns:
        The (gradient, variable) pairs to check and apply; for a legacy inner optimizer without None gradients
        (tf_keras's `filter_empty_gradients`, which raises when every gradient is None).
    """
    if family == _TF_KERAS_V2:
        utils = importlib.import_module("tf_keras.src.optimizers.utils")
        grads_and_vars = utils.filter_empty_gradients(grads_and_vars)
        if aggregate:
            grads_and_vars = inner._transform_unaggregated_gradients(grads_and_vars)
            grads_and_vars = inner._aggregate_gradients(grads_and_vars)
    elif family == _TF_KERAS_V3 and aggregate:
        grads_and_vars = inner.aggregate_gradients(grads_and_vars)
    return list(grads_and_vars)


def apply_to_inner(family, inner, grads, variables, name=None):
    """The inner optimizer's update, with aggregation off for tf_keras (the wrapper aggregated already)."""
    if family == _KERAS:
        return inner.apply(grads, variables)
    pairs = list(zip(grads, variables))
    if family == _TF_KERAS_V2:
        return inner.apply_gradients(pairs, name=name, experimental_aggregate_gradients=False)
    return inner.apply_gradients(pairs, skip_gradients_aggregation=True)
