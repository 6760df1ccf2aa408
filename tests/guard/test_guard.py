"""The accuracy guard: range screen, attribution, search, reasons and override files, on real TF graphs.

The fragile model fails float16 in two known places: `hot` (a Dense with large weights) produces activations
beyond 65504 that a LayerNormalization would bring back, and `logits` sits on a +1000 offset, where float16 keeps
only ~0.5 of absolute precision, so the softmax over it drifts. Everything else is well-behaved.
"""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from mp_rewrite import rewrite_graph_def
from mp_rewrite.testing import examples
from mp_rewrite.errors import OptionError
from mp_rewrite.analysis.execution import run_graph_def
from mp_rewrite.guard.accuracy_guard import PREFIX, exact_patterns, guard, load_override_reasons, load_overrides
from mp_rewrite.guard.screen import ScreenTarget, range_findings
from mp_rewrite.guard.search import OutputError, element_ratio, search_blind, search_ranked
from mp_rewrite.core.pass_context import compile_patterns

HOT, LOGITS = "fragile_mlp_1/hot_1/MatMul", "fragile_mlp_1/logits_1/MatMul"


def fragile_model(hot_scale: float = 1e5, logit_offset: float = 1000.0) -> keras.Model:
    """An MLP with a log-sum-exp and a softmax head; `hot_scale` / `logit_offset` make it fragile (1 / 0: not)."""
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(1234)
    x = inp = keras.Input((64,), name="features")
    for i in range(3):
        x = keras.layers.Dense(256, activation="relu", name=f"body{i}")(x)
    hot = keras.layers.Dense(32, name="hot")
    x = keras.layers.LayerNormalization(name="norm")(hot(x))
    for i in range(2):
        x = keras.layers.Dense(256, activation="relu", name=f"head{i}")(x)
    logits = keras.layers.Dense(16, name="logits")
    z = logits(x)
    lse = keras.layers.Lambda(lambda t: tf.reduce_logsumexp(t, axis=-1, keepdims=True), name="lse")(z)
    model = keras.Model(inp, [lse, keras.layers.Softmax(name="probs")(z)], name="fragile_mlp")
    kernel, bias = hot.get_weights()
    hot.set_weights([kernel * hot_scale, bias])
    kernel, bias = logits.get_weights()
    logits.set_weights([kernel * 3, bias + logit_offset])
    return model


def fragile_mlp(hot_scale: float = 1e5, logit_offset: float = 1000.0) -> examples.ExampleGraph:
    """fragile_model's forward pass as a frozen GraphDef with a batch of 8 inputs."""
    return examples.inference_graph(fragile_model(hot_scale, logit_offset), batch=8)


@pytest.fixture(scope="module")
def fragile():
    return fragile_mlp()


@pytest.fixture(scope="module")
def guarded(fragile):
    return guard(fragile.graph_def, fragile.fetches, fragile.inputs, "float16")


def _bytes(graph_def) -> bytes:
    return graph_def.SerializeToString(deterministic=True)


# --------------------------------------------------------------------------------------------- pure parts


def test_screen_keeps_producer_and_readers_of_an_overflowing_tensor():
    targets = [ScreenTarget("a:0", "a", ("b", "c")), ScreenTarget("d:0", None, ("e",)), ScreenTarget("f:0", "f", ())]
    values = [np.array([1.0, -7.1e5]), np.array([3.0, 65504.0]), np.array([np.inf, 2.0])]
    found = {f.node: f for f in range_findings(targets, values, "float16")}
    assert sorted(found) == ["a", "b", "c"]  # 65504 fits; a float32 inf is not the rewrite's doing
    assert found["a"].role == "produces" and "max |x| = 7.1e+05 exceeds float16" in found["a"].detail
    assert found["b"].role == "reads" and found["b"].tensor == "a:0"
    assert range_findings(targets, values, "bfloat16") == []  # bfloat16 has float32's range


def test_screen_flags_underflow_only_where_it_matters():
    rng = np.random.default_rng(0)
    tiny = rng.uniform(1e-7, 1e-6, 100)                     # all of it below float16's smallest normal
    softmax = np.concatenate([[0.9], rng.uniform(1e-8, 1e-7, 50)])  # tiny tail next to a large value
    targets = [ScreenTarget("t:0", "t", ()), ScreenTarget("s:0", "s", ())]
    found = range_findings(targets, [tiny, softmax], "float16")
    assert [(f.node, f.kind) for f in found] == [("t", "underflow")]
    assert range_findings(targets, [tiny, softmax], "float16", underflow_share=None) == []


def test_exact_patterns_match_only_their_node():
    names = ["d/Tensordot", "d/Tensordot/MatMul", "d/BiasAdd", "x[1]", "x1"]
    patterns = exact_patterns(["d/Tensordot", "d/BiasAdd", "x[1]"], names)
    assert patterns == {"d/Tensordot": "=d/Tensordot", "d/BiasAdd": "d/BiasAdd", "x[1]": "=x[1]"}  # readable
    for node, pattern in patterns.items():
        matches = compile_patterns([pattern], "keep_fp32")
        assert [n for n in names if matches(n)] == [node]


def test_output_error_is_allclose_with_nonfinite_values_handled():
    rng = np.random.default_rng(1)
    for _ in range(20):
        ref = rng.standard_normal(50)
        got = ref + rng.standard_normal(50) * 10 ** rng.uniform(-4, -1)
        assert (element_ratio(ref, got, 1e-2, 1e-3)[0] <= 1) == np.allclose(got, ref, rtol=1e-2, atol=1e-3)
    assert element_ratio(np.array([1.0, np.inf]), np.array([1.0, np.inf]), 0, 1e-3)[0] == 0
    assert math.isinf(element_ratio(np.array([1.0, 2.0]), np.array([1.0, np.nan]), 1e-2, 1e-2)[0])


class _Unit:
    def __init__(self, name, ratio):
        self.unit = type("U", (), {"nodes": (name,), "seed": name})()
        self.alone = OutputError(ratio, 0.0, "out")


class _Checker:
    """Keep sets pass when they contain every node in `needed`; counts the distinct sets asked about."""

    def __init__(self, needed):
        self.needed, self.asked = set(needed), set()

    def error(self, keep, stage="search"):
        self.asked.add(keep)
        return OutputError(0.5 if self.needed <= keep else 2.0, 0.0, "out")

    def passes(self, keep, stage="search"):
        return self.error(keep).passed


def test_ranked_search_probes_where_attribution_points():
    cands = [_Unit(f"u{i}", r) for i, r in enumerate([9.0, 3.0, 0.5, 0.4, 0.1, 0.05, 0.02, 0.01])]
    checker = _Checker({"u0", "u1"})
    chosen = search_ranked(cands, frozenset(), checker, total=10.0)
    assert [c.unit.seed for c in chosen] == ["u0", "u1"]
    assert len(checker.asked) <= 3


def test_blind_search_finds_the_needed_units():
    cands = [_Unit(f"u{i}", math.nan) for i in range(16)]
    checker = _Checker({"u3", "u11"})
    chosen = search_blind(cands, frozenset(), checker)
    assert sorted(c.unit.seed for c in chosen) == ["u11", "u3"]
    assert len(checker.asked) < 16


# --------------------------------------------------------------------------------------------- the guard


def test_guard_keeps_the_known_culprits_and_meets_the_tolerance(fragile, guarded):
    r = guarded
    assert math.isinf(r.before.ratio) and r.met
    stages = {k.node: k.stage for k in r.kept}
    assert stages[HOT] == "screen" and stages[LOGITS] == "search"
    assert not any("body" in n or "head" in n for n in stages)  # the well-behaved layers stay float16
    assert r.executions <= 6
    assert r.flop_share().share >= 0.9
    # The result really meets the tolerance when run on its own.
    ref = run_graph_def(fragile.graph_def, fragile.inputs, fragile.fetches)
    got = run_graph_def(r.rewrite.graph_def, fragile.inputs, fragile.fetches)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=r.rtol, atol=r.atol)


def test_kept_nodes_are_explained_in_the_coloring(guarded):
    hot = guarded.rewrite.coloring[(HOT, "T")]
    assert hot.color == "deny" and hot.reason.rule == "user_keep_fp32"
    assert hot.reason.detail.startswith(PREFIX) and "exceeds float16" in hot.reason.detail
    logits = guarded.rewrite.coloring[(LOGITS, "T")]
    assert logits.reason.rule == "user_keep_fp32" and "of output error" in logits.reason.detail
    assert "non-finite before" in logits.reason.detail
    body = guarded.rewrite.coloring[("fragile_mlp_1/body0_1/MatMul", "T")]
    assert body.color == "allow"


def test_guard_leaves_a_passing_model_as_the_plain_conversion_makes_it():
    g = fragile_mlp(hot_scale=1.0, logit_offset=0.0)
    r = guard(g.graph_def, g.fetches, g.inputs, "float16")
    plain = rewrite_graph_def(g.graph_def, "float16", g.fetches)
    assert r.met and r.kept == [] and r.executions == 2
    assert _bytes(r.rewrite.graph_def) == _bytes(plain.graph_def)


def test_guard_is_deterministic(fragile, guarded):
    again = guard(fragile.graph_def, fragile.fetches, fragile.inputs, "float16")
    assert again.kept == guarded.kept
    assert [(a.stage, a.kept, a.error) for a in again.attempts] == [(a.stage, a.kept, a.error)
                                                                     for a in guarded.attempts]
    assert _bytes(again.rewrite.graph_def) == _bytes(guarded.rewrite.graph_def)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_overrides_round_trip(fragile, guarded, tmp_path, suffix):
    path = guarded.save_overrides(tmp_path / f"keep{suffix}")
    patterns = load_overrides(path)
    assert patterns == guarded.keep_fp32 and patterns
    again = rewrite_graph_def(fragile.graph_def, "float16", fragile.fetches, keep_fp32=patterns)
    assert _bytes(again.graph_def) == _bytes(guarded.rewrite.graph_def)
    reasons = load_override_reasons(path)
    assert list(reasons) == list(patterns)
    assert all(reasons[k.pattern] == k.detail and k.detail.startswith(PREFIX) for k in guarded.kept)


def test_load_overrides_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"keep_fp32": ["x"]}))
    with pytest.raises(OptionError, match="not an accuracy guard overrides file"):
        load_overrides(bad)
    with pytest.raises(OptionError, match="cannot read"):
        load_overrides(tmp_path / "missing.toml")


def test_user_keep_fp32_is_applied_and_kept_in_the_overrides(fragile):
    user = "fragile_mlp_1/body0_1/MatMul"
    r = guard(fragile.graph_def, fragile.fetches, fragile.inputs, "float16", keep_fp32=[user])
    assert r.met and r.keep_fp32[0] == user
    decision = r.rewrite.coloring[(user, "T")]
    assert decision.reason.rule == "user_keep_fp32" and decision.reason.detail == ""
    with pytest.raises(OptionError, match="unknown option"):
        guard(fragile.graph_def, fragile.fetches, fragile.inputs, bogus=1)


def test_bfloat16_needs_no_range_keeps_but_still_the_logits(fragile):
    r = guard(fragile.graph_def, fragile.fetches, fragile.inputs, "bfloat16")
    assert r.met and r.analysis.findings == []
    assert LOGITS in {k.node for k in r.kept}


def test_loops_without_attribution_still_meet_the_tolerance():
    g = examples.EXAMPLES["lstm/inference"]()  # Switch/Merge loops: no side-by-side copies, halving instead
    r = guard(g.graph_def, g.fetches, g.inputs, "float16", rtol=2e-4, atol=2e-4)
    plain = rewrite_graph_def(g.graph_def, "float16", g.fetches)
    assert not r.before.passed and r.met and not r.analysis.attributed
    assert 0 < len(r.kept) < len(plain.converted_nodes) and r.executions <= 16


def test_function_bodies_are_measured_whole():
    g = examples.EXAMPLES["lstm_functional/inference"]()  # the LSTM cell lives in a While body function
    r = guard(g.graph_def, g.fetches, g.inputs, "float16", rtol=2e-4, atol=2e-4)
    assert not r.before.passed and r.met and r.analysis.attributed
    body = next(u for u in r.analysis.units if u.unit.seed.startswith("function "))
    assert {k.node for k in r.kept} == set(body.unit.nodes)  # the cell, not the Dense after the loop
    assert all("function lstm_1_lstm_1_while_body" in k.detail for k in r.kept)


def test_side_by_side_copies_compute_what_their_graphs_compute(fragile):
    from mp_rewrite.guard.attribution import seeds_of, side_by_side
    from mp_rewrite.guard.screen import GraphInfo, converted_units, output_tensors
    g, outputs = fragile.graph_def, output_tensors(fragile.fetches)
    base = sorted(exact_patterns([HOT, "fragile_mlp_1/hot_1/BiasAdd", "fragile_mlp_1/norm_1/mul_2"],
                                 [n.name for n in g.node]).values())
    mixed = rewrite_graph_def(g, "float16", fragile.fetches, keep_fp32=base)
    info = GraphInfo(mixed.graph_def)
    units = converted_units(info, set(mixed.converted_nodes), seeds_of(mixed))
    sbs = side_by_side(g, GraphInfo(g), mixed.graph_def, info, mixed.casts, units, outputs, include_mixed=True)
    got = dict(zip(sbs.fetches, run_graph_def(sbs.graph_def, fragile.inputs, sbs.fetches, optimize=False)))
    # The mixed copy is the mixed graph.
    alone = run_graph_def(mixed.graph_def, fragile.inputs, outputs)
    for copy, value in zip(sbs.mixed, alone):
        np.testing.assert_array_equal(got[copy], value)
    # A unit's variant is the graph with every other converted node kept float32.
    index = next(i for i, u in enumerate(units) if u.seed == LOGITS)
    others = [n for u in units if u.seed != LOGITS for n in u.nodes]
    keep = base + list(exact_patterns(others, [n.name for n in g.node]).values())
    only = rewrite_graph_def(g, "float16", fragile.fetches, keep_fp32=keep)
    assert set(only.converted_nodes) == set(units[index].nodes)
    reached, _ = sbs.units[index]
    for copy, value in zip(reached, run_graph_def(only.graph_def, fragile.inputs, outputs)):
        np.testing.assert_array_equal(got[copy], value)


@pytest.mark.slow
def test_saved_model_guard_feeds_convert_and_verify(tmp_path):
    from mp_rewrite.guard.saved_model import guard_saved_model
    from mp_rewrite.savedmodel.convert import convert_saved_model
    from mp_rewrite.savedmodel.verify import verify_saved_models
    source = tmp_path / "fragile"
    fragile_model().export(str(source), verbose=False)
    inputs = {"features": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    guarded = guard_saved_model(source, inputs, precision="float16")
    assert guarded.result.met and guarded.signature == "serving_default"
    assert {"fragile_mlp_1/hot_1/MatMul", "fragile_mlp_1/logits_1/MatMul"} <= set(guarded.keep_fp32)
    outcomes = {}
    for name, keep in (("plain", ()), ("guarded", guarded.keep_fp32)):
        convert_saved_model(source, tmp_path / name, "float16", device="any", keep_fp32=keep, flops=False)
        outcomes[name] = verify_saved_models(source, tmp_path / name, inputs=inputs, precision="float16").passed
    assert outcomes == {"plain": False, "guarded": True}
    path = guarded.save_overrides(tmp_path / "keep.toml")  # re-applied by name, without running the guard again
    convert_saved_model(source, tmp_path / "again", "float16", device="any", keep_fp32=load_overrides(path),
                        flops=False)
    assert verify_saved_models(source, tmp_path / "again", inputs=inputs, precision="float16").passed


def test_regions_are_refined_to_the_units_they_need(fragile, guarded):
    r = guard(fragile.graph_def, fragile.fetches, fragile.inputs, "float16", granularity="region")
    assert r.met and r.analysis.level == "region"
    assert any(u.unit.seed.startswith("region of ") for u in r.analysis.units)
    assert {k.node for k in r.kept} == {k.node for k in guarded.kept}  # the same units as isolating them directly


def test_each_variant_is_its_unit_alone_in_low_precision():
    from mp_rewrite.guard.attribution import seeds_of, side_by_side
    from mp_rewrite.guard.screen import GraphInfo, converted_units, output_tensors
    g = examples.EXAMPLES["transformer/inference"]()  # residual Adds read units through other units
    outputs, names = output_tensors(g.fetches), [n.name for n in g.graph_def.node]
    mixed = rewrite_graph_def(g.graph_def, "float16", g.fetches)
    info = GraphInfo(mixed.graph_def)
    units = converted_units(info, set(mixed.converted_nodes), seeds_of(mixed))
    sbs = side_by_side(g.graph_def, GraphInfo(g.graph_def), mixed.graph_def, info, mixed.casts, units, outputs,
                       include_mixed=False)
    got = dict(zip(sbs.fetches, run_graph_def(sbs.graph_def, g.inputs, sbs.fetches, optimize=False)))
    compared = 0
    for unit, (reached, _) in zip(units, sbs.units):
        others = [n for u in units if u is not unit for n in u.nodes]
        only = rewrite_graph_def(g.graph_def, "float16", g.fetches,
                                 keep_fp32=list(exact_patterns(others, names).values()))
        if set(only.converted_nodes) != set(unit.nodes):
            continue  # keeping the others changed this unit's own colors (an infer node no longer between allow)
        compared += 1
        for copy, value in zip(reached, run_graph_def(only.graph_def, g.inputs, outputs)):
            np.testing.assert_array_equal(got[copy], value, err_msg=unit.seed)
    assert compared >= len(units) // 2


def test_mp_rewrite_guard_is_the_function_whatever_was_imported():
    import mp_rewrite
    import mp_rewrite.guard.accuracy_guard  # noqa: F401
    import mp_rewrite.guard.saved_model  # noqa: F401
    g = fragile_mlp(hot_scale=1.0, logit_offset=0.0)
    assert mp_rewrite.guard(g.graph_def, g.fetches, g.inputs).executions == 2


def test_cli_convert_guard_meets_the_tolerance_and_writes_overrides(tmp_path, capsys):
    from mp_rewrite.commands import cli
    source = tmp_path / "fragile"
    fragile_model().export(str(source), verbose=False)
    inputs = tmp_path / "calib.npz"
    np.savez(inputs, features=np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
    out, overrides = tmp_path / "out", tmp_path / "kept.toml"
    common = ["--precision", "float16", "--device", "any", "--inputs", str(inputs), "--verify"]
    assert cli.main(["convert", str(source), str(tmp_path / "plain")] + common) == 1  # plain conversion misses
    assert cli.main(["convert", str(source), str(out), "--guard", "--guard-overrides", str(overrides)] + common) == 0
    assert "fragile_mlp_1/hot_1/MatMul" in load_overrides(overrides)
    again = ["convert", str(source), str(tmp_path / "again"), "--keep-fp32-file", str(overrides)] + common
    assert cli.main(again) == 0
    assert "hot_1/MatMul" in capsys.readouterr().out


def test_repeated_reasons_are_grouped():
    from mp_rewrite.guard.result import KeptNode, _grouped_reasons
    kept = [KeptNode(f"n{i}", f"=n{i}", "screen", PREFIX + "max |x| = 7e4 exceeds float16", f"n{i}") for i in range(5)]
    kept.append(KeptNode("other", "other", "search", PREFIX + "contributed 40% of output error", "other"))
    lines = _grouped_reasons(kept)
    assert lines == ["    5 nodes (n0, n1, n2 and 2 more): max |x| = 7e4 exceeds float16",
                     "    other: contributed 40% of output error"]
