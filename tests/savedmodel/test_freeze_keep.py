"""`--freeze` with keep_fp32 patterns that name nodes of the source (what the accuracy guard writes): a node the
rules fuse keeps its fusion in float32, a node freezing folds away is said in a note, and neither is refused as a
pattern that matches nothing (`convert --freeze --guard` on keras-hub's BERT stopped there)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402


def _layer_norm_model(path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 16))
    normalized = keras.layers.LayerNormalization()(keras.layers.Dense(16)(inp))
    model = keras.Model(inp, keras.layers.Dense(16)(normalized))  # between matmuls: bfloat16 unless kept
    for weight in model.weights:
        weight.assign(np.random.default_rng(0).normal(0.5, 0.3, weight.shape).astype(np.float32))
    model.export(str(path), verbose=False)
    return path


def test_a_kept_node_the_rules_fuse_keeps_its_fusion_in_float32(tmp_path):
    source = _layer_norm_model(tmp_path / "src")
    body = [n.name for f in read_saved_model(source).meta_graphs[0].graph_def.library.function for n in f.node_def]
    squared = next(name for name in body if name.endswith("moments/SquaredDifference"))
    gamma = next(name for name in body  # gamma reshaped for broadcasting: folded by freezing
                 if name.endswith("/Reshape") and "layer_normalization" in name.rsplit("/", 2)[-2])
    dtypes = {}
    for label, keep in (("plain", []), ("kept", [squared, "=" + gamma])):
        notes = []
        result = convert_saved_model(source, tmp_path / label, "bfloat16", freeze=True, keep_fp32=keep,
                                     on_note=notes.append)
        graph = next(iter(result.graphs.values()))
        [record] = [r for r in graph.rules if r.rule == "layer_norm" and r.applied]
        dtypes[label] = {n.attr["T"].type for n in graph.graph_def.node if n.name in record.nodes}
    assert dtypes["plain"] == {tf.bfloat16.as_datatype_enum}
    assert dtypes["kept"] == {tf.float32.as_datatype_enum}  # the fused LayerNorm's output stays float32
    # the fused node's pattern was honoured; the folded one's is said, not refused
    assert len(notes) == 1 and gamma in notes[0] and "folded into constants" in notes[0], notes
    function = tf.saved_model.load(str(tmp_path / "kept")).signatures["serving_default"]
    [name] = function.structured_input_signature[1]
    assert function(**{name: tf.constant(np.ones((2, 8, 16), np.float32))}) is not None
