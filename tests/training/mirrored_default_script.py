"""MirroredStrategy over two logical CPUs with the default bfloat16 rewrite (the cost assignment), in one process
(test_job_decision.py runs it; logical devices must be set before TensorFlow initialises its devices).

The step holds both replicas, placed on two devices. It is measured as training.job_decision.standalone copies it
(devices cleared), across its first calls, and what that decided is swapped into the step as placed: one decision
for both replicas. Prints one line "RESULT{json}": the steps still being measured, the failures, the devices and
bfloat16 nodes of the step as it runs at the end, each variable's value on each replica.
"""

import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multi_worker_default_script import GLOBAL_BATCH, SHAPE, digest, make_model, make_step, step_name  # noqa: E402

from mp_rewrite.training import api as training  # noqa: E402
from mp_rewrite.training import deferred  # noqa: E402

STEPS = 60  # enough for the measuring (about 35 calls) to end


def main():
    logging.basicConfig()
    logging.getLogger("mp_rewrite").setLevel(logging.INFO)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = make_model()
        opt = training.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01), precision="bfloat16")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH, *SHAPE)).astype("float32")
    y = (x.sum(axis=(1, 2, 3)) > 0).astype("float32")[:, None]
    half = GLOBAL_BATCH // 2
    parts = lambda a: strategy.experimental_distribute_values_from_function(  # noqa: E731
        lambda ctx: tf.constant(a[ctx.replica_id_in_sync_group * half:][:half]))
    xs, ys = parts(x), parts(y)

    step = make_step(strategy, model, opt)

    ran, losses = [], []
    for _ in range(STEPS):
        losses.append(float(step(xs, ys)))
        ran.append(digest(context.context().get_function_def(step_name(step, xs, ys))))
    fdef = context.context().get_function_def(step_name(step, xs, ys))
    print("RESULT" + json.dumps({
        "pending": deferred.pending(), "losses": losses, "failures": training.rewrite_failures(),
        "graphs": len(set(ran)),
        "devices": sorted({n.device.split("device:")[-1] for n in fdef.node_def if n.device}),
        "bfloat16": sum(n.attr["T"].type == tf.bfloat16.as_datatype_enum for n in fdef.node_def),
        "replicas": [[v.numpy().tolist() for v in strategy.experimental_local_results(var.value)]
                     for var in model.trainable_variables]}), flush=True)


if __name__ == "__main__":
    main()
