"""Costs from alternated traced runs (analysis.graph_costs.pooled_pairs, measured_pair): pure arithmetic, no
TensorFlow. A difference the runs disagree on is a tie; an op type's nodes share one measured ratio."""

import pytest

from mp_rewrite.analysis.graph_costs import measured_pair, pooled_pairs


def test_a_node_is_faster_in_one_precision_only_when_every_run_says_so():
    assert measured_pair([1.0, 1.1, 1.0], [0.5, 0.6, 0.55]) == (1.0, 0.5)  # the least of each
    # One run of three says the other way: a tie, their mean twice.
    assert measured_pair([1.0, 1.1, 0.5], [0.5, 0.6, 0.9]) == pytest.approx((0.5, 0.5))
    # Runs within what timing resolves: a tie.
    assert measured_pair([1.0, 1.0], [1.01, 0.99]) == pytest.approx((0.995, 0.995))


def test_an_op_types_nodes_share_its_ratio_over_the_runs():
    fp32 = {"a": [2.0, 2.2, 2.1], "b": [0.2, 0.2, 0.3], "c": [1.0, 1.0, 1.0]}
    low = {"a": [1.0, 1.1, 1.0], "b": [0.3, 0.25, 0.3], "c": [2.0, 2.0, 2.0]}
    pairs = pooled_pairs(fp32, low, {"a": "Conv2D", "b": "Conv2D", "c": "Erfc"})
    # Conv2D: per run (1.3, 1.35, 1.3) over (2.2, 2.4, 2.4): the median ratio, 1.35 / 2.4, times each node's least
    # time. "b", slower in bfloat16 alone, is priced as its op type runs.
    ratio = 1.35 / 2.4
    assert pairs["a"] == pytest.approx((2.0, 2.0 * ratio)) and pairs["b"] == pytest.approx((0.2, 0.2 * ratio))
    assert pairs["c"] == (1.0, 2.0)


def test_an_op_type_the_runs_disagree_on_is_a_tie_and_untimed_nodes_are_priced_alone():
    fp32 = {"a": [1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0]}
    low = {"a": [0.5, 1.6, 0.6], "b": [0.6, 1.5, 0.5]}
    pairs = pooled_pairs(fp32, low, {"a": "Relu", "b": "Relu", "fused": "BiasAdd"})
    assert pairs["a"] == (1.0, 1.0) and pairs["b"] == (1.0, 1.0)
    assert pairs["fused"] == (0.0, 0.0)  # no time of its own in either run


def test_an_op_type_timed_at_zero_in_a_float32_run_is_priced_node_by_node():
    # Step stats count whole microseconds: a tiny training step's Reshapes read 0 in a float32 run (CI once divided
    # by that sum and lost the step's measuring). Every run says float32 is faster, yet no ratio is read over 0.
    fp32 = {"a": [0.0, 0.001, 0.0], "b": [0.0, 0.0, 0.001]}
    low = {"a": [0.01, 0.012, 0.011], "b": [0.02, 0.02, 0.02]}
    pairs = pooled_pairs(fp32, low, {"a": "Reshape", "b": "Reshape"})
    assert pairs == {"a": measured_pair(fp32["a"], low["a"]), "b": measured_pair(fp32["b"], low["b"])}
    assert pairs["a"] == (0.0, 0.01) and pairs["b"] == (0.0, 0.02)
