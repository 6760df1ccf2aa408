"""Smoke tests of the example graphs, the TF runner and the Grappler oracle (real TensorFlow, small models)."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from mp_rewrite.testing import examples
from mp_rewrite.testing import oracle
from mp_rewrite.errors import OptionError
from mp_rewrite.analysis.execution import ExecutionError, executed_graph_def, run_graph_def

MODEL_OF = {
    "cnn_bn": examples.cnn_bn,
    "transformer": examples.transformer_encoder,
    "lstm": examples.lstm,
    "lstm_functional": examples.lstm,
    "mlp": examples.mlp,
}
# At least one op of each group must be in the graph.
EXPECTED_OPS = {
    "cnn_bn/inference": [{"Conv2D"}, {"FusedBatchNormV3"}, {"MaxPool"}],
    "cnn_bn/train": [{"Conv2DBackpropFilter"}, {"FusedBatchNormGradV3"}],
    "transformer/inference": [{"BatchMatMulV2", "Einsum"}, {"Softmax"}],
    "transformer/train": [{"BatchMatMulV2", "Einsum"}],
    "lstm/inference": [{"Enter"}, {"Exit"}, {"NextIteration"}, {"TensorListSetItem"}],
    "lstm/train": [{"While", "StatelessWhile"}],
    "lstm_functional/inference": [{"While", "StatelessWhile"}, {"TensorListReserve", "TensorListFromTensor"}],
    "cnn_bn/inference_unfrozen": [{"Conv2D"}, {"ReadVariableOp"}],
    "mlp/inference": [{"MatMul"}],
}
INFERENCE_FROZEN = [k for k in examples.EXAMPLES if k.endswith("/inference")]


@pytest.fixture(scope="module")
def graphs():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = examples.EXAMPLES[name]()
        return cache[name]

    return get


def ops_of(graph_def):
    return {n.op for n in graph_def.node}


def node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_example_builds_with_expected_ops(graphs, name):
    graph = graphs(name)
    assert graph.name == name and graph.kind == name.split("/")[1].split("_")[0]
    names = {n.name for n in graph.graph_def.node}
    assert set(graph.fetches) <= names and set(graph.inputs) <= names
    for group in EXPECTED_OPS[name]:
        assert group & ops_of(graph.graph_def), f"{name} has none of {group}"
    if graph.kind == "train":
        assert {"ResourceApplyGradientDescent", "AssignSubVariableOp"} & ops_of(graph.graph_def)
        assert len(graph.fetches) == 2 and len(graph.inputs) == 2 and "labels" in graph.inputs


@pytest.mark.parametrize("name", INFERENCE_FROZEN)
def test_frozen_graph_has_placeholders_only_for_inputs(graphs, name):
    graph = graphs(name)
    placeholders = {n.name for n in graph.graph_def.node if n.op == "Placeholder"}
    assert placeholders == set(graph.inputs)


def test_functional_lstm_keeps_its_loop_in_the_library(graphs):
    graph = graphs("lstm_functional/inference")
    bodies = [f for f in graph.graph_def.library.function if "TensorListSetItem" in {n.op for n in f.node_def}]
    assert bodies, "the While body (with TensorListSetItem) should be a library function"


def test_unfrozen_graph_reads_variables_from_resource_placeholders(graphs):
    graph = graphs("cnn_bn/inference_unfrozen")
    resources = [
        n for n in graph.graph_def.node if n.op == "Placeholder" and n.attr["dtype"].type == types_pb2.DT_RESOURCE
    ]
    assert len(resources) >= 4 and not {n.name for n in resources} & set(graph.inputs)


@pytest.mark.parametrize("name", INFERENCE_FROZEN)
def test_inference_graph_runs_and_matches_the_model(graphs, name):
    graph = graphs(name)
    (got,) = run_graph_def(graph.graph_def, graph.inputs, graph.fetches)
    model = MODEL_OF[name.split("/")[0]]()  # seeded: the same weights as the graph was frozen with
    (x,) = graph.inputs.values()
    np.testing.assert_allclose(got, np.asarray(model(x, training=False)), rtol=1e-5, atol=1e-6)


def test_run_graph_def_accepts_tensor_names(graphs):
    graph = graphs("mlp/inference")
    (x,) = graph.inputs.values()
    (a,) = run_graph_def(graph.graph_def, graph.inputs, graph.fetches)
    (b,) = run_graph_def(graph.graph_def, {"features:0": x}, [graph.fetches[0] + ":0"], optimize=False)
    np.testing.assert_array_equal(a, b)


def test_run_graph_def_names_the_failing_node(graphs):
    graph = graphs("mlp/inference")
    with pytest.raises(ExecutionError, match="must feed a value") as info:
        run_graph_def(graph.graph_def, {}, graph.fetches)
    assert info.value.node == "features"
    with pytest.raises(ExecutionError) as info:
        run_graph_def(graph.graph_def, graph.inputs, ["no_such_node"])
    assert info.value.node == "no_such_node"


def test_oracle_converts_cnn_bn_and_leaves_its_input_alone(graphs):
    graph = graphs("cnn_bn/inference")
    before = graph.graph_def.SerializeToString()
    for precision, dtype in (("float16", types_pb2.DT_HALF), ("bfloat16", types_pb2.DT_BFLOAT16)):
        out = oracle.grappler_rewrite(graph.graph_def, graph.fetches, precision)
        convs = [n for n in out.node if n.op == "Conv2D"]
        assert len(convs) == 2 and all(n.attr["T"].type == dtype for n in convs)
        bn = next(n for n in out.node if n.op == "FusedBatchNormV3")
        assert (bn.attr["T"].type, bn.attr["U"].type) == (dtype, types_pb2.DT_FLOAT)
        assert node(out, graph.fetches[0]).attr["T"].type == types_pb2.DT_FLOAT  # fetches are preserved
    assert graph.graph_def.SerializeToString() == before
    assert os.environ.get(oracle.EMULATE_FP16_ENV) is None


def test_oracle_emulation_keeps_ops_in_float32(graphs):
    graph = graphs("cnn_bn/inference")
    out = oracle.grappler_rewrite(graph.graph_def, graph.fetches, emulate_fp16=True)
    assert {n.attr["T"].type for n in out.node if n.op == "Conv2D"} == {types_pb2.DT_FLOAT}
    assert any(n.op == "Cast" and n.attr["DstT"].type == types_pb2.DT_HALF for n in out.node)


def test_oracle_runs_no_other_optimizer():
    # Foldable constants, an Identity chain and a dead node: constfold, arithmetic, dependency and pruning would
    # all change this graph; with no allowlist op the AMP pass returns it as is.
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(1.0, name="a")
        total = tf.identity(tf.identity(tf.add(a, tf.constant(2.0, name="b"), name="sum"), name="i1"), name="out")
        tf.multiply(total, 0.0, name="dead")
    graph_def = graph.as_graph_def()
    out = oracle.grappler_rewrite(graph_def, ["out"])
    assert {n.name: n for n in out.node} == {n.name: n for n in graph_def.node}


def test_oracle_rewritten_graph_runs_the_dtypes_it_says(graphs):
    graph = graphs("cnn_bn/inference")
    out = oracle.grappler_rewrite(graph.graph_def, graph.fetches, "float16")
    ran = executed_graph_def(out, graph.inputs, graph.fetches)
    # On a CPU with AVX512-FP16, oneDNN runs float16 convolutions too, under its own op name.
    convs = [n for n in ran.node if n.op in ("Conv2D", "_MklConv2D", "_MklNativeConv2D")]
    assert len(convs) == 2 and all(n.attr["T"].type == types_pb2.DT_HALF for n in convs)
    (want,) = run_graph_def(graph.graph_def, graph.inputs, graph.fetches)
    (got,) = run_graph_def(out, graph.inputs, graph.fetches)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


def test_oracle_handles_a_function_library_and_breaks_functional_lstm(graphs):
    # A known TF 2.21 bug the oracle reproduces: the pass retypes the main graph's TensorListReserve/Stack around
    # the functional While to half, while the body's TensorListSetItem (optimized as its own item) stays float.
    graph = graphs("lstm_functional/inference")
    out = oracle.grappler_rewrite(graph.graph_def, graph.fetches, "float16")
    assert {f.signature.name for f in out.library.function} == {
        f.signature.name for f in graph.graph_def.library.function
    }
    with pytest.raises(ExecutionError, match="op elements float but list elements half") as info:
        run_graph_def(out, graph.inputs, graph.fetches)
    assert info.value.node.endswith("TensorListSetItem")


def test_oracle_rejects_unknown_precision(graphs):
    with pytest.raises(OptionError):
        oracle.grappler_rewrite(graphs("mlp/inference").graph_def, ["Identity"], "float8")


def test_time_grappler_returns_seconds(graphs):
    graph = graphs("mlp/inference")
    assert 0 < oracle.time_grappler(graph.graph_def, graph.fetches, repeats=2) < 10


def test_synthetic_graph_imports_and_runs():
    graph = examples.synthetic_graph(1000)
    assert abs(graph.num_nodes - 1000) <= 6
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph.graph_def, name="")
    (out,) = run_graph_def(graph.graph_def, graph.inputs, graph.fetches)
    assert out.shape == (8, 8) and np.allclose(out.sum(axis=1), 1.0, atol=1e-5)


def test_synthetic_graph_scales():
    graph = examples.synthetic_graph(10_000)
    names = [n.name for n in graph.graph_def.node]
    assert len(names) == 1 + 6 * 1666 == len(set(names))
    assert isinstance(graph.graph_def, graph_pb2.GraphDef) and graph.fetches == ["block1665/Softmax"]
