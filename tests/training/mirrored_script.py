"""MirroredStrategy with two logical CPUs and the graph rewrite on (run by test_training.py in a subprocess).

Logical devices must be configured before TensorFlow initialises its devices, hence a separate process. Prints one
line "RESULT{json}" with what the tests assert on.

The overflow is one only float16 produces: replica 1 multiplies its loss by POISON, which keeps every float32 value
finite (a float32 step applies) but pushes the scaled gradients reaching the rewritten float16 MatMul gradients
past float16's maximum of 65504.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from mp_rewrite.training import api as training  # noqa: E402

POISON = 1e4
LR = 0.1
BATCH = 16  # global batch: 8 per replica


def make_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def half_matmuls(results):
    """Names of rewritten functions whose executed definition has a float16 MatMul."""
    from tensorflow.python.eager import context

    found = []
    for name in results:
        fdef = context.context().get_function_def(name)
        if any(n.op == "MatMul" and n.attr["T"].type == tf.float16.as_datatype_enum for n in fdef.node_def):
            found.append(name)
    return found


def per_replica_values(strategy, model):
    """Each trainable variable's value on each replica (a Keras variable wraps a MirroredVariable)."""
    return [[v.numpy().tolist() for v in strategy.experimental_local_results(var.value)]
            for var in model.trainable_variables]


def custom_loop(strategy, x, y):
    with strategy.scope():
        model = make_model()
        opt = training.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(LR), loss_scale={"initial_scale": 1024.0, "dynamic_growth_steps": 1000},
            device="cpu")
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True, reduction=None)
    parts = lambda a: strategy.experimental_distribute_values_from_function(  # noqa: E731
        lambda ctx: tf.constant(a[ctx.replica_id_in_sync_group * 8:(ctx.replica_id_in_sync_group + 1) * 8]))
    xs, ys = parts(x), parts(y)

    @tf.function
    def step(xs, ys, poison):
        def replica_fn(x, y):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            factor = tf.where(tf.logical_and(poison, tf.equal(replica, 1)), POISON, 1.0)
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True)) * factor
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
                scaled = opt.get_scaled_loss(loss)
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_fn, args=(xs, ys)), axis=None)

    start = [v.numpy() for v in model.trainable_variables]
    step(xs, ys, tf.constant(False))
    finite = {"vars": per_replica_values(strategy, model), "scale": float(opt.loss_scale),
              "skipped": int(opt.skipped_steps.numpy())}
    step(xs, ys, tf.constant(True))
    poisoned = {"vars": per_replica_values(strategy, model), "scale": float(opt.loss_scale),
                "skipped": int(opt.skipped_steps.numpy()), "counter": int(opt.dynamic_counter.numpy())}

    # The float32 reference of the finite step: full batch, one device, no rewrite, no loss scale.
    ref = make_model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, ref(x)))
    grads = tape.gradient(loss, ref.trainable_variables)
    expected = [(s - LR * g.numpy()).tolist() for s, g in zip(start, grads)]
    fp32_poisoned = [bool(np.all(np.isfinite(g.numpy() * POISON * 1024.0))) for g in grads]
    return {"start": [s.tolist() for s in start], "finite": finite, "poisoned": poisoned, "expected": expected,
            "fp32_poisoned_finite": all(fp32_poisoned), "half_functions": half_matmuls(training.rewritten_functions())}


def fit(strategy, x, y):
    x = x.copy()
    x[BATCH - 1] *= POISON  # the last example sits in replica 1's half of the only batch
    with strategy.scope():
        model = make_model()
        opt = training.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(LR), loss_scale={"initial_scale": 1024.0}, device="cpu")
        model.compile(optimizer=opt, loss=keras.losses.BinaryCrossentropy(from_logits=True))
    before = [w.tolist() for w in model.get_weights()]
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    return {"unchanged": before == [w.tolist() for w in model.get_weights()], "scale": float(opt.loss_scale),
            "skipped": int(opt.skipped_steps.numpy()), "half_functions": half_matmuls(training.rewritten_functions())}


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 6)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")[:, None]
    out = {"replicas": strategy.num_replicas_in_sync, "loop": custom_loop(strategy, x, y)}
    out["fit"] = fit(strategy, x, y)
    print("RESULT" + json.dumps(out))


if __name__ == "__main__":
    main()
