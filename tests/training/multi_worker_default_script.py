"""One worker of a MultiWorkerMirroredStrategy run with the default bfloat16 rewrite (test_multi_worker.py).

    TF_CONFIG='{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}}' \
        python multi_worker_default_script.py

On a CPU the default is the cost assignment, which measures a step on the machine that runs it: workers on machines
that differ, or are loaded differently, could decide differently. A step with collective ops is therefore not
measured (training.cost_hook.plan): it runs Grappler's lists as traced, the same graph on every worker. A small
CNN with a BatchNormalization (which a measured cut would fuse) trains STEPS steps of a custom loop (Keras 3's `fit` under this strategy fails on
its input here, with or without the rewrite: "Attempt to convert a value (PerReplica...)"); prints one line
"RESULT{json}": a digest of every rewritten function as it runs (read back from the eager context), the steps
still being measured, and the weights.
"""

import hashlib
import json
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

GLOBAL_BATCH = 8
STEPS = 3
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


def main():
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=COLLECTIVE_TIMEOUT))
    import keras
    import numpy as np
    from tensorflow.python.eager import context

    from mp_rewrite.training import api as training
    from mp_rewrite.training import deferred

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, padding="same"),
                                  keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.Flatten(),
                                  keras.layers.Dense(1)])
        opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.05), precision="bfloat16")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 8, 8, 3)).astype("float32")
    y = (x.sum(axis=(1, 2, 3)) > 0).astype("float32")[:, None]
    per_replica = GLOBAL_BATCH // strategy.num_replicas_in_sync

    @tf.function
    def step(x, y):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.square(model(x, training=True) - y),
                                                  global_batch_size=GLOBAL_BATCH)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica_fn, args=(x, y)), axis=None)

    def share(a, i):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(a[i * GLOBAL_BATCH + ctx.replica_id_in_sync_group * per_replica:][:per_replica]))

    losses = [float(step(share(x, i), share(y, i))) for i in range(STEPS)]
    ctx = context.context()
    functions = {name: {"digest": digest(ctx.get_function_def(name)), "assignment": result.assignment is not None,
                        "fused": sum(n.op == "FusedBatchNormV3" for n in ctx.get_function_def(name).node_def),
                        "bfloat16": sum(n.attr["T"].type == tf.bfloat16.as_datatype_enum
                                        for n in ctx.get_function_def(name).node_def)}
                 for name, result in training.rewritten_functions().items()}
    print("RESULT" + json.dumps({"replicas": strategy.num_replicas_in_sync, "losses": losses, "functions": functions,
                                 "pending": deferred.pending(), "failures": training.rewrite_failures(),
                                 "weights": [np.asarray(v).tolist() for v in model.trainable_variables]}),
          flush=True)


if __name__ == "__main__":
    main()
