"""Checkpoint layout of a LossScaleOptimizer, per inner optimizer family, so checkpoints restore across libraries.

* tf_keras inner optimizer: tf_keras's layout. tf_keras's LossScaleOptimizer delegates tracking to its inner
  optimizer (`DelegatingTrackableMixin`), so a checkpoint holds the inner optimizer's own children directly under
  the optimizer (`optimizer/iter`, `optimizer/learning_rate`, slots `var/.OPTIMIZER_SLOT/optimizer/momentum`),
  plus `loss_scale/{current_loss_scale,good_steps}` for a dynamic scale and, for a legacy inner optimizer, an
  empty `base_optimizer` node (TF 2.2 checkpoints kept slots there). A bare tf_keras optimizer's checkpoint
  therefore restores into the wrapper and back, and tf_keras's wrapper and this one read each other's checkpoints.
* Keras 3 inner optimizer: Keras 3's LossScaleOptimizer layout (`optimizer/inner_optimizer/...`,
  `optimizer/dynamic_scale`, `optimizer/step_counter`): Keras's own attribute tracking, except the wrapper's
  `_variables` list, which is not saved (every variable in it is saved under its attribute name). Reading it back
  from a Keras 3 LossScaleOptimizer checkpoint, its entries 0-3 (the wrapper's iterations and learning rate,
  `step_counter`, `dynamic_scale`) are matched as Keras 3 matches them; any further entry means the checkpoint is
  a bare Keras 3 optimizer's (its slots), which would otherwise be restored into the loss scale state by
  position: that raises, as does Keras 3's wrapper (there with a dtype error), instead of corrupting the scale.

Either way the nodes are exactly the peer's. This wrapper's diagnostics (`skipped_steps`, the scale history) are
saved as tensors of the optimizer node itself, not as nodes of their own: a peer's checkpoint restores into this
wrapper with `assert_existing_objects_matched()` holding (the diagnostics then start from zero), and a peer
reading this wrapper's checkpoint finds only values it does not use.
"""

import tensorflow as tf

from .settings import _KERAS, _TF_KERAS_V2, _TF_KERAS_V3, LossScaleError

_Trackable = tf.__internal__.tracking.Trackable
# checkpoint name -> attribute of the optimizer
DIAGNOSTICS = {"skipped_steps": "_skipped_steps", "scale_history_steps": "_history_steps",
               "scale_history_scales": "_history_scales", "scale_history_count": "_history_count"}


class LossScaleNode(_Trackable):
    """The `loss_scale` checkpoint node: named variables, as tf_keras's `_DynamicLossScaleState` saves them."""

    def __init__(self, variables):
        super().__init__()
        for name, variable in variables.items():
            self._track_trackable(variable, name)


class BaseOptimizerNode(_Trackable):
    """tf_keras's `FakeOptimizerForRestoration`: restores slots that TF 2.2 checkpoints saved under this node."""

    def __init__(self, optimizer):
        super().__init__()
        self._optimizer = optimizer

    def get_slot_names(self):
        """The inner optimizer's slot names."""
        return self._optimizer.get_slot_names()

    def _create_or_restore_slot_variable(self, slot_variable_position, slot_name, variable, **kwargs):
        return self._optimizer._create_or_restore_slot_variable(slot_variable_position, slot_name, variable,
                                                                **kwargs)


class KerasVariablesGuard(_Trackable):
    """Stands for the wrapper's `_variables` list when a checkpoint is read (see the module doc)."""

    def __init__(self, optimizer):
        super().__init__()
        self._optimizer = optimizer

    def _lookup_dependency(self, name, cached_dependencies=None):
        opt = self._optimizer
        keras_order = [opt._iterations, opt._learning_rate]
        if opt.dynamic:
            keras_order += [opt.step_counter, opt.dynamic_scale]
        if name.isdigit() and int(name) < len(keras_order):
            return keras_order[int(name)]
        raise LossScaleError(
            f"the checkpoint holds optimizer variable #{name} where a LossScaleOptimizer around a Keras 3 optimizer "
            "has none: it looks like the checkpoint of a bare Keras 3 optimizer. Restore it into the inner "
            "optimizer, e.g. tf.train.Checkpoint(optimizer=lso.inner_optimizer, ...), then save the wrapper.")


class TfKerasCheckpointLayout:
    """Mixin of LossScaleOptimizer: checkpoints in tf_keras's layout when the inner optimizer is tf_keras's."""

    def _create_layout_nodes(self, state):
        """Build the extra checkpoint nodes; `state` maps tf_keras's names to this optimizer's variables."""
        nodes = {}
        if self._family in (_TF_KERAS_V2, _TF_KERAS_V3) and state:
            nodes["loss_scale"] = LossScaleNode(state)
        if self._family == _TF_KERAS_V2:
            nodes["base_optimizer"] = BaseOptimizerNode(self.inner_optimizer)
        self.__dict__["_layout_nodes"] = nodes  # not an attribute Keras should track

    def _delegates_tracking(self):
        return self.__dict__.get("_family") in (_TF_KERAS_V2, _TF_KERAS_V3) and "_layout_nodes" in self.__dict__

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if not self._delegates_tracking():
            children = super()._trackable_children(save_type, **kwargs)
            if self.__dict__.get("_family") == _KERAS:
                for name in ("_variables", *DIAGNOSTICS.values()):
                    children.pop(name, None)
            return children
        children = dict(self.inner_optimizer._trackable_children(save_type, **kwargs))
        clash = sorted(set(children) & set(self._layout_nodes))
        if clash:
            raise LossScaleError(f"cannot checkpoint {type(self.inner_optimizer).__name__} inside a "
                                 f"LossScaleOptimizer: it tracks {clash}, names the loss scale state needs")
        children.update(self._layout_nodes)
        return children

    def _lookup_dependency(self, name, cached_dependencies=None):
        if not self._delegates_tracking():
            if name == "_variables" and self.__dict__.get("_family") == _KERAS:
                return KerasVariablesGuard(self)
            return super()._lookup_dependency(name, cached_dependencies)
        if name in self._layout_nodes:
            return self._layout_nodes[name]
        return self.inner_optimizer._lookup_dependency(name, cached_dependencies)

    @property
    def _deferred_dependencies(self):
        # Restores of children the inner optimizer creates later (legacy hyperparameters, `iter`) wait there.
        if self._delegates_tracking():
            return self.inner_optimizer._deferred_dependencies
        return super()._deferred_dependencies

    def _handle_deferred_dependencies(self, name, trackable):
        if self._delegates_tracking():
            return  # the wrapper's own attributes are not in tf_keras's layout; nothing waits for them
        super()._handle_deferred_dependencies(name, trackable)

    def _serialize_to_tensors(self):
        if not self.__dict__.get("_dynamic"):
            return {}
        return {name: tf.convert_to_tensor(getattr(self, attribute)) for name, attribute in DIAGNOSTICS.items()}

    def _restore_from_tensors(self, restored_tensors):
        for name, tensor in restored_tensors.items():
            getattr(self, DIAGNOSTICS[name]).assign(tensor)
