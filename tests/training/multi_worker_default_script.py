"""One worker of a MultiWorkerMirroredStrategy run with the default bfloat16 rewrite (test_multi_worker.py).

    TF_CONFIG='{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}}' \
        python multi_worker_default_script.py

On a CPU the default is the cost assignment, which measures a step on the machine that runs it: workers on machines
that differ, or are loaded differently, could decide differently. So only the leader (worker 0) measures its step,
across the first calls, and every worker swaps in what it chose before the same call (training.job_decision). A
small CNN with a BatchNormalization (which a measured cut fuses) trains STEPS steps of a custom loop (Keras 3's
`fit` under this strategy fails on its input here, with or without the rewrite: "Attempt to convert a value
(PerReplica...)"); the leader's next process finds its decision in its cache and shares it before the first
call. Prints one line "RESULT{json}": a digest of the step each call ran, every rewritten function as
it runs at the end (read back from the eager context), the steps still being measured, and the weights.
"""

import hashlib
import json
import logging
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

GLOBAL_BATCH = 8
SHAPE = (16, 16, 8)  # large enough that the fused cut is likely to win the race (then swapped in on both workers)
STEPS = 60  # enough for the leader's measuring of this step (about 35 calls) to end; argv[1] overrides it
COLLECTIVE_TIMEOUT = 60  # seconds: a worker whose peer runs another graph fails instead of hanging


def digest(fdef) -> str:
    """The FunctionDef's nodes (name, op, inputs, attributes), without what differs by worker and process: the debug
    info that names the tracing site, the function's own number, the task index in devices, the process-wide number of
    a custom gradient ("CustomGradient-278")."""
    copy = type(fdef)()
    copy.CopyFrom(fdef)
    copy.signature.name = "step"
    for node in copy.node_def:
        node.ClearField("experimental_debug_info")
        node.device = re.sub(r"/task:\d+", "/task:_", node.device)
        if "_gradient_op_type" in node.attr:
            del node.attr["_gradient_op_type"]
    return hashlib.sha1(copy.SerializeToString(deterministic=True)).hexdigest()


def make_model():
    """Two 3x3 convolutions with BatchNorm and ReLU, global average pooling, one output (seeded)."""
    import keras
    L = keras.layers
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input(SHAPE), L.Conv2D(32, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                             L.Conv2D(32, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                             L.GlobalAveragePooling2D(), L.Dense(1)])


def make_step(strategy, model, opt):
    """The distributed training step both scripts run: a squared error averaged over GLOBAL_BATCH, summed across
    replicas."""
    @tf.function
    def step(x, y):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.square(model(x, training=True) - y),
                                                  global_batch_size=GLOBAL_BATCH)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica_fn, args=(x, y)), axis=None)
    return step


def step_name(step, *args) -> str:
    """The name of the step's function in the eager context (its concrete function's, which the rewrite keeps)."""
    name = step.get_concrete_function(*args).name
    return name.decode() if isinstance(name, bytes) else name


def main():
    logging.basicConfig()
    logging.getLogger("mp_rewrite").setLevel(logging.INFO)  # what each worker planned, in its stderr file
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=COLLECTIVE_TIMEOUT))
    import keras
    import numpy as np
    from tensorflow.python.eager import context

    from mp_rewrite.training import api as training
    from mp_rewrite.training import deferred

    with strategy.scope():
        model = make_model()
        opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), precision="bfloat16")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3 * GLOBAL_BATCH, *SHAPE)).astype("float32")
    y = (x.sum(axis=(1, 2, 3)) > 0).astype("float32")[:, None]
    per_replica = GLOBAL_BATCH // strategy.num_replicas_in_sync

    step = make_step(strategy, model, opt)

    def share(a, i):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(a[i * GLOBAL_BATCH + ctx.replica_id_in_sync_group * per_replica:][:per_replica]))

    ctx = context.context()
    losses, ran = [], []
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else STEPS):
        xs, ys = share(x, i % 3), share(y, i % 3)
        losses.append(float(step(xs, ys)))
        ran.append(digest(ctx.get_function_def(step_name(step, xs, ys))))
    functions = {name: {"digest": digest(ctx.get_function_def(name)), "assignment": result.assignment is not None,
                        "fused": sum(n.op == "FusedBatchNormV3" for n in ctx.get_function_def(name).node_def),
                        "bfloat16": sum(n.attr["T"].type == tf.bfloat16.as_datatype_enum
                                        for n in ctx.get_function_def(name).node_def)}
                 for name, result in training.rewritten_functions().items()}
    print("RESULT" + json.dumps({"replicas": strategy.num_replicas_in_sync, "losses": losses, "ran": ran,
                                 "functions": functions,
                                 "pending": deferred.pending(), "failures": training.rewrite_failures(),
                                 "weights": [np.asarray(v).tolist() for v in model.trainable_variables]}),
          flush=True)


if __name__ == "__main__":
    main()
