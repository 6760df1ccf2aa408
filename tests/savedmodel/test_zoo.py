"""Real models nobody here wrote, as a user converts them: keras-hub BERT, GPT-2 and ViT backbones (small configs,
no downloads) and a tf_keras LSTM, in both precisions, `--verify` with no input file, reloaded and run."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.analysis.compare import compare_arrays  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.verify import verify_saved_models  # noqa: E402

pytestmark = pytest.mark.slow


def _keras_hub(name: str):
    import keras_hub
    small = dict(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64,
                 max_sequence_length=32)
    if name == "bert":
        return keras_hub.models.BertBackbone(**small)
    if name == "gpt2":
        return keras_hub.models.GPT2Backbone(**small)
    return keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2,
                                        hidden_dim=32, mlp_dim=64)


def _tf_keras_lstm(path):
    import tf_keras
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((None, 4)), tf_keras.layers.LSTM(8), tf_keras.layers.Dense(3)])
    tf.saved_model.save(model, str(path))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    for name in ("bert", "gpt2", "vit"):
        _keras_hub(name).export(str(root / name), verbose=False)
    _tf_keras_lstm(root / "tf_keras_lstm")
    return root


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "tf_keras_lstm"])
def test_converts_verifies_without_inputs_reloads_and_runs(zoo, tmp_path, name, precision):
    out = tmp_path / name
    result = convert_saved_model(zoo / name, out, precision, device="any")
    assert result.converted_nodes > 0
    report = verify_saved_models(zoo / name, out, precision=precision)
    assert report.passed, [(c.signature, c.output, c.problem) for c in report.failures]
    loaded = tf.saved_model.load(str(out))
    assert set(loaded.signatures) == set(tf.saved_model.load(str(zoo / name)).signatures)


def test_bert_cli_verify_prints_the_shapes_it_used(zoo, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mp_rewrite", "convert", str(zoo / "bert"), str(tmp_path / "out"),
                           "--precision", "bfloat16", "--verify"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "verification passed" in proc.stdout
    assert "token_ids random 2x16 ids < 100" in proc.stdout and "padding_mask mask 2x16" in proc.stdout


def test_the_verdict_cannot_be_fooled():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 256)).astype(np.float32)
    zero = compare_arrays(ref * 1e-3, np.zeros_like(ref), rtol=1e-2, atol=1e-2)
    assert not zero.passed and "collapsed: all zero" in zero.problem  # within atol everywhere, still broken
    constant = compare_arrays(ref, np.full_like(ref, 0.5), rtol=1.0, atol=2.0)
    assert not constant.passed and "collapsed: constant" in constant.problem
    outlier = ref.copy()
    outlier[0, 0] += 0.1
    assert compare_arrays(ref, outlier, rtol=5e-2, atol=5e-2).passed  # one rounding outlier in 1024
    shifted = compare_arrays(ref, -ref, rtol=5e-2, atol=5e-2)
    assert not shifted.passed
    softmax = np.exp(ref) / np.exp(ref).sum(axis=1, keepdims=True)
    flat = compare_arrays(softmax, np.full_like(softmax, 1 / 256), rtol=1e-2, atol=1e-2)
    assert not flat.passed and "collapsed" in flat.problem  # a uniform softmax is within atol of any softmax
    # a random-weight EfficientNetB0's softmax, 0.1 +- 1e-4, is constant in bfloat16: rounding, not a collapse
    near = 0.1 + 1e-4 * ref[:, :10]
    assert compare_arrays(near, np.full_like(near, 0.1), rtol=5e-2, atol=5e-2).passed


@pytest.mark.parametrize("name", ["bert", "tf_keras_lstm"])
def test_frozen_converts_verifies_and_runs_without_variables(zoo, tmp_path, name):
    """--freeze on a keras-hub transformer (two signatures of one function, int inputs and a mask) and a tf_keras
    LSTM (a while loop): every signature kept, no variable left, no weight Cast, within the tolerance."""
    out = tmp_path / name
    result = convert_saved_model(zoo / name, out, "bfloat16", freeze=True)
    assert result.frozen and result.converted_nodes > 0
    report = verify_saved_models(zoo / name, out, precision="bfloat16")
    assert report.passed, [(c.signature, c.output, c.problem) for c in report.failures]
    loaded = tf.saved_model.load(str(out))
    assert set(loaded.signatures) == set(tf.saved_model.load(str(zoo / name)).signatures)
    for key, function in loaded.signatures.items():
        graph_def = function.graph.as_graph_def()
        assert not function.graph.variables, key
        bodies = [graph_def.node] + [f.node_def for f in graph_def.library.function]
        for nodes in bodies:
            consts = {n.name for n in nodes if n.op == "Const"}
            assert not [n.name for n in nodes if n.op == "Cast" and n.input[0].split(":")[0] in consts], key
