"""Loss scale settings: defaults, bounds, TF's argument checks and messages, and optimizer families.

The `loss_scale` argument of enable_mixed_precision_graph_rewrite and LossScaleOptimizer's own arguments are
validated here, with TF's error messages; `loss_scale.py` holds the optimizer itself.
"""

import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Mapping

import keras
import tensorflow as tf

from ...errors import OptionError

MIN_LOSS_SCALE = 1.0
MAX_LOSS_SCALE = 2.0**64  # far above any useful scale, and its reciprocal is still a normal float32
SCALE_HISTORY_SIZE = 64  # scale changes kept for `scale_history`
DEFAULT_INITIAL_SCALE = 2.0**15
DEFAULT_GROWTH_STEPS = 2000

_KERAS, _TF_KERAS_V2, _TF_KERAS_V3 = "keras", "tf_keras_v2", "tf_keras_v3"
# Constructor arguments every optimizer has: options, not hyperparameters the wrapper should forward.
_BASE_ARGS = frozenset(
    "self name kwargs weight_decay clipnorm clipvalue global_clipnorm use_ema ema_momentum ema_overwrite_frequency "
    "loss_scale_factor gradient_accumulation_steps jit_compile mesh".split()
)
_SETTINGS = ("dynamic", "initial_scale", "dynamic_growth_steps")
# Keras 3's base optimizer options and their defaults: a Keras 3 LossScaleOptimizer config may carry them.
_KERAS_BASE_DEFAULTS = {"weight_decay": None, "clipnorm": None, "global_clipnorm": None, "clipvalue": None,
                        "use_ema": False, "ema_momentum": 0.99, "ema_overwrite_frequency": None,
                        "loss_scale_factor": None, "gradient_accumulation_steps": None}
# The update uses tf.cond/tf.where explicitly; letting AutoGraph rewrite this module costs seconds per trace.


class LossScaleError(OptionError, ValueError):
    """An invalid loss scale setting, optimizer or call context (a ValueError, as TF raises)."""


class LossScaleTypeError(OptionError, TypeError):
    """An argument of the wrong type: `dynamic`, the inner optimizer, a LossScale subclass (a TypeError, as in TF)."""


def _tf_keras():
    # Only look at tf_keras if the caller imported it (a tf_keras optimizer implies so); importing it is slow.
    return sys.modules.get("tf_keras")


def _optimizer_family(opt):
    if isinstance(opt, keras.optimizers.Optimizer):
        return _KERAS
    tfk = _tf_keras()
    if tfk is not None and isinstance(opt, tfk.optimizers.legacy.Optimizer):
        return _TF_KERAS_V2
    if tfk is not None and isinstance(opt, tfk.optimizers.Optimizer):
        return _TF_KERAS_V3
    return None


def is_loss_scale_optimizer(opt):
    """Whether `opt` already scales the loss (ours, Keras 3's, tf_keras's or TF v1's loss scale optimizer).

    Args:
        opt: any object.

    Returns:
        True if `opt` is a loss scale optimizer of any of those libraries.
    """
    classes = [keras.optimizers.LossScaleOptimizer, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer]
    tfk = _tf_keras()
    if tfk is not None:
        classes.append(tfk.mixed_precision.LossScaleOptimizer)
    return isinstance(opt, tuple(classes))


def _check_strategy_supported():
    strategy = tf.distribute.get_strategy()
    supported = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy,
                 tf.distribute.OneDeviceStrategy, tf.compat.v1.distribute.MirroredStrategy,
                 tf.compat.v1.distribute.OneDeviceStrategy)
    if not tf.distribute.has_strategy() or isinstance(strategy, supported):
        return
    if "TPU" in type(strategy).__name__:
        raise LossScaleError(
            "Loss scaling is not supported with TPUStrategy. Loss scaling is unnecessary with TPUs, since "
            "they support bfloat16 instead of float16 and bfloat16 does not require loss scaling.")
    raise LossScaleError(f"Loss scaling is not supported with the tf.distribute.Strategy: {type(strategy).__name__}. "
                         "Try using a different Strategy, e.g. a MirroredStrategy")


def _check_wrapper_kwargs(kwargs):
    """Keras 3's check: base optimizer options only at their defaults (configs carry them), with its messages."""
    for arg, default in _KERAS_BASE_DEFAULTS.items():
        if arg in kwargs and kwargs.pop(arg) != default:
            raise LossScaleError(f"LossScaleOptimizer does not support `{arg}`. Instead, set `{arg}` on the "
                                 "`inner_optimizer`.")
    if kwargs:
        raise LossScaleError(f"LossScaleOptimizer does not support arguments: {', '.join(f'`{k}`' for k in kwargs)}.")


def _check_settings(dynamic, initial_scale, dynamic_growth_steps, family=None):
    """Validates the constructor settings (in tf_keras's order) and returns them with defaults filled in."""
    if not isinstance(dynamic, bool):
        raise LossScaleTypeError(
            f'"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, but got: {dynamic!r}')
    if not dynamic and initial_scale is None:
        hint = (" (Keras 3's own LossScaleOptimizer has no fixed scale; there, set `loss_scale_factor` on the inner "
                "optimizer instead)") if family == _KERAS else ""
        raise LossScaleError(f'"initial_scale" must be specified if "dynamic" is False{hint}')
    if not dynamic and dynamic_growth_steps is not None:
        raise LossScaleError(
            f'"dynamic_growth_steps" must be None if "dynamic" is False, but got: {dynamic_growth_steps}')
    # What tf_keras accepts (anything float() and int() take: 0.5, True, 2.0), except values that cannot work:
    # a scale that is not positive and finite, or a growth period that is not a whole number of steps.
    initial_scale = DEFAULT_INITIAL_SCALE if initial_scale is None else initial_scale
    try:
        scale = float(initial_scale)
    except (TypeError, ValueError):
        scale = math.nan
    if not 0 < scale <= MAX_LOSS_SCALE:
        raise LossScaleError(f'"initial_scale" must be a number greater than 0 and at most 2**64 (the largest loss '
                             f"scale), but got: {initial_scale!r}")
    if dynamic:
        steps = DEFAULT_GROWTH_STEPS if dynamic_growth_steps is None else dynamic_growth_steps
        try:
            whole = float(steps).is_integer() and steps >= 1
        except (TypeError, ValueError):
            whole = False
        if not whole:
            raise LossScaleError(
                '"dynamic_growth_steps" must be a positive whole number (the number of consecutive finite steps '
                f"after which the loss scale doubles), but got: {dynamic_growth_steps!r}")
        dynamic_growth_steps = int(steps)
    return scale, dynamic_growth_steps


def _check_inner(inner_optimizer):
    """Returns the optimizer family of `inner_optimizer`, raising tf_keras's errors for what cannot be wrapped."""
    if is_loss_scale_optimizer(inner_optimizer):
        raise LossScaleTypeError(
            f"LossScaleOptimizer cannot wrap another LossScaleOptimizer, but got: {inner_optimizer}")
    family = _optimizer_family(inner_optimizer)
    if family is None:
        raise LossScaleTypeError(
            '"inner_optimizer" must be an instance of `tf.keras.optimizers.Optimizer` or '
            f"`tf.keras.optimizers.experimental.Optimizer`, but got: {inner_optimizer}. (mp_rewrite wraps Keras 3 "
            "optimizers and tf_keras optimizers, legacy and new.)")
    # tf_keras refuses a second wrapper: both would claim the inner optimizer's checkpoint layout. Keras 3 nests
    # the inner optimizer under its wrapper's checkpoint node and allows it.
    if family != _KERAS and getattr(inner_optimizer, "_is_wrapped_by_loss_scale_optimizer", False):
        raise LossScaleError('"inner_optimizer" is already wrapped by a LossScaleOptimizer. An optimizer can only be '
                             "wrapped by a single LossScaleOptimizer")
    return family


def settings_from_loss_scale(loss_scale):
    """Translates enable_mixed_precision_graph_rewrite's `loss_scale` into LossScaleOptimizer keyword arguments."""
    if loss_scale is None:  # no loss scaling, but still a LossScaleOptimizer, so both scaling APIs keep working
        return {"dynamic": False, "initial_scale": 1.0}
    if isinstance(loss_scale, str) and loss_scale == "dynamic":
        return {}
    if isinstance(loss_scale, numbers.Real) and not isinstance(loss_scale, bool):
        return {"dynamic": False, "initial_scale": loss_scale}
    if isinstance(loss_scale, Mapping):
        unknown = sorted(set(loss_scale) - set(_SETTINGS))
        if unknown:
            raise LossScaleError(
                f"Invalid key(s) {unknown} in the loss_scale dict; the valid keys are {list(_SETTINGS)}.")
        return dict(loss_scale)
    v1 = tf.compat.v1.mixed_precision
    if isinstance(loss_scale, v1.FixedLossScale):
        return {"dynamic": False, "initial_scale": float(loss_scale._loss_scale_value)}
    if isinstance(loss_scale, v1.DynamicLossScale):
        if loss_scale.multiplier != 2:
            raise LossScaleError(
                'When passing a DynamicLossScale to "loss_scale", DynamicLossScale.multiplier must be 2. '
                f"Got: {loss_scale}")
        return {"initial_scale": loss_scale.initial_loss_scale, "dynamic_growth_steps": loss_scale.increment_period}
    if isinstance(loss_scale, v1.LossScale):
        raise LossScaleTypeError(
            "Passing a LossScale that is not a FixedLossScale or a DynamicLossScale is not supported. "
            f"Got: {loss_scale}")
    raise LossScaleError(
        'Invalid value passed to loss_scale. loss_scale must be the string "dynamic" (recommended), an '
        "int, a float, None (no loss scaling), a dict of LossScaleOptimizer settings "
        f"({', '.join(_SETTINGS)}), a FixedLossScale, or a DynamicLossScale. Got value: {loss_scale!r}")


def serialize_inner(inner, family):
    """The inner optimizer's config as its own library serializes it (tf_keras's or Keras 3's)."""
    if family == _KERAS:
        return keras.saving.serialize_keras_object(inner)
    return _tf_keras().optimizers.serialize(inner)


def _written_by_tf_keras(config) -> bool:
    """Whether an inner optimizer config comes from tf_keras or tf.keras: it has no "module" (Keras 2, TF <= 2.3),
    or tf_keras's keys ("is_legacy_optimizer" in new optimizers, "decay" in legacy ones) under its "keras.optimizers"
    module name, which Keras 3 configs share."""
    inner_config = config.get("config", {})
    tf_keras_keys = "is_legacy_optimizer" in inner_config or "decay" in inner_config
    return "class_name" in config and (
        "module" not in config or (str(config["module"]).startswith("keras.optimizers") and tf_keras_keys))


def deserialize_inner(config, custom_objects):
    """Rebuild the inner optimizer of a LossScaleOptimizer config (Keras 3 or tf_keras).

    A config written by tf_keras or tf.keras (see `_written_by_tf_keras`) is rebuilt by tf_keras, as tf_keras's
    LossScaleOptimizer does (a legacy optimizer when the config says so, or has the legacy "decay" key).
    """
    module = config.get("module") or ""
    if module.startswith("tf_keras"):
        # Keras 3's deserializer cannot locate tf_keras classes; they rebuild themselves from their own config.
        return getattr(importlib.import_module(module), config["class_name"]).from_config(config["config"])
    if _written_by_tf_keras(config) and importlib.util.find_spec("tf_keras") is not None:
        optimizers = importlib.import_module("tf_keras.optimizers")
        inner_config = config.get("config", {})
        legacy = inner_config.get("is_legacy_optimizer", "decay" in inner_config)
        return optimizers.deserialize(config, custom_objects=custom_objects, use_legacy_optimizer=legacy)
    return keras.saving.deserialize_keras_object(config, custom_objects=custom_objects)


def legacy_config(config: dict) -> dict:
    """A TF <= 2.3 config ({"optimizer", "loss_scale"}) in today's form, as tf_keras's from_config reads it.

    Raises:
        LossScaleError: a DynamicLossScale whose multiplier is not 2, or another kind of LossScale.
    """
    if "loss_scale" not in config:
        return config
    loss_scale, kinds = config.pop("loss_scale"), tf.compat.v1.mixed_precision
    if isinstance(loss_scale, dict):
        cls = {"FixedLossScale": kinds.FixedLossScale, "DynamicLossScale": kinds.DynamicLossScale}.get(
            loss_scale.get("class_name"))
        if cls is None:
            raise LossScaleError("Serialized LossScaleOptimizers with a LossScale that is neither a FixedLossScale "
                                 "nor a DynamicLossScale can no longer be deserialized")
        loss_scale = cls.from_config(loss_scale.get("config", {}))
    if isinstance(loss_scale, kinds.FixedLossScale):
        config.update(dynamic=False, initial_scale=loss_scale._loss_scale_value)
    elif isinstance(loss_scale, kinds.DynamicLossScale):
        if loss_scale.multiplier != 2:
            raise LossScaleError("Cannot deserialize LossScaleOptimizer with a DynamicLossScale whose multiplier is "
                                 f"not 2. Got DynamicLossScale: {loss_scale}")
        config.update(dynamic=True, initial_scale=loss_scale.initial_loss_scale,
                      dynamic_growth_steps=loss_scale.increment_period)
    config["inner_optimizer"] = config.pop("optimizer")
    return config
