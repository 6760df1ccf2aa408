"""Cost tables (analysis.op_costs): files round-trip, bad files are one-line errors, the cache follows XDG, and a
small CNN and Transformer block converted with a table measured here run and match float32."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import mp_rewrite
from mp_rewrite.analysis.compare import default_tolerance
from mp_rewrite.analysis.execution import run_graph_def
from mp_rewrite.analysis.op_costs import MachineCosts, cache_dir, load_costs, machine_facts, measure_costs
from mp_rewrite.errors import CostTableError
from mp_rewrite.testing import example_models, examples

NATIVE_BF16 = {"avx512_bf16", "amx_bf16"} & set(machine_facts()["cpu_flags"])


def table(**changes):
    facts = dict(machine_facts(), **changes.pop("machine", {}))
    return MachineCosts("bfloat16", facts, ops={'["MatMul"]': [1.0, 0.5], '["Bad"]': None},
                        casts=[(256, 0.001, 0.001), (65536, 0.01, 0.02)], **changes)


def test_a_table_round_trips_through_its_file(tmp_path):
    path = str(tmp_path / "costs.json")
    table().save(path)
    loaded = load_costs(path)
    assert (loaded.precision, loaded.ops, loaded.casts) == ("bfloat16", table().ops, table().casts)
    assert loaded.source == path


def test_cast_time_interpolates_between_measured_sizes():
    t = table()
    assert t.cast_ms(256) == (0.001, 0.001)
    low, high = t.cast_ms(4096)
    assert 0.001 < low < 0.01 and 0.001 < high < 0.02
    assert t.cast_ms(None)[0] > 0  # the documented default for an unknown size


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not JSON"),
    ('{"format": "something-else"}', "is not a cost table"),
    ('{"format": "mp_rewrite-costs", "version": 1, "precision": "bfloat16", "machine": {}, "casts": [], '
     '"ops": {"k": [1.0, -2.0]}}', "is malformed"),
    ('{"format": "mp_rewrite-costs", "version": 1, "precision": "int8", "machine": {}, "casts": [], "ops": {}}',
     "is malformed"),
])
def test_a_bad_cost_file_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "costs.json"
    path.write_text(content)
    with pytest.raises(CostTableError, match=message) as e:
        load_costs(str(path))
    assert "\n" not in str(e.value)


def test_a_table_from_another_tensorflow_is_refused(tmp_path):
    path = str(tmp_path / "costs.json")
    table(machine={"tensorflow": "1.15.0"}).save(path)
    with pytest.raises(CostTableError, match="TensorFlow 1.15.0"):
        load_costs(path)


def test_a_table_for_another_model_is_refused():
    graph = examples.inference_graph(example_models.mlp(), batch=2)
    units = table(machine={"cpu_flags": ["avx512_bf16"]})
    with pytest.raises(CostTableError, match="holds none of this model's"):
        mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches, assign="cost", costs=units)


def test_without_low_precision_units_everything_stays_float32_with_one_line():
    graph = examples.inference_graph(example_models.mlp(), batch=2)
    no_units = table(machine={"cpu_flags": ["avx2"], "cpu": "an AVX2 CPU"})
    result = mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches, assign="cost", costs=no_units)
    assert not result.retyped
    assert "has no avx512_bf16 or amx_bf16" in result.assignment.note and "\n" not in result.assignment.note


def test_the_cache_lives_under_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == os.path.join(str(tmp_path), "mp_rewrite")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "mp_rewrite")


@pytest.mark.skipif(not NATIVE_BF16, reason="measuring bfloat16 costs needs a CPU with bfloat16 units")
@pytest.mark.parametrize("build", [lambda: example_models.cnn_bn(16),
                                   lambda: example_models.transformer_encoder(seq_len=8, d_model=32)],
                         ids=["cnn", "transformer"])
def test_models_converted_by_measured_cost_run_and_match_float32(cost_cache, build):
    graph = examples.inference_graph(build(), batch=4)
    costs = measure_costs(graph.graph_def, "bfloat16", graph.fetches, batch=4)
    assert os.listdir(os.path.join(cost_cache, "mp_rewrite"))  # cached for the next run
    assert any(v is not None for v in costs.ops.values())
    result = mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches, assign="cost", costs=costs)
    a = result.assignment
    assert a.candidates and a.cost <= min(a.lists_cost, a.fp32_cost) + 1e-9
    assert set(result.retyped) <= set(mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16",
                                                                   graph.fetches).retyped)
    for name in a.candidates:
        assert result.coloring.for_node(name)[0].reason.stage == "assign_by_cost"
    (want,) = run_graph_def(graph.graph_def, graph.inputs, graph.fetches)
    (got,) = run_graph_def(result.graph_def, graph.inputs, graph.fetches)
    rtol, atol = default_tolerance("bfloat16")
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=4 * rtol, atol=4 * atol)
    again = measure_costs(graph.graph_def, "bfloat16", graph.fetches, batch=4)
    assert again.source.startswith("cache") and again.ops == costs.ops


def test_cli_costs_exports_a_table_and_a_bad_one_is_a_one_line_error(tmp_path, cost_cache, capsys):
    from mp_rewrite.commands.cli import main
    graph = examples.inference_graph(example_models.mlp(), batch=2)
    model = tmp_path / "mlp.pb"
    model.write_bytes(graph.graph_def.SerializeToString())
    if NATIVE_BF16:
        assert main(["costs", str(model), "-o", str(tmp_path / "costs.json")]) == 0
        assert "predicted for the" in capsys.readouterr().out and load_costs(str(tmp_path / "costs.json")).ops
        assert main(["explain", str(model), "--precision", "bfloat16", "--costs", str(tmp_path / "costs.json"),
                     graph.fetches[0]]) == 0
    (tmp_path / "bad.json").write_text("{not json")
    capsys.readouterr()
    assert main(["inspect", str(model), "--precision", "bfloat16", "--costs", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert "is not JSON" in err and len(err.strip().splitlines()) == 1
