"""TF's CPU emulation of float16 (`emulate=True`), against TF 2.21's own `auto_mixed_precision_cpu` with
TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=1 (its default): every Grappler case TF's CPU mode replays, and
real Keras graphs, node for node (names, ops, dtypes, data inputs); the rewritten graphs run; the option's
environment variable is read where TF reads it.

TF numbers the float32 Casts that several input ports of one node read from one tensor (MatMul(x, x)) in a hash
order that changes between processes, so both sides go through `canonical_cast_names` before comparing.
"""

import functools

import numpy as np
import pytest

import grappler_cases as gc
import mp_rewrite
from mp_rewrite.analysis.execution import run_graph_def
from mp_rewrite.errors import OptionError
from mp_rewrite.testing.examples import EXAMPLES
from mp_rewrite.testing.oracle import EMULATE_FP16_ENV, canonical_cast_names, environment, grappler_rewrite
from test_grappler_conformance import CASES, CASES_BY_ID, built, diff_graphs, fail_on, type_attrs

# ------------------------------------------------- every float16 Grappler case again, in TF's CPU emulation mode


@functools.lru_cache(maxsize=None)
def emulated_oracle_output(case_id):
    """TF's auto_mixed_precision_cpu with its default emulation on the case (run once), or the error it raised."""
    case = CASES_BY_ID[case_id]
    graph_def, fetches = built(case_id)
    try:
        return gc.grappler_oracle(graph_def, list(fetches), "cpu_emulate", level=case.level)
    except IndexError as e:  # absl's out-of-range lookup: a consumer before its producer (a loop's back edge)
        return e


@pytest.mark.parametrize("case_id", [c.id for c in CASES if c.oracle == "cpu_f16"])
def test_ours_equals_oracle_in_emulation_mode(case_id):
    """Every case TF's CPU mode replays, with emulation on in both passes: same nodes, Casts, names and inputs."""
    case = CASES_BY_ID[case_id]
    graph_def, fetches = built(case_id)
    theirs = emulated_oracle_output(case_id)
    ours = mp_rewrite.rewrite_graph_def(graph_def, precision="float16", fetches=list(fetches), device="cpu",
                                        level=case.level, emulate=True)
    assert not ours.retyped and (ours.emulated or not case.added), "emulation retypes nothing"
    if isinstance(theirs, Exception):
        # v1 loops whose recurrent edge is allow: TF's emulation fails (the Merge's float32 Cast reads a
        # NextIteration that comes later in node order). Ours leaves the back edge without Casts, and the loop runs.
        assert case_id.startswith("propagation_through_simple_loop"), f"TF failed unexpectedly: {theirs}"
        want, got = run_v1_graph(graph_def, fetches[0]), run_v1_graph(ours.graph_def, fetches[0])
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))
        assert not np.array_equal(got, want), "the float16 round trips changed nothing: no emulation happened"
        return
    fail_on(diff_graphs(f"case {case_id} emulated", canonical_cast_names(theirs),
                        canonical_cast_names(ours.graph_def)))


def run_v1_graph(graph_def, fetch):
    """Run a TF1 graph with its ref variables initialized (every Assign node) and return `fetch`."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True  # no Grappler pass: run the graph as is
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        session.run([n.name for n in graph_def.node if n.op == "Assign"])
        return session.run(fetch + ":0")


def test_non_topological_order_gives_tf_result_for_sorted_graph():
    """Grappler inserts emulation Casts walking the nodes in order and fails when a consumer comes first; ours
    gives, for the reversed graph, TF's Casts for the graph in order (MixedFanout: a shared and a per-port Cast);
    only the ids of per-port Casts of one tensor follow the node order of the input."""
    graph_def, fetches = built("cpu_mixed_fanout")
    reversed_graph = type(graph_def)()
    reversed_graph.node.extend(reversed(list(graph_def.node)))
    with pytest.raises(IndexError):
        gc.grappler_oracle(reversed_graph, list(fetches), "cpu_emulate")
    ours = mp_rewrite.rewrite_graph_def(reversed_graph, "float16", list(fetches), device="cpu", emulate=True)
    theirs = emulated_oracle_output("cpu_mixed_fanout")
    assert cast_chains(ours.graph_def, graph_def) == cast_chains(theirs, graph_def)
    assert len(ours.graph_def.node) == len(theirs.node)


def cast_chains(graph_def, original):
    """Original node -> its data inputs, each as (original tensor, the dtypes of the Casts it passes through)."""
    nodes, kept = {n.name: n for n in graph_def.node}, {n.name for n in original.node}

    def chain(tensor):
        name = tensor.split(":")[0]
        if name in kept:
            return (name if ":" in tensor else f"{name}:0",)
        cast = nodes[name]
        return chain(cast.input[0]) + (cast.attr["DstT"].type,)
    return {n.name: [chain(i) for i in n.input if not i.startswith("^")] for n in graph_def.node if n.name in kept}


# ----------------------------------------------------------------------------------- real Keras graphs vs TF

KERAS_GRAPHS = ["mlp/inference", "cnn_bn/inference", "cnn_bn/inference_unfrozen", "cnn_bn/train",
                "transformer/inference", "transformer/train"]


@pytest.fixture(scope="module")
def examples():
    return {name: EXAMPLES[name]() for name in KERAS_GRAPHS + ["lstm/inference"]}


@pytest.mark.parametrize("name", KERAS_GRAPHS)
def test_same_graph_as_tensorflow_emulation(examples, name):
    """Node for node: TF's emulated graph and ours have the same nodes, Cast names, dtypes and data inputs; no
    original node changes a dtype."""
    ex = examples[name]
    theirs = grappler_rewrite(ex.graph_def, ex.fetches, "float16", emulate_fp16=True)
    ours = mp_rewrite.rewrite_graph_def(ex.graph_def, "float16", ex.fetches, device="cpu", emulate=True)
    assert ours.emulated and not ours.retyped, f"{name}: nothing emulated"
    assert sum(c.to_low for c in ours.casts) >= len({n for n, _ in ours.emulated}), "a float16 Cast per node at least"
    originals = {n.name for n in ex.graph_def.node}
    assert type_attrs_of(ours.graph_def, originals) == type_attrs_of(ex.graph_def, originals)
    fail_on(diff_graphs(name, canonical_cast_names(theirs), canonical_cast_names(ours.graph_def)))


def type_attrs_of(graph_def, names):
    return {n.name: type_attrs(n) for n in graph_def.node if n.name in names}


@pytest.mark.parametrize("name", ["mlp/inference", "transformer/inference", "lstm/inference"])
def test_emulated_graph_runs_with_float16_rounding(examples, name):
    """The emulated graph runs, keeps float32 outputs, and differs from float32 by float16's rounding only."""
    ex = examples[name]
    ours = mp_rewrite.rewrite_graph_def(ex.graph_def, "float16", ex.fetches, device="cpu", emulate=True)
    expected = run_graph_def(ex.graph_def, ex.inputs, ex.fetches)
    got = run_graph_def(ours.graph_def, ex.inputs, ex.fetches)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype == np.float32
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(g, e, atol=2e-2 * scale, rtol=2e-2)
    assert any(not np.array_equal(e, g) for e, g in zip(expected, got)), f"{name}: no float16 rounding at all"


def test_tf_emulation_fails_on_keras_lstm_loop_ours_runs(examples):
    """A Keras LSTM lowered to a v1 while loop: TF's emulation fails on the loop's back edge; ours runs (above)."""
    ex = examples["lstm/inference"]
    assert any(n.op == "NextIteration" for n in ex.graph_def.node)
    with pytest.raises(IndexError, match="raw_hash_map"):
        grappler_rewrite(ex.graph_def, ex.fetches, "float16", emulate_fp16=True)


# ------------------------------------------------------------------------------------------ the option itself


def _emulates(**kwargs):
    graph_def, fetches = built("cpu_mixed_fanout")
    result = mp_rewrite.rewrite_graph_def(graph_def, fetches=list(fetches), **kwargs)
    return bool(result.emulated) and not result.retyped


@pytest.mark.parametrize("value,precision,device,expected", [
    (None, "float16", "cpu", False),  # unset: the real rewrite (TF's CPU mode would emulate)
    ("1", "float16", "cpu", True), ("TRUE", "float16", "cpu", True), ("0", "float16", "cpu", False),
    ("false", "float16", "cpu", False),
    ("1", "float16", "gpu", False),  # TF reads the variable in its CPU mode only
    ("1", "float16", "any", False), ("1", "bfloat16", "cpu", False),
])
def test_environment_variable_where_tf_reads_it(value, precision, device, expected):
    with environment({EMULATE_FP16_ENV: value}):
        assert _emulates(precision=precision, device=device) is expected


def test_explicit_option_wins_over_environment():
    with environment({EMULATE_FP16_ENV: "1"}):
        assert not _emulates(precision="float16", device="cpu", emulate=False)
    with environment({EMULATE_FP16_ENV: "0"}):
        assert _emulates(precision="float16", device="cpu", emulate=True)
    assert _emulates(precision="float16", device="any", emulate=True)  # explicit: any device


@pytest.mark.parametrize("env,kwargs,message", [
    ("yes", {"device": "cpu"}, "not a boolean"),
    ("", {"device": "cpu"}, "not a boolean"),
    (None, {"precision": "bfloat16", "device": "cpu", "emulate": True}, "float16"),
    (None, {"device": "cpu", "emulate": "yes"}, "True, False or None"),
])
def test_bad_emulate_values_are_refused(env, kwargs, message):
    with environment({EMULATE_FP16_ENV: env}), pytest.raises(OptionError, match=message):
        _emulates(**kwargs)
