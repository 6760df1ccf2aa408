"""tf_keras's `Model.compile` and `tf_keras.optimizers.get` accept a LossScaleOptimizer, as they accept tf_keras's own.

tf_keras's `compile(optimizer=...)` passes the optimizer through `tf_keras.optimizers.get`, which returns instances
of tf_keras's optimizer classes and refuses anything else ("Could not interpret optimizer identifier"). tf_keras's
LossScaleOptimizer passes because it subclasses them; ours subclasses Keras 3's (so that Keras 3's `compile` never
wraps it again) and cannot subclass both. The check is a plain `isinstance` with no registry to extend, so wrapping a
tf_keras optimizer installs, once, a `get` that returns our LossScaleOptimizer unchanged and hands everything else
to tf_keras's. Everything else `fit` needs (`minimize(loss, vars, tape=)`, `iterations`, `lr`, checkpoints and
`get_config` in tf_keras's layout) is the optimizer's own.
"""

import sys

_INSTALLED = "_mp_rewrite_accepts_loss_scale_optimizer"


def accept_in_tf_keras(lso_class) -> None:
    """Make tf_keras's `optimizers.get` (what `Model.compile` calls) return instances of `lso_class` unchanged."""
    optimizers = sys.modules.get("tf_keras.src.optimizers")
    if optimizers is None or getattr(optimizers.get, _INSTALLED, False):
        return
    tf_keras_get = optimizers.get

    def get(identifier, **kwargs):
        if isinstance(identifier, lso_class):
            return identifier
        return tf_keras_get(identifier, **kwargs)

    get.__doc__ = tf_keras_get.__doc__
    setattr(get, _INSTALLED, True)
    # Both names bind the same function: the private module's (what compile calls) and the public API's.
    for name in ("tf_keras.src.optimizers", "tf_keras.optimizers"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get", None) is tf_keras_get:
            module.get = get
