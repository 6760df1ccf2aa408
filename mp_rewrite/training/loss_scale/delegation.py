"""What a LossScaleOptimizer forwards to its inner optimizer, per optimizer family, as tf_keras and Keras 3 do.

* Always: `iterations`, `learning_rate` (the same object), and hyperparameters on get and set — tf_keras's
  `_hyper` entries for a legacy inner optimizer, numeric constructor arguments (`beta_1`, `momentum`) for the
  others, and `lr` around either tf_keras family (its callbacks read it). Arbitrary attributes (`nesterov`) are
  not forwarded, as in tf_keras.
* tf_keras legacy inner optimizer: `clipnorm`, `global_clipnorm`, `clipvalue`, `weights`, `variables()`, slots
  (`legacy_methods.py`).
* tf_keras new inner optimizer: `use_ema`, `ema_momentum`, `finalize_variable_values`, `weights` (its
  `variables`, what tf_keras's .h5 saving reads), as LossScaleOptimizerV3.
* Keras 3 inner optimizer: the wrapper keeps Keras 3's own options (`use_ema` etc. are the wrapper's, and the
  constructor refuses them as Keras 3 does).
"""

import inspect
import numbers

import keras
import tensorflow as tf

from .legacy_methods import LEGACY_METHODS, PUBLIC_LEGACY_METHODS, legacy_method
from .settings import _BASE_ARGS, _KERAS, _TF_KERAS_V2, _TF_KERAS_V3

_LEGACY_OPTIONS = ("clipnorm", "global_clipnorm", "clipvalue")
_V3_OPTIONS = ("use_ema", "ema_momentum")


def _forwarded_option(name, families):
    """A property forwarding `name` to the inner optimizer for `families`, else kept on the wrapper itself."""

    def fget(self):
        if self.__dict__.get("_family") in families:
            return getattr(self.inner_optimizer, name)
        return self.__dict__.get(f"_own_{name}")

    def fset(self, value):
        if self.__dict__.get("_family") in families:
            setattr(self.inner_optimizer, name, value)
        else:  # Keras's own constructor sets these before the family is known
            self.__dict__[f"_own_{name}"] = value

    return property(fget, fset, doc=f"`{name}`: the inner optimizer's for a {' or '.join(families)} optimizer.")


class CallableList(list):
    """A list of variables that can also be called, for tf_keras legacy code that calls `optimizer.variables()`."""

    def __call__(self):
        return list(self)


class InnerDelegation:
    """Mixin of LossScaleOptimizer: attribute forwarding to `inner_optimizer` (see the module doc)."""

    clipnorm = _forwarded_option("clipnorm", (_TF_KERAS_V2,))
    global_clipnorm = _forwarded_option("global_clipnorm", (_TF_KERAS_V2,))
    clipvalue = _forwarded_option("clipvalue", (_TF_KERAS_V2,))
    use_ema = _forwarded_option("use_ema", (_TF_KERAS_V3,))
    ema_momentum = _forwarded_option("ema_momentum", (_TF_KERAS_V3,))

    @property
    def iterations(self):
        """The inner optimizer's step counter."""
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
        """The optimizer's variables.

        For a tf_keras legacy inner optimizer: its `variables()` (a list that can be called, as legacy code does),
        as tf_keras's LossScaleOptimizer returns. Otherwise this optimizer's own variables (the loss scale state),
        then the inner optimizer's.
        """
        inner = self.inner_optimizer.variables
        inner = list(inner() if callable(inner) else inner)
        if self._family == _TF_KERAS_V2:
            return CallableList(inner)
        return list(self._variables) + inner

    @property
    def weights(self):
        """The inner tf_keras optimizer's weights (what tf_keras's .h5 saving stores: a legacy optimizer's `weights`,
        a new one's `variables`); Keras 3 optimizers have none."""
        family = self.__dict__.get("_family")
        if family == _TF_KERAS_V2:
            return self.inner_optimizer.weights
        if family == _TF_KERAS_V3:
            return list(self.inner_optimizer.variables)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute 'weights'")

    def finalize_variable_values(self, var_list):
        """Keras's end-of-training hook: the inner optimizer's for a tf_keras inner optimizer (its EMA), else Keras's.

        Args:
            var_list: the model's trainable variables.
        """
        if self._family == _TF_KERAS_V3:
            return self.inner_optimizer.finalize_variable_values(var_list)
        return super().finalize_variable_values(var_list)

    def _hyperparameter_names(self):
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            return set()
        if self._family == _TF_KERAS_V2:
            names = set(inner._hyper)
            return names | {"lr"} if "learning_rate" in names else names
        # Keras 3 and tf_keras's new optimizers have no registry: take the numeric constructor arguments
        # (and tf_keras's `lr` alias, which its callbacks read).
        names = {"learning_rate", "lr"} if self._family == _TF_KERAS_V3 else {"learning_rate"}
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
        attribute = inspect.getattr_static(type(self), name, None)
        if isinstance(attribute, property):  # forwarded or read-only: no tracking by Keras, no read before write
            object.__setattr__(self, name, value)
            return
        if (not name.startswith("_") and name not in self.__dict__ and attribute is None
                and name in self._hyperparameter_names()):
            setattr(self.inner_optimizer, name, value)
            return
        super().__setattr__(name, value)

    def __dir__(self):
        names = set(super().__dir__()) | self._hyperparameter_names()
        if self.__dict__.get("_family") == _TF_KERAS_V2:
            names |= set(PUBLIC_LEGACY_METHODS)  # TF's checkpoint looks for get_slot_names with dir()
        elif self.__dict__.get("_family") == _KERAS:
            names.discard("weights")
        return sorted(names)
