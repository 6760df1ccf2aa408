"""Times measured under one oneDNN setting are not reused under another (issue 28): held to AVX2
(ONEDNN_MAX_CPU_ISA=AVX2), an AVX512-BF16 CPU has no bfloat16 kernels and other float32 ones, so the machine's cost
table (analysis/op_costs.py) and a model's measured costs (analysis/graph_profile.py) are cached under keys that
include the ISA cap and TF_ENABLE_ONEDNN_OPTS.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite.analysis.graph_profile import profile_costs
from mp_rewrite.analysis.op_costs import MachineCosts, cache_path, machine_facts
from mp_rewrite.core.options import make_options

SETTINGS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS")


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No oneDNN setting, and a cache of the test's own."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return monkeypatch


def test_the_machine_table_is_keyed_by_the_isa_cap_and_the_switch(env):
    paths = {"default": cache_path("bfloat16", machine_facts())}
    assert machine_facts()["onednn_max_cpu_isa"] == "default"
    env.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert machine_facts()["onednn_max_cpu_isa"] == "AVX2"  # oneDNN reads it either case
    paths["avx2"] = cache_path("bfloat16", machine_facts())
    env.delenv("ONEDNN_MAX_CPU_ISA")
    env.setenv("DNNL_MAX_CPU_ISA", "AVX2")  # oneDNN's older name
    assert cache_path("bfloat16", machine_facts()) == paths["avx2"]
    env.delenv("DNNL_MAX_CPU_ISA")
    env.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    paths["off"] = cache_path("bfloat16", machine_facts())
    assert len(set(paths.values())) == 3, paths


def _small_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
        w = tf.constant(np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32))
        tf.identity(tf.nn.relu(tf.matmul(x, w)), name="y")
    return graph.as_graph_def()


def test_a_models_measured_costs_are_keyed_by_the_isa_cap(env, tmp_path):
    graph_def, spec = _small_graph(), tf.TensorSpec([None, 64], tf.float32)
    options = make_options("bfloat16", assign="lists")
    machine = MachineCosts("bfloat16", machine_facts())  # one table for both: the key must still differ

    def profiles() -> int:
        profile_costs(graph_def, [(spec, "x:0")], ["y:0"], options, ["x"], machine)
        return len(list((tmp_path / "mp_rewrite" / "profiles").glob("*.json")))
    assert profiles() == 1 and profiles() == 1  # measured, then read from the cache
    env.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert profiles() == 2  # measured again: the full ISA's times do not hold under AVX2
