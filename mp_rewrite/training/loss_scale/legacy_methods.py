"""The methods of tf_keras's legacy (OptimizerV2) optimizers that a LossScaleOptimizer delegates to its inner one,
as tf_keras's own LossScaleOptimizer does: slots (and the hooks TF's checkpoint restores slots through), weights,
and `get_gradients` (scaled, then unscaled).

They exist only when the inner optimizer is a legacy one: code that probes `hasattr(opt, "get_slot_names")` (TF's
checkpointing does) must not find them on a Keras 3 optimizer."""

from __future__ import annotations

from .settings import _TF_KERAS_V2

PUBLIC_LEGACY_METHODS = ("get_slot", "get_slot_names", "add_slot", "get_gradients")
# Reached through LossScaleOptimizer.__getattr__; the private ones are what TF's checkpoint restore calls.
LEGACY_METHODS = PUBLIC_LEGACY_METHODS + ("_create_or_restore_slot_variable", "_restore_slot_variable",
                                          "_create_all_weights")


def legacy_method(lso, name: str):
    """The bound delegating method `name` of a LossScaleOptimizer `lso` whose inner optimizer is legacy."""
    inner = lso.inner_optimizer
    if name == "get_gradients":
        def get_gradients(loss, params):
            """Gradients of `loss` for `params`: computed on the scaled loss, then unscaled (tf_keras's order)."""
            return lso.get_unscaled_gradients(inner.get_gradients(lso.get_scaled_loss(loss), params))
        return get_gradients
    return getattr(inner, name)


class LegacyWeights:
    """Mixin of LossScaleOptimizer: get_weights/set_weights are the inner legacy optimizer's (Keras 3's Optimizer
    has its own, which would read the wrapper's variables)."""

    def get_weights(self):
        """The inner optimizer's weights for a tf_keras legacy inner optimizer, else Keras's."""
        return self.inner_optimizer.get_weights() if self._family == _TF_KERAS_V2 else super().get_weights()

    def set_weights(self, weights):
        """Set the inner optimizer's weights for a tf_keras legacy inner optimizer, else Keras's."""
        if self._family == _TF_KERAS_V2:
            return self.inner_optimizer.set_weights(weights)
        return super().set_weights(weights)
