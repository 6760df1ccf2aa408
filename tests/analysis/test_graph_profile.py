"""Costs measured in the model itself (analysis.graph_profile): a frozen graph and a SavedModel's MetaGraph run as
they are and as the lists make them; each node's time in context lands on the node (a function body's node under
the call nodes a TF1 session inlines it by), fused nodes are tied to the kernel that runs them, and the
conversion that uses them loads, verifies and keeps every signature."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.analysis.call_names import inlined_prefixes  # noqa: E402
from mp_rewrite.analysis.graph_profile import _fused_into, profile_saved_model, profileable  # noqa: E402
from mp_rewrite.analysis.variant_race import best_across  # noqa: E402
from mp_rewrite.analysis.op_costs import this_machine  # noqa: E402
from mp_rewrite.commands.list_options import predicted  # noqa: E402
from mp_rewrite.core.options import make_options  # noqa: E402
from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.verify import verify_saved_models  # noqa: E402


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_fused_node_is_tied_to_the_node_that_runs_its_kernel():
    graph = tf.compat.v1.GraphDef()
    for name, op, inputs in (("x", "Placeholder", []), ("w", "Const", []), ("conv", "Conv2D", ["x", "w"]),
                             ("bias", "BiasAdd", ["conv", "w"]), ("relu", "Relu", ["bias"]),
                             ("other", "Relu", ["x"])):
        node = graph.node.add(name=name, op=op, input=inputs)
        node.attr["T"].type = 1
    # The remapper ran conv + bias + relu as one kernel named after the relu; "other" was removed for another
    # reason and has no consumer to be fused into.
    assert _fused_into(graph, {"relu": 1.0, "x": 0.0}) == {"conv": "relu", "bias": "relu"}


def test_a_metagraph_profile_times_the_function_bodies_through_their_inlined_names(small_cnn):
    meta = read_saved_model(small_cnn).meta_graphs[0]
    prefixes = inlined_prefixes(meta.graph_def)
    signature = meta.signature_def["serving_default"]
    inputs = {info.name: (info.dtype, [d.size if d.size >= 0 else None for d in info.tensor_shape.dim])
              for info in signature.inputs.values()}
    profile = profile_saved_model(str(small_cnn), meta, inputs, [i.name for i in signature.outputs.values()],
                                  make_options("bfloat16"), this_machine("bfloat16"), batch=2, runs=2)
    bodies = {label: nodes for label, nodes in profile.table.nodes.items() if nodes}
    assert bodies and all(label in prefixes for label in bodies)
    # The convolutions' bodies were reached through two call nodes (signature wrapper, then the traced function),
    # and their times landed on the body's own nodes.
    assert any(len(p.strip("/").split("/")) >= 2 for label in bodies for p in prefixes[label])
    timed = [ms for nodes in bodies.values() for ms in nodes.values() if max(ms) > 0]
    assert len(timed) >= 3, bodies
    assert profile.fp32_ms > 0 and profile.lists_ms > 0
    assert profile.table.note.startswith("costs measured in this graph") or not profile.table.low_units


def test_a_graph_with_function_calls_is_not_profiled_frozen():
    graph = tf.compat.v1.GraphDef()
    graph.library.function.add().signature.name = "body"
    assert "functions" in profileable(graph, [])


@pytest.mark.parametrize("freeze", [False, True])
def test_a_conversion_with_costs_measured_in_the_model_verifies_and_keeps_its_signatures(small_cnn, tmp_path, freeze):
    costs = this_machine("bfloat16")
    costs.batch = 4
    out = tmp_path / "out"
    result = convert_saved_model(small_cnn, out, "bfloat16", assign="cost", costs=costs, freeze=freeze)
    p = predicted(next(iter(result.graphs.values())))  # summed over the main graph and its function bodies
    if costs.low_units:
        assert p["source"].startswith("costs measured in this graph on this machine"), p["source"]
        assert p["candidates"] > 0 and p["bound"] <= p["cost"] + 1e-9
        kept = _kept(p["source"])
        if kept == "the lists":  # the cut's graph ran slower than the lists': their coloring stays
            assert p["demoted"] == 0
        elif kept in ("float32", "the model as given (no rules)"):
            assert p["demoted"] == p["candidates"]
        else:  # the cut's choice (or not raced: the cut is the lists'): never predicted slower than either
            assert kept in ("the cut", None) and p["cost"] <= min(p["lists_cost"], p["fp32_cost"]) + 1e-9
    else:  # no bfloat16 units: nothing is measured, every candidate stays float32, and the note says why
        assert "every op stays float32" in p["note"] and not result.converted_nodes
    assert set(tf.saved_model.load(str(out)).signatures) == set(tf.saved_model.load(str(small_cnn)).signatures)
    assert verify_saved_models(str(small_cnn), str(out), precision="bfloat16", batch_size=4).passed


@pytest.mark.parametrize("freeze", [False, True])
def test_without_a_batch_size_the_variants_are_raced_at_three_and_the_best_across_them_kept(small_cnn, tmp_path,
                                                                                          freeze):
    costs = this_machine("bfloat16")
    if not costs.low_units:
        pytest.skip("without bfloat16 units nothing is measured or raced")
    assert costs.batch is None
    result = convert_saved_model(small_cnn, tmp_path / "out", "bfloat16", assign="cost", costs=costs, freeze=freeze)
    p = predicted(next(iter(result.graphs.values())))
    assert "at batch 8 (" in p["source"] and " at batch 1, 8, 32 (float32 " in p["source"], p["source"]
    kept = _kept(p["source"])
    if kept in ("float32", "the model as given (no rules)"):
        assert p["demoted"] == p["candidates"]
    elif kept == "the lists":
        assert p["demoted"] == 0
    else:
        assert kept == "the cut" and p["cost"] <= min(p["lists_cost"], p["fp32_cost"]) + 1e-9
    assert verify_saved_models(str(small_cnn), str(tmp_path / "out"), precision="bfloat16").passed


def test_the_best_across_batches_loses_little_at_any_one_and_keeps_the_cut_within_resolution():
    inf = float("inf")
    # The cut is best on the geometric mean, though the lists win at batch 32: the cut stays.
    assert best_across({1: [1.0, 0.98, 0.97], 8: [10, 6, 5.5], 32: [40, 22, 23]})[0] == ""
    # The lists gain more than the resolution on the cut across the batches: the lists.
    assert best_across({1: [1.0, 0.8, 0.99], 8: [10, 5.5, 5.6], 32: [40, 20, 23]})[0] == "lists"
    # A variant 15% slower than float32 at batch 1 is out, however fast at 8 and 32; the line says where.
    keep, line = best_across({1: [1.0, 1.15], 8: [10, 6], 32: [40, 22]}, ("float32", "lists"))
    assert keep == "float32" and "float32's time: the lists 1.15x at batch 1; at batch 32 the lists ran 0.55x: " \
        "--batch-size 32 chooses for that batch)" in line, line
    # 6% slower at batch 1 for 1.7x faster at 8 and 32: kept, and the line says what it costs at batch 1.
    keep, line = best_across({1: [1.0, 1.06], 8: [10, 6], 32: [40, 22]}, ("float32", "lists"))
    assert keep == "" and "it runs 1.06x float32's time at batch 1 (--batch-size 1 chooses" in line, line
    # Without a cut of its own the lists are what the assignment keeps: no `keep` needed.
    assert best_across({1: [1.0, 0.9], 8: [10, 6]}, ("float32", "lists"))[0] == ""
    # Within the noise of float32 everywhere, nothing gained or lost: the cut stays.
    assert best_across({1: [1.0, 1.02, 1.01], 8: [10, 10.1, 10.0]})[0] == ""
    # A batch float32 cannot run at is left out, and said.
    keep, line = best_across({1: [inf, 1.0, 2.0], 8: [10, 6, 5.5]})
    assert keep == "" and "float32 did not run at batch 1" in line and "raced at batch 8 (" in line, line
    # Beside the model as given (the rules changed it), it is the baseline: float32 with the rules 1.15x slower
    # than it at batch 1 is out, and the source, best, is kept.
    names = ("float32", "lists", "source")
    keep, line = best_across({1: [1.15, 1.2, 1.0], 8: [10, 10.5, 9.9]}, names)
    assert keep == "source" and "the model as given (no rules) kept" in line, line
    assert "over 1.10x the model as given (no rules)'s time: float32 1.15x at batch 1, the lists 1.20x" in line
    # One batch (a training step's race): no "across them", no batch named.
    keep, line = best_across({None: [10, 6, 7]}, where=" as the function runs")
    assert keep == "lists" and line.startswith("raced as the function runs (float32 10.0; the lists 6.0; the cut "
                                               "7.0 ms per run): the lists kept"), line


def _kept(note: str):
    """The variant a race kept, as its line says (None: not raced)."""
    import re
    found = re.search(r" ms per run\): (float32|the lists|the cut|the model as given \(no rules\)) kept", note)
    return found.group(1) if found else None


def test_a_model_converted_again_here_reuses_its_measured_costs_and_the_same_choice(small_cnn, tmp_path):
    seen = []
    for i in range(2):
        costs = this_machine("bfloat16")
        costs.batch = 2
        result = convert_saved_model(small_cnn, tmp_path / f"out{i}", "bfloat16", assign="cost", costs=costs,
                                     freeze=True)
        graph = next(iter(result.graphs.values()))
        seen.append((predicted(graph), sorted(graph.converted_nodes)))
    (first, first_nodes), (second, second_nodes) = seen
    assert first_nodes == second_nodes and first["cost"] == second["cost"]
    if this_machine("bfloat16").low_units:
        assert "cached in" not in first["source"] and "cached in" in second["source"], second["source"]


@pytest.mark.parametrize("freeze", [False, True])
def test_a_model_over_the_profiled_size_keeps_the_op_table_and_says_why(small_cnn, tmp_path, monkeypatch, freeze):
    from mp_rewrite.savedmodel import measured_costs
    costs = this_machine("bfloat16")
    if not costs.low_units:
        pytest.skip("without bfloat16 units nothing is measured, so there is no fallback to see")
    monkeypatch.setattr(measured_costs, "PROFILE_LIMIT", 0)
    costs.batch = 2
    result = convert_saved_model(small_cnn, tmp_path / "out", "bfloat16", assign="cost", costs=costs, freeze=freeze)
    source = predicted(next(iter(result.graphs.values())))["source"]
    assert "not measured in the graph" in source and "GiB" in source and "over the 0 GiB profiled" in source, source


class Looper(tf.Module):
    """A matmul in a while loop: the loop's body runs without being inlined, so it has no times of its own."""

    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[1, 2]) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def __call__(self, x):
        _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.nn.relu(tf.matmul(h, self.w))),
                             (tf.constant(0), x))
        return {"y": tf.matmul(h, self.w)}


def test_a_loop_body_is_priced_from_the_op_table(tmp_path):
    costs = this_machine("bfloat16")
    if not costs.low_units:
        pytest.skip("without bfloat16 units nothing is measured")
    module = Looper()
    tf.saved_model.save(module, str(tmp_path / "loop"), signatures=module.__call__)
    costs.batch = 4
    result = convert_saved_model(tmp_path / "loop", tmp_path / "out", "bfloat16", assign="cost", costs=costs)
    graph = next(iter(result.graphs.values()))
    assert "1 loop or branch bodies from the op table" in predicted(graph)["source"]
    bodies = [r for r in graph.functions.values() if r.assignment and r.assignment.candidates]
    assert bodies and any("MatMul" in n for r in bodies for n in r.assignment.candidates)
    assert verify_saved_models(str(tmp_path / "loop"), str(tmp_path / "out"), precision="bfloat16").passed


def _step_body():
    """A tf.function that updates a variable, as a body (core.functions.BodyGraph) with its BodyArgs, the variable
    and the FunctionDef."""
    from mp_rewrite.analysis.graph_runs import BodyArg
    from mp_rewrite.core.functions import function_to_graph
    from mp_rewrite.core.op_support import Signatures
    variable = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    @tf.function
    def step(x):
        variable.assign_add(tf.ones_like(variable))
        return tf.matmul(x, variable)

    concrete = step.get_concrete_function(tf.TensorSpec([1, 2]))
    body = function_to_graph(concrete.function_def, Signatures(None))
    args = [BodyArg(tf.float32.as_datatype_enum, (1, 2), value=[[1.0, 0.0]]),
            BodyArg(tf.float32.as_datatype_enum, (2, 2), variable=True, value=variable.numpy())]
    return body, args, variable, concrete.function_def


def test_a_function_body_runs_in_a_session_with_a_copy_of_its_variables():
    from mp_rewrite.analysis.graph_runs import Runner
    body, args, variable, _ = _step_body()
    runner = Runner.of_body(body.graph_def, args, body.retvals, body.control_outputs)
    try:
        first, second = (runner.session.run(runner.fetches, runner.feed_dict)[0] for _ in range(2))
    finally:
        runner.session.close()
    # The session's own variable was updated by each run (its targets ran), the caller's never was.
    assert first.tolist() == [[2.0, 3.0]] and second.tolist() == [[3.0, 4.0]]
    assert variable.numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_a_function_body_races_as_a_function_with_a_copy_of_its_variables():
    from tensorflow.python.eager import context
    from mp_rewrite.analysis.graph_runs import FunctionRunner
    from mp_rewrite.core.functions import graph_to_function
    from mp_rewrite.core.op_support import Signatures
    body, args, variable, fdef = _step_body()
    fdef = graph_to_function(body.graph_def, fdef, Signatures(None))
    runner = FunctionRunner(fdef, args)
    try:
        assert context.context().has_function(runner.name) and runner.name != fdef.signature.name
        first, second = (runner.run()[0].numpy() for _ in range(2))
    finally:
        runner.close()
    assert first.tolist() == [[2.0, 3.0]] and second.tolist() == [[3.0, 4.0]]  # its own variable, updated
    assert variable.numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]  # the caller's, never written
    assert not context.context().has_function(runner.name)


def test_a_body_profiled_again_is_read_from_the_cache_whatever_the_order_of_its_control_outputs():
    import dataclasses
    from mp_rewrite.analysis.graph_profile import profile_body
    from mp_rewrite.core.op_support import Signatures
    body, args, _, _ = _step_body()
    options, machine = make_options("bfloat16"), this_machine("bfloat16")
    first = profile_body(body, args, options, Signatures(None), machine, runs=1)
    again = dataclasses.replace(body, control_outputs=tuple(reversed(body.control_outputs)))
    assert len(body.control_outputs) > 1  # the update and the read: a FunctionDef keeps them in a map
    second = profile_body(again, args, options, Signatures(None), machine, runs=1)
    assert "cached in" in second.table.note and "cached in" not in first.table.note


def test_a_body_whose_variables_pass_the_profiled_size_is_not_run():
    from mp_rewrite.analysis.graph_profile import body_profileable
    from mp_rewrite.analysis.graph_runs import BodyArg
    body, args, _, _ = _step_body()
    assert body_profileable(body.graph_def, args) == ""
    huge = [args[0], BodyArg(tf.float32.as_datatype_enum, (2**16, 2**15), variable=True)]  # 8 GiB, never allocated
    assert "8.0 GiB, over the 1 GiB profiled" in body_profileable(body.graph_def, huge)
    assert "neither a number tensor nor a variable" in body_profileable(body.graph_def, [args[0], None])


def test_a_batch_size_the_graph_cannot_run_at_is_left_out_of_the_choice_and_said():
    import numpy as np
    from mp_rewrite.analysis.graph_profile import profile_costs
    from mp_rewrite.analysis.variant_race import RACE_BATCHES
    machine = this_machine("bfloat16")
    if not machine.low_units:
        pytest.skip("without bfloat16 units nothing is raced")
    graph = tf.Graph()
    with graph.as_default():  # a graph that runs at batch 8 only: a Reshape fixes it
        x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
        w = tf.constant(np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32))
        tf.identity(tf.nn.relu(tf.matmul(tf.reshape(x, [8, 64]), w)), name="y")
    profile = profile_costs(graph.as_graph_def(), [(tf.TensorSpec([None, 64], tf.float32), "x:0")], ["y:0"],
                            make_options("bfloat16"), ["x"], machine, batch=8, batches=RACE_BATCHES)
    assert "raced at batch 8 (" in profile.table.note and "float32 did not run at batch 1, 32" in profile.table.note


def test_where_the_frozen_graph_without_the_rules_ran_fastest_it_is_rewritten_instead(small_cnn, tmp_path):
    from mp_rewrite.core.assignment import SOURCE, CostTable
    ruled = {}
    for keep in ("float32", SOURCE):
        result = convert_saved_model(small_cnn, tmp_path / keep, "bfloat16", assign="cost", freeze=True,
                                     costs=CostTable("bfloat16", keep=keep))
        ruled[keep] = [r for graph in result.graphs.values() for r in graph.rules if r.applied]
        assert not result.converted_nodes
    assert ruled["float32"] and not ruled[SOURCE]  # the BatchNorm folded with the rules, not without
    assert verify_saved_models(str(small_cnn), str(tmp_path / SOURCE), precision="bfloat16").passed


def test_where_the_model_as_given_ran_fastest_it_is_written_without_the_rules(small_cnn, tmp_path):
    from mp_rewrite.core.assignment import SOURCE, CostTable
    source = read_saved_model(small_cnn).meta_graphs[0]
    for keep in ("float32", SOURCE):
        # A table that says what the race chose (as a measured one would), so the choice is not left to timing.
        result = convert_saved_model(small_cnn, tmp_path / keep, "bfloat16", assign="cost",
                                     costs=CostTable("bfloat16", keep=keep))
        written = read_saved_model(tmp_path / keep).meta_graphs[0]
        same = {f.signature.name for f in written.graph_def.library.function} & \
            {f.signature.name for f in source.graph_def.library.function}
        bodies = lambda meta: {f.signature.name: f for f in meta.graph_def.library.function}  # noqa: E731
        unchanged = all(bodies(written)[n] == bodies(source)[n] for n in same)
        ruled = any(r.rules for graph in result.graphs.values() for r in graph.functions.values())
        if keep == SOURCE:  # written as given: not a node converted, no rule applied
            assert unchanged and not ruled and not result.converted_nodes
        else:  # float32 with the rules: the BatchNorm folded, so the functions differ
            assert not unchanged and ruled and not result.converted_nodes
    assert verify_saved_models(str(small_cnn), str(tmp_path / SOURCE), precision="bfloat16").passed


def test_twin_signatures_are_run_once_per_profiled_run(small_cnn):
    from mp_rewrite.savedmodel.measured_costs import in_place_costs
    meta = read_saved_model(small_cnn).meta_graphs[0]
    assert {"serve", "serving_default"} <= set(meta.signature_def)  # Keras' export: one function, two names
    costs = this_machine("bfloat16")
    if not costs.low_units:
        pytest.skip("without bfloat16 units nothing is measured")
    costs.batch = 2
    table = in_place_costs(make_options("bfloat16", assign="cost", costs=costs), small_cnn, meta).costs
    # Both signatures in one session run ran the model twice at once, on two cores: each call timed contended.
    assert table.runs is not None and table.runs.calls and set(table.runs.calls.values()) == {1}, table.runs.calls


def test_a_small_batch_size_is_raced_at_its_size_from_node_times_measured_at_8(small_cnn, tmp_path):
    costs = this_machine("bfloat16")
    if not costs.low_units:
        pytest.skip("without bfloat16 units nothing is measured or raced")
    costs.batch = 1
    result = convert_saved_model(small_cnn, tmp_path / "out", "bfloat16", assign="cost", costs=costs, freeze=True)
    note = predicted(next(iter(result.graphs.values())))["source"]
    # Per-node times at batch 1 are mostly per-op overhead: measured at 8, the variants raced where they will run.
    assert "costs measured in this graph on this machine at batch 8 (" in note and "raced at batch 1 (" in note, note


def test_a_signature_whose_output_is_no_function_call_has_no_identity_and_its_graph_is_left_as_it_was():
    from tensorflow.core.protobuf import meta_graph_pb2

    from mp_rewrite.savedmodel.measured_costs import _call_identity
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.node.add(name="x", op="Placeholder")
    meta.graph_def.node.add(name="y", op="Identity", input=["x"])
    signature = meta.signature_def["serving_default"]
    signature.inputs["x"].name, signature.outputs["y"].name = "x:0", "y:0"
    before = meta.SerializeToString(deterministic=True)
    assert _call_identity(meta, signature) is None  # a TF1 export's output: nothing to tell a twin by
    assert meta.SerializeToString(deterministic=True) == before  # no empty "f" attr added to the node
