"""Dynamic loss scaling: the per-step update of the scale, and skipping steps with non-finite gradients.

`DynamicScaleUpdate` is a mixin of LossScaleOptimizer: it owns how one step is applied or skipped (every replica
agrees), how the scale halves or grows within [MIN_LOSS_SCALE, MAX_LOSS_SCALE], the ring buffer of recent scale
changes, and the log lines. The optimizer class owns the API and the state variables.
"""

import logging

import keras
import tensorflow as tf

from .settings import _KERAS, MAX_LOSS_SCALE, MIN_LOSS_SCALE, SCALE_HISTORY_SIZE

UNSCALE_SCOPE = "mp_rewrite_unscale"

logger = logging.getLogger("mp_rewrite")


def multiply(grad, factor):
    """`grad * factor`, keeping None and IndexedSlices; half-precision values are scaled in float32.

    The ops sit in the name scope UNSCALE_SCOPE, which the training rewrite keeps in float32: otherwise the graph
    rewrite would run the unscale Mul in float16 (an infer op right after the gradient MatMuls) and flush
    unscaled gradients below float16's range (6e-8) to zero.
    """
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(multiply(grad.values, factor), grad.indices, grad.dense_shape)
    grad = tf.convert_to_tensor(grad)
    with tf.name_scope(UNSCALE_SCOPE):
        if grad.dtype in (tf.float16, tf.bfloat16):
            # The reciprocal of a large scale underflows in float16 (2**-25 is 0), so unscale in float32.
            return tf.cast(tf.cast(grad, tf.float32) * factor, grad.dtype)
        return grad * tf.cast(factor, grad.dtype)


def all_finite(grads):
    flags = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
             for g in grads if g is not None]
    return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def _in_xla_context():
    from tensorflow.python.ops import control_flow_util  # TF-internal; no public way to ask

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _log_scale_event(step, old_scale, new_scale, finite, skipped):
    """Host callback: one log line per skipped step or scale growth (no line on ordinary steps)."""
    step, old_scale, new_scale, skipped = int(step), float(old_scale), float(new_scale), int(skipped)
    if bool(finite):
        logger.debug("loss scale grew %g -> %g at step %d", old_scale, new_scale, step)
    elif old_scale * 0.5 < MIN_LOSS_SCALE:
        logger.warning("non-finite gradients at step %d with the loss scale at its minimum of %g: step skipped "
                       "(%d skipped so far). The overflow does not come from the loss scale; look for NaN/Inf in "
                       "the model or data.", step, new_scale, skipped)
    else:
        logger.info("non-finite gradients at step %d: step skipped, loss scale %g -> %g (%d skipped so far)",
                    step, old_scale, new_scale, skipped)
    return []



class DynamicScaleUpdate:
    """Mixin: apply a step or skip it on every replica, then update the dynamic scale (see the module doc)."""

    def _create_dynamic_state(self, scalar):
        """Create the dynamic scale's variables with `scalar(name, dtype, init="zeros", shape=())`."""
        self.dynamic_scale = scalar("current_loss_scale", "float32", keras.initializers.Constant(self._initial_scale))
        self.step_counter = scalar("good_steps", "int64")
        self._skipped_steps = scalar("skipped_steps", "int64")
        self._history_steps = scalar("scale_history_steps", "int64", shape=(SCALE_HISTORY_SIZE,))
        self._history_scales = scalar("scale_history_scales", "float32", shape=(SCALE_HISTORY_SIZE,))
        self._history_count = scalar("scale_history_count", "int64")

    @property
    def dynamic_counter(self):
        """The int64 variable counting consecutive finite steps, or None for a fixed scale."""
        return self.step_counter if self._dynamic else None

    @property
    def skipped_steps(self):
        """The int64 variable counting steps skipped for non-finite gradients, or None for a fixed scale."""
        return self._skipped_steps if self._dynamic else None

    @property
    def scale_history(self):
        """list[(step, scale)]: the last `SCALE_HISTORY_SIZE` changes of the scale, oldest first (read eagerly).

        `step` is the value of `iterations` after the step that changed the scale; the scale before the first
        change is `initial_scale`. Always empty for a fixed scale.
        """
        if not self._dynamic:
            return []
        count = int(self._history_count.numpy())
        steps, scales = self._history_steps.numpy(), self._history_scales.numpy()
        order = [i % SCALE_HISTORY_SIZE for i in range(max(0, count - SCALE_HISTORY_SIZE), count)]
        return [(int(steps[i]), float(scales[i])) for i in order]

    def _apply_dynamic(self, grads, variables):
        # Every replica must agree on skipping, so the non-finite flags are summed over replicas before deciding.
        nonfinite = tf.cast(tf.logical_not(all_finite(grads)), tf.float32)
        context = tf.distribute.get_replica_context()
        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, nonfinite)
            self._apply_or_skip(tf.equal(total, 0.0), lambda: self._inner_apply(grads, variables))
            return

        def merge_fn(distribution, nonfinite, grads):
            # Variables are closed over, not passed: a merge_call would unwrap MirroredVariables to components.
            def apply_fn():
                distribution.extended.call_for_each_replica(lambda g: self._inner_apply(g, variables), args=(grads,))

            total = distribution.reduce(tf.distribute.ReduceOp.SUM, nonfinite, axis=None)
            # A cond in cross-replica context: a replica-context cond may not contain the inner optimizer's merge_call.
            self._apply_or_skip(tf.equal(total, 0.0), apply_fn)

        context.merge_call(merge_fn, args=(nonfinite, grads))

    def _apply_or_skip(self, finite, apply_fn):
        def skip_fn():
            iterations = self.inner_optimizer._iterations if self._family == _KERAS else self.inner_optimizer.iterations
            iterations.assign_add(1)

        tf.cond(finite, apply_fn, skip_fn)
        self._update_scale(finite)

    def _update_scale(self, finite):
        old = tf.convert_to_tensor(self.dynamic_scale)
        counter = tf.convert_to_tensor(self.step_counter)
        grow = tf.logical_and(finite, counter + 1 >= self._growth_steps)
        new = tf.where(finite, tf.where(grow, tf.minimum(old * 2.0, MAX_LOSS_SCALE), old),
                       tf.maximum(old * 0.5, min(MIN_LOSS_SCALE, self._initial_scale)))
        self.dynamic_scale.assign(new)
        self.step_counter.assign(tf.where(finite & ~grow, counter + 1, tf.zeros_like(counter)))
        self._skipped_steps.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        step = tf.cast(tf.convert_to_tensor(self.iterations), tf.int64)
        changed = tf.not_equal(new, old)
        tf.cond(changed, lambda: self._record_scale(step, new), lambda: None)
        if not _in_xla_context():  # host callbacks cannot run inside an XLA cluster; the variables still record it
            def log_fn():
                tf.numpy_function(_log_scale_event, [step, old, new, finite, tf.convert_to_tensor(self._skipped_steps)],
                                  Tout=[], stateful=True)

            tf.cond(tf.logical_or(changed, tf.logical_not(finite)), log_fn, lambda: None)

    def _record_scale(self, step, scale):
        index = tf.reshape(tf.math.floormod(tf.convert_to_tensor(self._history_count), SCALE_HISTORY_SIZE), (1, 1))
        self._history_steps.assign(tf.tensor_scatter_nd_update(self._history_steps, index, tf.reshape(step, (1,))))
        self._history_scales.assign(tf.tensor_scatter_nd_update(self._history_scales, index, tf.reshape(scale, (1,))))
        self._history_count.assign_add(1)
