"""One process of a MultiWorkerMirroredStrategy training run with the graph rewrite on (test_multi_worker.py).

    TF_CONFIG='{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}' \
        python multi_worker_script.py            # one worker; run the same command with index 1 on the other host
    python multi_worker_script.py --single       # the reference: the same training in one process, no strategy

Every process trains the same model on the same global batches (GLOBAL_BATCH examples a step); replica r of the
cluster takes examples [r * per_replica, (r + 1) * per_replica). At step POISON_STEP one example in the last
replica's share is multiplied by POISON: float32 values stay finite, but the scaled gradient of the first Dense
kernel passes float16's maximum (65504) in the rewritten float16 gradient MatMul. Only that replica's own gradients
are non-finite; every process must skip the step and halve the scale. Prints one line "RESULT{json}".
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

GLOBAL_BATCH = 16
STEPS = 5
POISON_STEP = 2
POISON = 1e3
LR = 0.1
INITIAL_SCALE = 2.0 ** 15
COLLECTIVE_TIMEOUT = 90  # seconds


def make_strategy(single):
    """MultiWorkerMirroredStrategy from TF_CONFIG, or TF's default (no-op) strategy for the reference run."""
    if single:
        return tf.distribute.get_strategy()
    # Created first, before any op runs: the strategy configures the eager context's collective executor.
    # A collective that one worker never joins (workers disagreeing on a skip) fails after COLLECTIVE_TIMEOUT
    # instead of hanging the cluster.
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=COLLECTIVE_TIMEOUT))


def make_data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, GLOBAL_BATCH, 6)).astype("float32")
    y = (x.sum(axis=2) > 0).astype("float32")[..., None]
    # The last example (the last replica's share) gets a large input and a label of 0.5, so that its logit's
    # gradient is about +-0.5 whichever side of 0 the logit falls (a label it already fits would give ~0).
    x[POISON_STEP, GLOBAL_BATCH - 1] *= POISON
    y[POISON_STEP, GLOBAL_BATCH - 1] = 0.5
    return x, y


def make_model():
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def half_matmul_functions():
    """Rewritten functions whose definition in the eager context (what runs) has a float16 MatMul, with their
    collective ops as "op:dtype" (the cross-worker all-reduces compiled into the same body)."""
    from tensorflow.python.eager import context

    from mp_rewrite.training import api as training

    found = {}
    for name in training.rewritten_functions():
        fdef = context.context().get_function_def(name)
        if any(n.op == "MatMul" and n.attr["T"].type == tf.float16.as_datatype_enum for n in fdef.node_def):
            found[name] = sorted({f"{n.op}:{tf.dtypes.as_dtype(n.attr['T'].type).name}" for n in fdef.node_def
                                  if n.op.startswith("Collective")})
    return found


def custom_loop(strategy):
    """Train STEPS steps with the tf_keras-style custom step; return what every process saw after each step."""
    import keras
    import numpy as np

    from mp_rewrite.training import api as training
    from mp_rewrite.training.loss_scale.dynamic_scale import all_finite

    replicas = strategy.num_replicas_in_sync
    per_replica = GLOBAL_BATCH // replicas
    with strategy.scope():
        model = make_model()
        opt = training.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(LR), loss_scale={"initial_scale": INITIAL_SCALE, "dynamic_growth_steps": 1000},
            device="cpu")
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True, reduction=None)

    @tf.function
    def step(x, y):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
                scaled = opt.get_scaled_loss(loss)
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
            own_finite = all_finite(grads)  # this replica's gradients, before any all-reduce
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss, own_finite

        loss, own_finite = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce("SUM", loss, axis=None), own_finite

    def share(a):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(a[ctx.replica_id_in_sync_group * per_replica:
                                      (ctx.replica_id_in_sync_group + 1) * per_replica]))

    x, y = make_data()
    out = {"replicas": replicas, "steps": []}
    for i in range(STEPS):
        if i == POISON_STEP and replicas == 1:
            out["float32_poisoned_finite"] = float32_scaled_gradients_finite(model, loss_fn, x[i], y[i], opt)
        loss, own_finite = step(share(x[i]), share(y[i]))
        out["steps"].append({"loss": float(loss), "own_finite": [bool(f) for f in strategy.experimental_local_results(
            own_finite)], "scale": float(opt.loss_scale), "skipped": int(opt.skipped_steps.numpy()),
                      "weights": [np.asarray(v).tolist() for v in model.trainable_variables]})
    return {**out, "half_functions": half_matmul_functions(), "failures": training.rewrite_failures()}


def float32_scaled_gradients_finite(model, loss_fn, x, y, opt):
    """Whether the scaled gradients of a batch are finite in float32 (eager ops: the rewrite does not touch them)."""
    from mp_rewrite.training.loss_scale.dynamic_scale import all_finite

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, model(x))) * opt.loss_scale
    return bool(all_finite(tape.gradient(loss, model.trainable_variables)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--single", action="store_true", help="the one-process reference run (ignores TF_CONFIG)")
    args = parser.parse_args()
    if args.single:
        os.environ.pop("TF_CONFIG", None)
    strategy = make_strategy(args.single)
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    out = {"task": task.get("index"), **custom_loop(strategy)}
    print("RESULT" + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
