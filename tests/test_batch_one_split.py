"""tools/batch_one_bands.py, batch_one_columns.py: one sample split across branches (a CNN's image bands with halos, a
Transformer's weight columns) computes what the whole frozen graph computes, on small models frozen as `convert
--freeze` freezes them. The token-row split is the product's: tests/savedmodel/test_row_split.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from mp_rewrite.testing import example_models  # noqa: E402


def _frozen(tmp_path, model):
    import tensorflow as tf

    from mp_rewrite.savedmodel.convert import convert_saved_model
    model.export(str(tmp_path / "fp32"), verbose=False)
    convert_saved_model(tmp_path / "fp32", tmp_path / "frozen", "bfloat16", freeze=True)
    return tf.saved_model.load(str(tmp_path / "frozen")).signatures["serving_default"]


def _outputs(signature, variant_graph=None, **split):
    from bench_batch_one import body_graph, imported

    from mp_rewrite.analysis.shapes import node_shapes
    graph_def, input_tensor, output, spec = body_graph(signature)
    rng = np.random.default_rng(0)
    value = rng.integers(0, 100, spec.shape).astype("int32") if spec.dtype.is_integer else \
        rng.normal(size=spec.shape).astype("float32")
    whole = imported(graph_def, input_tensor, output, spec)(value).numpy()
    graph, fetched, facts = variant_graph(graph_def, input_tensor, output, node_shapes(graph_def, batch=1), **split)
    got = imported(graph, input_tensor, fetched[output], spec)(value).numpy()
    return whole.astype("float32"), got.astype("float32"), facts, graph


def test_image_bands_with_halos_compute_the_whole_cnn(tmp_path):
    from batch_one_bands import layer_output, split_bands
    model = example_models.mobilenet_v2(image_size=64, classes=10)
    signature = _frozen(tmp_path, model)

    def bands(graph_def, input_tensor, output, shapes):
        cuts = [input_tensor, layer_output(graph_def, "block_5_add", "AddV2"),
                layer_output(graph_def, "block_12_add", "AddV2")]
        return split_bands(graph_def, cuts, [output], shapes, 2)
    whole, got, work, graph = _outputs(signature, bands)
    np.testing.assert_allclose(got, whole, rtol=2e-2, atol=2e-2)
    assert all(1.0 < share < 2.0 for share in work.values()), work  # a halo's extra rows, never a whole copy
    assert sum(n.op == "Pad" for n in graph.node) > 0  # zero rows only at the image edges, before VALID convolutions


def test_weight_columns_compute_the_whole_transformer_within_round_off(tmp_path):
    from batch_one_columns import split_columns
    signature = _frozen(tmp_path, example_models.token_transformer(layers=2, d_model=64, heads=4, ff=128))

    def columns(graph_def, input_tensor, output, shapes):
        return split_columns(graph_def, [output], shapes, 2)
    whole, got, exchanges, graph = _outputs(signature, columns)
    np.testing.assert_allclose(got, whole, rtol=3e-2, atol=3e-2)  # partial sums rounded to bfloat16, then added
    # Two sums of partials per layer (attention's output projection, the second Dense); heads cut 2 + 2.
    assert [kind for _, kind in exchanges] == ["partial"] * 4, exchanges
    assert sum(n.op == "Einsum" for n in graph.node) == 2 * 2 * 2
