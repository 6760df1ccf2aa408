"""MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1 train with the graph rewrite on, against the same
training in one process (multi_worker_script.py is the program; each process prints one RESULT line).

float16 with device="cpu", as in the MirroredStrategy test: only float16 can overflow where float32 does not, which is
what makes a skipped step the rewrite's doing. The workers find each other through TF_CONFIG on ports picked free at
run time; every subprocess is bounded by TIMEOUT and killed (by its own pid) past it.
"""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import multi_worker_script as script  # beside this file (pytest puts the test's folder on sys.path)

TIMEOUT = 180  # seconds, for all subprocesses together; a worker whose peer died may wait for it until then
SCRIPT = script.__file__
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(SCRIPT))))

pytestmark = pytest.mark.slow


def free_ports(n):
    """n distinct ports free on 127.0.0.1 now (the sockets are held together, so no port is returned twice)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def child_env(tf_config=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def run_all(commands, folder):
    """Start every (label, argv, env) at once; return {label: (exit code or None if killed, stdout, stderr)}.

    All share one deadline (a hung cluster costs TIMEOUT, not TIMEOUT each). When one process fails, the others are
    killed at once: a worker whose peer is gone would only wait for it. Output goes to files (no pipe to fill up).
    """
    procs, files = {}, {}
    for label, argv, env in commands:
        files[label] = tuple(open(os.path.join(folder, f"{label}.{kind}"), "w+") for kind in ("out", "err"))
        procs[label] = subprocess.Popen(argv, env=env, stdout=files[label][0], stderr=files[label][1], text=True)
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            if any(p.poll() not in (None, 0) for p in procs.values()):
                break
            time.sleep(0.2)
    finally:
        killed = set()
        for label, proc in procs.items():
            if proc.poll() is None:
                proc.kill()  # SIGKILL: TensorFlow's preemption handler catches SIGTERM in a worker
                proc.wait()
                killed.add(label)
    results = {}
    for label, (out, err) in files.items():
        out.seek(0), err.seek(0)
        results[label] = (None if label in killed else procs[label].returncode, out.read(), err.read())
        out.close(), err.close()
    return results


def parsed(results):
    """{label: RESULT dict}, or a failed assertion with the end of every failed process's stderr."""
    outputs, problems = {}, []
    for label, (code, out, err) in results.items():
        lines = [line for line in out.splitlines() if line.startswith("RESULT")]
        if code == 0 and lines:
            outputs[label] = json.loads(lines[-1][len("RESULT"):])
        else:
            state = f"killed after at most {TIMEOUT} s" if code is None else f"exit {code}"
            err = "\n".join(line for line in err.splitlines() if not line.startswith("I0000"))  # TF's INFO lines
            problems.append(f"{label}: {state}\n{err[-3000:]}")
    assert not problems, "\n\n".join(problems)
    return outputs


def port_taken(results):
    """Whether a worker could not listen on its port (taken by another process between picking and binding)."""
    return any("Could not start gRPC server" in err for _, _, err in results.values())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    for attempt in range(2):  # the ports are free when picked, but another process may take one before TF binds it
        workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
        commands = [(f"worker{i}", [sys.executable, SCRIPT],
                     child_env({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))
                    for i in range(2)]
        commands.append(("single", [sys.executable, SCRIPT, "--single"], child_env()))
        results = run_all(commands, tmp_path_factory.mktemp("multi_worker"))
        if not port_taken(results):
            break
    return parsed(results)


def flat(weights):
    return np.concatenate([np.ravel(w) for w in weights])


def test_the_rewrite_runs_on_both_workers(runs):
    for label in ("worker0", "worker1"):
        run = runs[label]
        assert run["replicas"] == 2 and run["failures"] == {}
        # The executed step (read back from the eager context) has float16 MatMuls; the cross-worker all-reduces
        # (gradients, the non-finite flag, the loss) sit in that same rewritten body and stay float32, so a sum
        # over workers can neither overflow float16 nor lose its precision.
        collectives = [op for ops in run["half_functions"].values() for op in ops]
        assert run["half_functions"] and collectives == ["CollectiveReduceV2:float32"], run["half_functions"]
    assert runs["single"]["replicas"] == 1 and runs["single"]["half_functions"]


def test_an_overflow_on_one_worker_skips_the_step_on_both(runs):
    assert runs["single"]["float32_poisoned_finite"]  # the overflow exists only in the rewritten float16 graph
    w0, w1 = (runs[f"worker{i}"]["steps"] for i in range(2))
    p = script.POISON_STEP
    assert w0[p]["own_finite"] == [True] and w1[p]["own_finite"] == [False]  # only worker 1's gradients overflowed
    for steps in (w0, w1):
        assert [s["skipped"] for s in steps] == [0] * p + [1] * (len(steps) - p)
        assert steps[p - 1]["scale"] == script.INITIAL_SCALE and steps[p]["scale"] == script.INITIAL_SCALE / 2
        assert steps[p]["weights"] == steps[p - 1]["weights"]  # skipped: bit for bit unchanged
        assert steps[p + 1]["weights"] != steps[p]["weights"]  # and training goes on


def test_workers_agree_exactly_and_match_the_single_process_run(runs):
    w0, w1, single = (runs[label]["steps"] for label in ("worker0", "worker1", "single"))
    assert len(w0) == len(w1) == len(single) == script.STEPS
    shared = ("loss", "scale", "skipped", "weights")  # own_finite is each worker's own
    # Losses, scales, counters and weights identical on both workers after every step.
    assert [[s[k] for k in shared] for s in w0] == [[s[k] for k in shared] for s in w1]
    start_gap = np.abs(flat(single[-1]["weights"]) - flat(single[0]["weights"])).max()
    for i, (multi, one) in enumerate(zip(w0, single)):
        assert multi["scale"] == one["scale"] and multi["skipped"] == one["skipped"], i
        # Same global batch, split in two: float16 MatMuls over 8 instead of 16 rows round differently.
        np.testing.assert_allclose(multi["loss"], one["loss"], rtol=1e-4, err_msg=f"step {i}")
        np.testing.assert_allclose(flat(multi["weights"]), flat(one["weights"]), atol=1e-4, err_msg=f"step {i}")
    assert start_gap > 100 * 1e-4  # the weights moved far more than the tolerance


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory):
    """Two workers of multi_worker_default_script.py, each with a cost cache of its own (as on two machines): a first
    job (the leader measures), then a second, shorter one with the same caches (the leader's cache has the step)."""
    here = tmp_path_factory.mktemp("multi_worker_default")
    runs = {}
    for job, steps in (("cold", []), ("warm", ["5"])):
        (here / job).mkdir()
        for attempt in range(2):
            workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
            commands = []
            for i in range(2):
                env = child_env({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
                env["XDG_CACHE_HOME"] = str(here / f"cache{i}")
                env.pop("MP_REWRITE_ASSIGN", None)
                commands.append((f"worker{i}", [sys.executable, DEFAULT_SCRIPT, *steps], env))
            results = run_all(commands, here / job)
            if not port_taken(results):
                break
        runs[job] = parsed(results)
    return {**runs, "cache0": str(here / "cache0"), "cache1": str(here / "cache1")}


DEFAULT_SCRIPT = os.path.join(os.path.dirname(SCRIPT), "multi_worker_default_script.py")


def profiles(folder):
    """The profiles (measured steps) in a worker's cost cache."""
    found = os.path.join(folder, "mp_rewrite", "profiles")
    return sorted(os.listdir(found)) if os.path.isdir(found) else []


def test_workers_run_the_same_graph_under_the_default_cost_assignment(default_runs):
    w0, w1 = default_runs["cold"]["worker0"], default_runs["cold"]["worker1"]
    assert w0["replicas"] == w1["replicas"] == 2 and w0["failures"] == w1["failures"] == {}
    assert w0["pending"] == w1["pending"] == []  # the measuring ended on both workers within the run
    # Only the leader measured; worker 1, with a cache of its own, measured nothing and ran what the leader chose.
    assert profiles(default_runs["cache0"]) and not profiles(default_runs["cache1"])
    # Every call ran the same step on both workers, byte for byte (their names may differ: TF numbers functions per
    # process), swapped at the same call when the leader's decision was not the lists as traced.
    assert w0["ran"] == w1["ran"] and len(set(w0["ran"])) in (1, 2)
    assert sorted(map(json.dumps, w0["functions"].values())) == sorted(map(json.dumps, w1["functions"].values()))
    assert w0["losses"] == w1["losses"] and w0["weights"] == w1["weights"]
    assert all(np.isfinite(w0["losses"])) and np.isfinite(flat(w0["weights"])).all()  # NaN would compare unequal


def test_the_leaders_cached_decision_is_shared_before_the_first_call(default_runs):
    cold, warm = default_runs["cold"]["worker0"], default_runs["warm"]
    assert warm["worker0"]["pending"] == warm["worker1"]["pending"] == []
    # From the first call on, both run the graph the first job ended with: the leader's cached decision.
    assert warm["worker0"]["ran"] == warm["worker1"]["ran"] == [cold["ran"][-1]] * 5
    assert not profiles(default_runs["cache1"])
