"""One cost-assignment decision per tf.distribute job (training.job_decision): what the leader measures in place of a
distributed step, and the decision as the coordination service carries it; a MirroredStrategy step (one process,
two logical CPUs) measured once for both replicas. The job of several processes -- two workers on 127.0.0.1 that
swap in the leader's decision before the same call -- is test_multi_worker.py's."""

import json
import math
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from mp_rewrite.analysis.graph_profile import Profile
from mp_rewrite.analysis.op_costs import NATIVE_FLAGS, machine_facts
from mp_rewrite.core.assignment import CostTable
from mp_rewrite.training import job_decision

DEVICE = "/job:worker/replica:0/task:1/device:CPU:0"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NATIVE_BF16 = bool(set(NATIVE_FLAGS["bfloat16"]) & set(machine_facts()["cpu_flags"]))


def distributed_step():
    graph = graph_pb2.GraphDef()
    graph.node.add(name="grad", op="Placeholder", device=DEVICE)
    graph.node.add(name="size", op="Const", device=DEVICE)
    graph.node.add(name="token", op="_Arg", device=DEVICE)
    reduce = graph.node.add(name="allreduce", op="CollectiveReduceV2", device=DEVICE,
                            input=["grad", "size", "size", "size", "token", "^grad"])
    reduce.attr["T"].type = tf.float32.as_datatype_enum
    reduce.attr["merge_op"].s = b"Add"
    reduce.attr["_output_shapes"].list.shape.add().dim.add(size=8)
    graph.node.add(name="update", op="Mul", device=DEVICE, input=["allreduce", "allreduce"])
    return graph


def test_standalone_makes_each_all_reduce_an_identity_of_its_input_and_clears_devices():
    step = distributed_step()
    before = step.SerializeToString()
    alone, why = job_decision.standalone(step)
    assert why == "" and step.SerializeToString() == before  # a copy: the step itself is untouched
    nodes = {n.name: n for n in alone.node}
    reduce = nodes["allreduce"]
    assert reduce.op == "Identity" and list(reduce.input) == ["grad", "^grad"]  # its peers' inputs dropped
    assert set(reduce.attr) == {"T", "_output_shapes"} and reduce.attr["T"].type == tf.float32.as_datatype_enum
    assert reduce.attr["_output_shapes"].list.shape[0].dim[0].size == 8
    assert not any(n.device for n in alone.node)
    assert list(nodes["update"].input) == ["allreduce", "allreduce"]


def test_standalone_refuses_collectives_that_need_their_peers():
    step = distributed_step()
    step.node.add(name="gathered", op="CollectiveGatherV2", input=["grad"])
    alone, why = job_decision.standalone(step)
    assert alone is None and "CollectiveGatherV2" in why


def test_the_decision_travels_as_text_and_back():
    table = CostTable("bfloat16", {"graph": {"matmul": (2.0, 1.0)}}, {"graph": {("x", 0): (0.1, 0.2)}},
                      {"graph": {}}, True, "measured", "lists")
    message = {"at": 34, "profile": job_decision._text(Profile(table, 3.0, 2.5))}
    back = job_decision.profile_of(message)
    assert (back.fp32_ms, back.lists_ms) == (3.0, 2.5)
    assert back.table.nodes == table.nodes and back.table.casts == table.casts and back.table.keep == "lists"


def test_step_digests_ignore_the_task():
    one, other = distributed_step(), distributed_step()
    for node in other.node:
        node.device = node.device.replace("task:1", "task:0")
    assert job_decision._digest(one) == job_decision._digest(other)
    other.node[-1].op = "Add"
    assert job_decision._digest(one) != job_decision._digest(other)


@pytest.mark.slow
@pytest.mark.skipif(not NATIVE_BF16, reason="the default measures only on a CPU with bfloat16 units")
def test_a_mirrored_step_is_measured_once_for_both_replicas(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               XDG_CACHE_HOME=str(tmp_path))
    env.pop("MP_REWRITE_ASSIGN", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "mirrored_default_script.py")], capture_output=True,
                          text=True, env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    run = json.loads(lines[-1][len("RESULT"):])
    assert run["pending"] == [] and run["failures"] == {}
    assert all(math.isfinite(loss) for loss in run["losses"]), run["losses"]
    assert os.listdir(tmp_path / "mp_rewrite" / "profiles")  # measured (before: the lists, never measured)
    assert run["graphs"] in (1, 2)  # the lists until the decision, then the decision
    # What was decided runs in the step as placed, both replicas on their own devices, not in the measured copy.
    assert run["devices"] == ["CPU:0", "CPU:1"], run["devices"]
    for values in run["replicas"]:
        assert values[0] == values[1]  # the replicas' variables agree, bit for bit
