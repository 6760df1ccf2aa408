"""The methods of tf_keras's legacy (OptimizerV2) optimizers that a LossScaleOptimizer delegates to its inner one,
as tf_keras's own LossScaleOptimizer does: slots, weights, and `get_gradients` (scaled, then unscaled)."""

from __future__ import annotations

from .settings import _TF_KERAS_V2, LossScaleError


class LegacyOptimizerMethods:
    """Mixin of LossScaleOptimizer: tf_keras OptimizerV2 methods, delegated to the inner optimizer."""

    def _legacy_inner(self, method: str):
        if self._family != _TF_KERAS_V2:
            raise LossScaleError(f"{method}() belongs to tf_keras's legacy optimizers (tf_keras.optimizers.legacy); "
                                 f"the inner optimizer is a {type(self.inner_optimizer).__name__}")
        return self.inner_optimizer

    def get_slot(self, var, slot_name):
        """The inner optimizer's slot `slot_name` of `var` (tf_keras legacy optimizers)."""
        return self._legacy_inner("get_slot").get_slot(var, slot_name)

    def get_slot_names(self):
        """The inner optimizer's slot names (tf_keras legacy optimizers)."""
        return self._legacy_inner("get_slot_names").get_slot_names()

    def get_weights(self):
        """The inner optimizer's weights as numpy arrays (tf_keras legacy optimizers)."""
        return self._legacy_inner("get_weights").get_weights()

    def set_weights(self, weights):
        """Set the inner optimizer's weights (tf_keras legacy optimizers)."""
        self._legacy_inner("set_weights").set_weights(weights)

    def get_gradients(self, loss, params):
        """Gradients of `loss` for `params`, computed on the scaled loss and unscaled, as tf_keras does (legacy
        optimizers, graph mode)."""
        inner = self._legacy_inner("get_gradients")
        return self.get_unscaled_gradients(inner.get_gradients(self.get_scaled_loss(loss), params))
