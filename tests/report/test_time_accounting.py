"""The time view accounts for the whole run: on real models (MobileNetV2, ResNet-50, a keras-hub BERT) profiled in
the model on this machine, every computing box has a time (or says TF fused or folded its ops), and the layers hold
nearly all of the total (the Casts on edges, the nodes no box holds and what ran outside the layers are the rest).

How close that total comes to the measured untraced whole run is printed (`pytest -s`), not asserted: it is a
timing ratio, and on a shared machine other processes move it (ResNet-50 at -8.7% in one loaded run, -14.8% in
another; MobileNetV2 at -14%, the executor's own time between its 1262 tiny kernels being in no node's time). The
measured gaps are in docs/pictures.md. Skipped without bfloat16 units (nothing is measured there)."""

from __future__ import annotations

import os

import pytest

from mp_rewrite.analysis.op_costs import this_machine
from mp_rewrite.core.options import make_options
from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.report.node_table import build_tables
from mp_rewrite.report.whole_model import layer_picture, picture_times
from mp_rewrite.savedmodel.measured_costs import in_place_costs

def _has_bf16_units() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag in f.read() for flag in ("avx512_bf16", "amx_bf16"))
    except OSError:
        return False


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _has_bf16_units(), reason="no bfloat16 units: nothing is measured")]


def _export(which: str, path: str) -> str:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    keras.utils.clear_session()
    if which == "mobilenet_v2":
        keras.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None).export(path, verbose=False)
    elif which == "resnet50":
        keras.applications.ResNet50(input_shape=(64, 64, 3), weights=None).export(path, verbose=False)
    else:
        import keras_hub
        keras_hub.models.BertBackbone(vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=128,
                                      intermediate_dim=512, max_sequence_length=64).export(path, verbose=False)
    return path


def time_view_of(path: str):
    """(TimeView, LayerGraph) of the SavedModel at `path`, profiled in the model at batch 1 (bfloat16)."""
    costs = this_machine("bfloat16")
    model = load_model(path)
    options = in_place_costs(make_options("bfloat16", assign="cost", costs=costs), model.path, model.meta_graph)
    result = rewrite_model(model, options=options)
    tables = build_tables(result, with_flops=False)
    graph, _, _ = layer_picture(result, None, 150, tables)
    return picture_times(graph, tables, options.costs, result), graph


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.mark.parametrize("which", ["mobilenet_v2", "resnet50", "bert"])
def test_every_layer_is_timed_and_the_layers_hold_the_time(which, tmp_path):
    view, graph = time_view_of(_export(which, str(tmp_path / which)))
    assert view is not None and view.complete, view and view.source
    measured = view.measured
    layers_fp32 = sum(t.fp32 for t in view.layers.values())
    gap = view.total_fp32 / measured["float32"] - 1
    print(f"{which}: float32 layers {layers_fp32:.2f} + undrawn {view.undrawn[0]:.2f} + elsewhere "
          f"{view.elsewhere[0]:.2f} = {view.total_fp32:.2f} ms against {measured['float32']:.2f} ms measured "
          f"({100 * gap:+.1f}%); as converted {view.total:.2f} against {measured['converted']:.2f} ms")
    assert layers_fp32 >= 0.8 * view.total_fp32  # the boxes hold the time, not the lines beside them
    # Every box that computes something has a time, or says TF fused or folded its ops.
    untimed = [k for k, t in view.layers.items() if not t.timed and graph.layers[k].kind in ("layer", "op")]
    assert len(untimed) <= 0.1 * len(view.layers), untimed
