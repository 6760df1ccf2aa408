"""The cost assignment (core.assignment): the minimum cut is exact (brute force agrees), deterministic, never makes
a vertex low that Grappler's lists keep float32, and converts nothing when low precision is slower everywhere."""

import dataclasses
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mp_rewrite
from chains import chain, dtype_string
from mp_rewrite.core.assignment import FP32, LOW, CostTable, Problem, solve, total_cost
from mp_rewrite.errors import OptionError
from random_graphs import build_graph, graph_specs

ms = st.floats(0, 2, allow_nan=False).map(lambda x: round(x, 4))


@st.composite
def problems(draw, max_vars=7):
    """A random problem: node costs, tensors (producer -> several consumers, fixed ends among them), fusions."""
    n = draw(st.integers(1, max_vars))
    end = st.sampled_from([FP32, LOW]) | st.integers(0, n - 1)
    node_ms = [(draw(ms), draw(ms)) for _ in range(n)]
    tensors = [(draw(end), sorted(set(draw(st.lists(end, min_size=1, max_size=3)))), draw(ms), draw(ms))
               for _ in range(draw(st.integers(0, 2 * n)))]
    fusions = [(draw(end), draw(end), draw(ms)) for _ in range(draw(st.integers(0, 2)))]
    return Problem(node_ms, tensors, fusions)


def brute_force(problem):
    n = len(problem.node_ms)
    return min(total_cost(problem, low) for low in itertools.product((False, True), repeat=n))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_minimum_cut_equals_brute_force(problem):
    low = solve(problem)
    assert total_cost(problem, low) == pytest.approx(brute_force(problem), abs=1e-5)
    assert solve(problem) == low  # deterministic


def test_ties_stay_float32():
    assert solve(Problem([(1.0, 1.0), (0.5, 0.5)], [(0, [1], 0.0, 0.0)])) == [False, False]


def test_casts_are_counted_once_per_tensor_not_per_consumer():
    # x0 is faster low by 0.3 ms; its output feeds three fixed float32 consumers: one cast (0.2 ms) back, not three.
    problem = Problem([(1.0, 0.7)], [(0, [FP32, FP32, FP32], 0.0, 0.2)])
    assert solve(problem) == [True]
    assert total_cost(problem, [True]) == pytest.approx(0.9)


def test_a_cast_that_costs_more_than_the_gain_keeps_float32():
    problem = Problem([(1.0, 0.7)], [(FP32, [0], 0.25, 0.0), (0, [FP32], 0.0, 0.25)])
    assert solve(problem) == [False]


def test_a_negative_time_is_refused():
    with pytest.raises(OptionError, match="negative"):
        solve(Problem([(-1.0, 0.0)]))


# --- the stage in the pass -------------------------------------------------------------------------------------

def table_for(graph_def, fp32_ms, low_ms, cast_ms=0.01, precision="bfloat16"):
    nodes = {n.name: (fp32_ms(n.op), low_ms(n.op)) for n in graph_def.node}
    casts = {(n.name, 0): (cast_ms, cast_ms) for n in graph_def.node}
    return CostTable(precision, {"graph": nodes}, {"graph": casts})


def test_low_precision_slower_everywhere_converts_nothing():
    graph_def, fetches, names = chain("MatMul", "Relu", "MatMul", "Tanh", "MatMul")
    table = table_for(graph_def, lambda op: 1.0, lambda op: 1.5)
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=table)
    assert dtype_string(result.graph_def, names) == "fffff"
    assert not result.casts
    reason = result.coloring["n0", "T"].reason
    assert reason.stage == "assign_by_cost" and reason.rule == "cost_float32"
    assert "bfloat16 1.500 ms vs float32 1.000 ms" in reason.detail


def test_only_the_ops_that_gain_more_than_their_casts_convert():
    # MatMuls gain 1.5 ms in bfloat16, Tanh loses 0.4 ms: Tanh stays float32 unless its four casts cost more.
    graph_def, fetches, names = chain("MatMul", "Tanh", "MatMul")
    fp32 = lambda op: 2.0 if op == "MatMul" else 1.0  # noqa: E731
    low = lambda op: 0.5 if op == "MatMul" else 1.4  # noqa: E731
    fast_matmul = table_for(graph_def, fp32, low, cast_ms=0.05)
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=fast_matmul)
    assert dtype_string(result.graph_def, names) == "bfb"
    assert result.assignment.demoted == ("n1",)
    assert result.assignment.cost < result.assignment.lists_cost
    expensive_casts = table_for(graph_def, fp32, low, cast_ms=0.3)
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=expensive_casts)
    assert dtype_string(result.graph_def, names) == "bbb"
    assert result.coloring["n1", "T"].reason.rule == "cost_low"


def test_force_low_nodes_stay_low_whatever_they_cost():
    graph_def, fetches, names = chain("MatMul", "Relu")
    table = table_for(graph_def, lambda op: 1.0, lambda op: 5.0)
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=table,
                                          force_low=["n0"])
    assert dtype_string(result.graph_def, names) == "bf"


def test_a_machine_without_low_precision_units_keeps_everything_float32_and_says_why():
    graph_def, fetches, names = chain("MatMul", "Relu")
    table = CostTable("bfloat16", low_units=False, note="this CPU has no avx512_bf16 or amx_bf16")
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=table)
    assert dtype_string(result.graph_def, names) == "ff"
    assert result.assignment.note == "this CPU has no avx512_bf16 or amx_bf16"
    assert "avx512_bf16" in result.coloring["n0", "T"].reason.detail


@pytest.mark.parametrize("kwargs, message", [
    ({"assign": "fastest"}, "unknown assign mode"),
    ({"assign": "cost"}, "needs costs"),
    ({"assign": "cost", "costs": CostTable("float16")}, "measured for float16"),
])
def test_bad_assign_options_are_one_line_errors(kwargs, message):
    graph_def, fetches, _ = chain("MatMul")
    with pytest.raises(OptionError, match=message):
        mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, **kwargs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=graph_specs(max_steps=8), seed=st.integers(0, 2**16))
def test_the_cut_never_makes_low_what_the_lists_keep_float32(spec, seed):
    built = build_graph(spec)
    rng = random.Random(seed)
    nodes = {n.name: (rng.uniform(0, 1), rng.uniform(0, 1)) for n in built.graph_def.node}
    table = CostTable("bfloat16", {"graph": nodes})
    lists = mp_rewrite.rewrite_graph_def(built.graph_def, "bfloat16", built.fetches, functions=False)
    cost = mp_rewrite.rewrite_graph_def(built.graph_def, "bfloat16", built.fetches, functions=False,
                                        assign="cost", costs=table)
    assert set(cost.retyped) <= set(lists.retyped)
    again = mp_rewrite.rewrite_graph_def(built.graph_def, "bfloat16", built.fetches, functions=False,
                                         assign="cost", costs=table)
    assert again.graph_def == cost.graph_def
    fetched = {f.split(":")[0] for f in built.fetches}
    assert not any(node in fetched for node, _ in cost.retyped)


@pytest.mark.parametrize("keep, expected", [("lists", "bbbbb"), ("float32", "fffff")])
def test_a_table_that_ran_the_cut_slower_keeps_what_ran_faster(keep, expected):
    graph_def, fetches, names = chain("MatMul", "Relu", "MatMul", "Tanh", "MatMul")
    # The table predicts the cut (low precision 2x faster everywhere: all bfloat16), but running it said otherwise.
    table = dataclasses.replace(table_for(graph_def, lambda op: 1.0, lambda op: 0.5), keep=keep)
    result = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=table)
    assert dtype_string(result.graph_def, names)[:5] == expected
    details = [result.coloring[n, "T"].reason.detail for n in names]
    assert all(f"the model ran faster with {keep} than with the cut" in d for d in details), details


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), data=st.data())
def test_variables_held_together_end_on_one_side_at_the_least_cost_that_allows(problem, data):
    n = len(problem.node_ms)
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3))
    problem = dataclasses.replace(problem, together=pairs)
    low = solve(problem)
    assert all(low[a] == low[b] for a, b in pairs)
    allowed = [x for x in itertools.product((False, True), repeat=n) if all(x[a] == x[b] for a, b in pairs)]
    assert total_cost(problem, low) == pytest.approx(min(total_cost(problem, x) for x in allowed), abs=1e-5)


def test_nodes_of_one_key_go_to_one_side_together():
    # Alone, the second MatMul would stay float32 (slower in bfloat16 by more than its casts); held together with the
    # first, which gains far more, both convert.
    graph_def, fetches, names = chain("MatMul", "Tanh", "MatMul")
    times = {"n0": (2.0, 0.5), "n2": (1.0, 1.3)}
    table = CostTable("bfloat16", {"graph": {"n0": times["n0"], "n2": times["n2"]}},
                      {"graph": {(name, 0): (0.01, 0.01) for name in names}})
    alone = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=table)
    assert "n2" in alone.assignment.demoted and "n0" not in alone.assignment.demoted
    together = dataclasses.replace(table, together={"graph": {"n0": "MatMul", "n2": "MatMul"}})
    held = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches, assign="cost", costs=together)
    assert not {"n0", "n2"} & set(held.assignment.demoted)
    reason = held.coloring["n2", "T"].reason.detail
    assert "placed with the 1 other MatMul node(s), priced at their op type's ratio" in reason, reason
