"""SavedModel conversion and verification on real SavedModels (Keras exports, tf.saved_model.save, tf.Module, TF1).

Every model is small; each is built, saved and converted once per session. For each: the converted model loads,
its signatures are the original's (names, inputs, outputs, dtypes, shapes), its matmuls/convs run in low
precision in the functions TensorFlow actually loads, and verification passes at the default tolerance.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402

from mp_rewrite.errors import ListError, ModelError, OptionError  # noqa: E402
from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.analysis.compare import compare_outputs, default_tolerance  # noqa: E402
from mp_rewrite.savedmodel.verify import verify_saved_models  # noqa: E402

HEAVY_OPS = {"MatMul", "BatchMatMulV2", "Einsum", "Conv2D", "DepthwiseConv2dNative", "Conv3D"}


# --------------------------------------------------------------------------------------------- models


def _keras_cnn():
    inp = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(4)(x))


def _keras_transformer():
    tokens = keras.Input((8,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(50, 16)(tokens)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    x = keras.layers.LayerNormalization()(x + attention)
    ffn = keras.layers.Dense(16)(keras.layers.Dense(32, activation="gelu")(x))
    x = keras.layers.LayerNormalization()(x + ffn)
    return keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(x)))


def _keras_lstm():
    seq = keras.Input((6, 4), name="sequence")
    return keras.Model(seq, keras.layers.Dense(2)(keras.layers.LSTM(8)(seq)))


class TwoSignatures(tf.Module):
    """Two signatures: a float scorer, and a string lookup through a vocabulary file (an asset)."""

    def __init__(self, vocab: str):
        self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[1, 2]))
        init = tf.lookup.TextFileInitializer(vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                                             tf.lookup.TextFileIndex.LINE_NUMBER)
        self.table = tf.lookup.StaticHashTable(init, -1)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
    def score(self, features):
        return {"scores": tf.nn.softmax(tf.matmul(features, self.w, name="keep_me"))}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
    def lookup(self, words):
        return {"ids": self.table.lookup(words)}


class Loops(tf.Module):
    """A tf.while_loop around a tf.cond, both with matmuls: functional While/If bodies in the library."""

    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([8, 8], seed=[3, 4]) * 0.3)

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def __call__(self, x):
        def body(i, h):
            h = tf.cond(tf.reduce_sum(h) > 0.0, lambda: tf.tanh(tf.matmul(h, self.w)),
                        lambda: tf.sigmoid(tf.matmul(h, self.w)))
            return i + 1, h
        return {"y": tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))[1]}


class Nested(tf.Module):
    """A tf.function calling another tf.function."""

    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([8, 4], seed=[5, 6]))

    @tf.function
    def inner(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def __call__(self, x):
        return {"out": self.inner(x) * 2.0}


def _save_tf1(path: Path) -> None:
    """A TF1 SavedModel (builder API): the compute lives in the main graph, not in functions."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.random.stateless_normal([4, 3], seed=[7, 8]))
        y = tf.nn.relu(tf.matmul(x, w))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(path))
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], {"serving_default": signature})
            builder.save()


def _build(name: str, path: Path) -> dict:
    """Save model `name` at `path`; return the inputs verification needs beyond random ones."""
    keras.utils.set_random_seed(0)
    if name == "keras_cnn_export":
        _keras_cnn().export(str(path), verbose=False)
    elif name == "keras_transformer_save":
        tf.saved_model.save(_keras_transformer(), str(path))
    elif name == "keras_lstm_export":
        _keras_lstm().export(str(path), verbose=False)
    elif name == "module_two_signatures":
        vocab = path.parent / f"{name}_vocab.txt"
        vocab.write_text("the\ncat\nsat\n")
        module = TwoSignatures(str(vocab))
        tf.saved_model.save(module, str(path), signatures={"score": module.score, "lookup": module.lookup})
        return {"words": np.array([b"cat", b"dog", b"the"])}
    elif name == "module_loops":
        module = Loops()
        tf.saved_model.save(module, str(path), signatures=module.__call__)
    elif name == "module_nested":
        module = Nested()
        tf.saved_model.save(module, str(path), signatures=module.__call__)
    elif name == "tf1_builder":
        _save_tf1(path)
    return {}


MODELS = ("keras_cnn_export", "keras_transformer_save", "keras_lstm_export", "module_two_signatures",
          "module_loops", "module_nested", "tf1_builder")


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """name -> (source dir, converted dir, extra inputs), built and converted (bfloat16) on first use."""
    root = tmp_path_factory.mktemp("saved_models")
    cache = {}

    def get(name):
        if name not in cache:
            source, output = root / name, root / f"{name}_bf16"
            inputs = _build(name, source)
            convert_saved_model(source, output, "bfloat16")
            cache[name] = (source, output, inputs)
        return cache[name]
    return get


def _tree_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*")):
        digest.update(str(file.relative_to(path)).encode())
        if file.is_file():
            digest.update(file.read_bytes())
    return digest.hexdigest()


def _heavy_ops(function) -> list[tuple]:
    """(function, node, op, dtype) of every matmul/conv a loaded concrete function runs, nested bodies included."""
    graph_def = function.graph.as_graph_def()
    bodies = [("", graph_def.node)] + [(f.signature.name, f.node_def) for f in graph_def.library.function]
    return [(where, n.name, n.op, tf.dtypes.as_dtype(n.attr["T"].type).name)
            for where, nodes in bodies for n in nodes if n.op in HEAVY_OPS]


def _specs(outputs: dict) -> dict:
    """name -> (dtype, shape) of a signature's outputs (TensorSpecs, or graph tensors for TF1 models)."""
    return {k: (v.dtype, v.shape.as_list() if v.shape.rank is not None else None) for k, v in outputs.items()}


def _signature_defs(path: Path) -> dict:
    return {tuple(mg.meta_info_def.tags): dict(mg.signature_def) for mg in read_saved_model(path).meta_graphs}


# --------------------------------------------------------------------------------------------- every model


@pytest.mark.parametrize("name", MODELS)
def test_signatures_are_the_originals(models, name):
    source, output, _ = models(name)
    assert _signature_defs(output) == _signature_defs(source)
    original, converted = tf.saved_model.load(str(source)), tf.saved_model.load(str(output))
    assert sorted(converted.signatures) == sorted(original.signatures)
    for key, fn in original.signatures.items():
        assert converted.signatures[key].structured_input_signature == fn.structured_input_signature
        assert _specs(converted.signatures[key].structured_outputs) == _specs(fn.structured_outputs)


@pytest.mark.parametrize("name", MODELS)
def test_matmuls_and_convs_run_in_bfloat16(models, name):
    _, output, _ = models(name)
    loaded = tf.saved_model.load(str(output))
    heavy = [op for fn in loaded.signatures.values() for op in _heavy_ops(fn)]
    if name == "module_two_signatures":  # its "lookup" signature has no matmul; "score" has one
        assert [op[2:] for op in heavy] == [("MatMul", "bfloat16")]
        return
    assert heavy, "the model should compute with matmuls or convolutions"
    assert [op for op in heavy if op[3] != "bfloat16"] == []


@pytest.mark.parametrize("name", MODELS)
def test_verification_passes_at_default_tolerance(models, name):
    source, output, inputs = models(name)
    report = verify_saved_models(source, output, inputs=inputs)
    assert report.precision == "bfloat16" and (report.rtol, report.atol) == default_tolerance("bfloat16")
    assert report.checks and report.passed, [c for c in report.checks if not c.passed]


def test_restored_call_runs_rewritten_and_matches(models):
    source, output, _ = models("module_nested")
    original, converted = tf.saved_model.load(str(source)), tf.saved_model.load(str(output))
    (concrete,) = converted.__call__.concrete_functions
    assert {op[3] for op in _heavy_ops(concrete)} == {"bfloat16"}
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    ref, got = original(x)["out"].numpy(), converted(x)["out"].numpy()
    assert got.dtype == np.float32 and not np.array_equal(ref, got)  # bfloat16 rounding shows
    np.testing.assert_allclose(got, ref, rtol=5e-2, atol=5e-2)


def test_variables_assets_and_library_intact(models):
    source, output, _ = models("module_two_signatures")
    skip = {"saved_model.pb", "fingerprint.pb"}
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file() and p.name not in skip)
    assert Path("assets/module_two_signatures_vocab.txt") in files
    for rel in files:
        assert (output / rel).read_bytes() == (source / rel).read_bytes(), rel
    (before,), (after,) = read_saved_model(source).meta_graphs, read_saved_model(output).meta_graphs
    old = {f.signature.name: f for f in before.graph_def.library.function}
    new = {f.signature.name: f for f in after.graph_def.library.function}
    assert new.keys() == old.keys()
    assert all(new[n].signature == old[n].signature for n in old)
    save_restore = [n for n in old if "_traced_save_" in n or "_traced_restore_" in n]
    assert len(save_restore) == 2 and all(new[n] == old[n] for n in save_restore)
    assert after.object_graph_def == before.object_graph_def and after.asset_file_def == before.asset_file_def
    assert tf.saved_model.load(str(output)).signatures["lookup"](words=tf.constant(["sat"]))["ids"].numpy() == [2]


def test_conversion_result_reports_functions_and_flops(models, tmp_path):
    source, _, _ = models("keras_cnn_export")
    result = convert_saved_model(source, tmp_path / "out", "bfloat16")
    assert result.signatures == ("serve", "serving_default")
    assert result.converted_nodes > 0 and result.casts > 0
    assert result.flops.share == 1.0 and result.flops.unknown == 0
    (call,) = [n for n, r in result.functions.items() if r.converted_nodes]
    assert result.function_flops[call].low == result.flops.low > 0
    assert "100.0% of matmul/conv FLOPs now in bfloat16" in result.summary()


def test_tf1_savedmodel_computes_in_its_main_graph(models, tmp_path):
    source, _, _ = models("tf1_builder")
    result = convert_saved_model(source, tmp_path / "out", "bfloat16")
    assert result.functions == {} and result.graphs["serve"].converted_nodes == ["MatMul"]
    assert result.graph_flops["serve"].share == 1.0 == result.flops.share
    (meta_graph,) = read_saved_model(tmp_path / "out").meta_graphs
    saver = {n.name: n for n in meta_graph.graph_def.node if n.name.startswith("save/")}
    (before,) = read_saved_model(source).meta_graphs
    assert saver == {n.name: n for n in before.graph_def.node if n.name.startswith("save/")}


# --------------------------------------------------------------------------------------------- options


def test_float16_conversion_runs_and_verifies(models, tmp_path):
    source, _, _ = models("keras_cnn_export")
    result = convert_saved_model(source, tmp_path / "fp16", "float16")
    assert result.device == "gpu"  # the core's default for float16; unplaced nodes count as GPU nodes
    heavy = _heavy_ops(tf.saved_model.load(str(tmp_path / "fp16")).signatures["serving_default"])
    assert {op[3] for op in heavy} == {"float16"}
    report = verify_saved_models(source, tmp_path / "fp16")
    assert report.precision == "float16" and report.passed


def test_signature_option_converts_only_that_signatures_functions(models, tmp_path):
    source, _, _ = models("keras_cnn_export")
    result = convert_saved_model(source, tmp_path / "out", "bfloat16", signatures=["serve"])
    assert result.signatures == ("serve",)
    assert len(result.functions) == 2  # its wrapper and the traced call; not the serving_default wrapper
    with pytest.raises(ModelError, match="no signature 'predict' .*serve, serving_default"):
        convert_saved_model(source, tmp_path / "other", "bfloat16", signatures="predict")
    assert not (tmp_path / "other").exists()


def test_keep_fp32_pattern_and_list_moves(models, tmp_path):
    source, _, _ = models("module_two_signatures")

    def matmul_dtypes(out):
        fn = tf.saved_model.load(str(out)).signatures["score"]
        return {op[3] for op in _heavy_ops(fn)}
    convert_saved_model(source, tmp_path / "keep", "bfloat16", keep_fp32=["keep_me"])
    assert matmul_dtypes(tmp_path / "keep") == {"float32"}
    convert_saved_model(source, tmp_path / "deny", "bfloat16", deny=["MatMul"])
    assert matmul_dtypes(tmp_path / "deny") == {"float32"}
    with pytest.raises(OptionError, match="'MatMul' is given to both --allow and --deny"):
        convert_saved_model(source, tmp_path / "both", "bfloat16", allow="MatMul", deny="MatMul")
    bad_lists = tmp_path / "lists.toml"
    bad_lists.write_text("[allow]\nadd = 3\n")
    with pytest.raises(ListError):
        convert_saved_model(source, tmp_path / "lists", "bfloat16", lists_file=str(bad_lists))


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "float8"}, "unknown precision 'float8'"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"weights": "low"}, "--weights low needs --freeze"),
    ({"weights": "half"}, "unknown weights mode 'half'"),
])
def test_bad_options_fail_before_writing(models, tmp_path, kwargs, message):
    source, _, _ = models("module_nested")
    kwargs = {"precision": "bfloat16", **kwargs}
    with pytest.raises(OptionError, match=message):
        convert_saved_model(source, tmp_path / "out", **kwargs)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------- nothing lost


def test_bad_sources(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        convert_saved_model(tmp_path / "missing", tmp_path / "out", "bfloat16")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="is not a SavedModel: it has no saved_model.pb"):
        convert_saved_model(tmp_path / "empty", tmp_path / "out", "bfloat16")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff\xff\x0fgarbage")
    with pytest.raises(ModelError, match="not a valid SavedModel proto"):
        convert_saved_model(corrupt, tmp_path / "out", "bfloat16")
    (corrupt / "saved_model.pb").write_bytes(saved_model_pb2.SavedModel().SerializeToString())
    with pytest.raises(ModelError, match="holds no MetaGraph"):
        convert_saved_model(corrupt, tmp_path / "out", "bfloat16")
    assert not (tmp_path / "out").exists()


def test_bad_outputs_and_the_source_is_never_modified(models, tmp_path):
    source, _, _ = models("module_loops")
    before = _tree_hash(source)
    with pytest.raises(ModelError, match="is inside the source"):
        convert_saved_model(source, source / "variables" / "out", "bfloat16")
    with pytest.raises(ModelError, match="is the source directory itself"):
        convert_saved_model(source, source, "bfloat16", overwrite=True)
    with pytest.raises(ModelError, match="contains the source"):
        convert_saved_model(source, source.parent, "bfloat16", overwrite=True)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(ModelError, match="exists and is not a SavedModel; refusing to replace it"):
        convert_saved_model(source, tmp_path / "notes", "bfloat16", overwrite=True)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ModelError, match="cannot create the output directory"):
        convert_saved_model(source, tmp_path / "a_file" / "out", "bfloat16")
    convert_saved_model(source, tmp_path / "out", "bfloat16")
    verify_saved_models(source, tmp_path / "out")
    assert _tree_hash(source) == before
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


def test_existing_output_is_replaced_only_by_a_complete_conversion(models, tmp_path):
    source, _, _ = models("module_nested")
    out = tmp_path / "out"
    convert_saved_model(source, out, "float16")
    float16_model = _tree_hash(out)
    with pytest.raises(ModelError, match="already exists; pass --overwrite"):
        convert_saved_model(source, out, "bfloat16")
    with pytest.raises(ModelError, match="no signature"):
        convert_saved_model(source, out, "bfloat16", signatures="nope", overwrite=True)
    assert _tree_hash(out) == float16_model
    convert_saved_model(source, out, "bfloat16", overwrite=True)
    assert _tree_hash(out) != float16_model
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or set-aside directories left
    assert {op[3] for op in _heavy_ops(tf.saved_model.load(str(out)).signatures["serving_default"])} == {"bfloat16"}


def test_fingerprint_is_recomputed_and_text_protos_stay_text(models, tmp_path):
    source, output, _ = models("module_nested")
    old, new = (tf.saved_model.experimental.read_fingerprint(str(p)) for p in (source, output))
    assert new.saved_model_checksum != old.saved_model_checksum and new.checkpoint_hash == old.checkpoint_hash
    text_source = tmp_path / "text"
    shutil.copytree(source, text_source)
    (text_source / "saved_model.pb").unlink()
    (text_source / "saved_model.pbtxt").write_text(text_format.MessageToString(read_saved_model(source)))
    convert_saved_model(text_source, tmp_path / "out", "bfloat16")
    assert sorted(p.name for p in (tmp_path / "out").glob("saved_model.*")) == ["saved_model.pbtxt"]
    assert verify_saved_models(text_source, tmp_path / "out").passed


def test_output_permissions_look_like_a_normal_directory(models, tmp_path):
    _, output, _ = models("module_nested")
    umask = os.umask(0)
    os.umask(umask)
    assert output.stat().st_mode & 0o777 == 0o777 & ~umask


# --------------------------------------------------------------------------------------------- verification


def test_verification_fails_beyond_the_tolerance(models):
    source, output, _ = models("keras_lstm_export")
    report = verify_saved_models(source, output, rtol=0, atol=0, signatures="serving_default")
    assert not report.passed and not report.defaults
    (check,) = report.checks
    assert check.bad > 0 and check.max_abs > 0 and "outside rtol=0, atol=0" in check.problem
    assert 0.99 < check.cosine < 1.0


def test_verification_inputs_from_npz_and_batch_size(models, tmp_path):
    source, output, _ = models("module_two_signatures")
    np.savez(tmp_path / "inputs.npz", words=np.array([b"sat"]), **{"score/features": np.ones((5, 4), np.float32)})
    report = verify_saved_models(source, output, inputs=tmp_path / "inputs.npz")
    assert report.passed and report.inputs == {"score": {"features": "file"}, "lookup": {"words": "file"}}
    assert {c.output: c.shape for c in report.checks} == {"scores": (5, 3), "ids": (1,)}
    report = verify_saved_models(source, output, signatures="score", batch_size=7)
    assert report.checks[0].shape == (7, 3) and report.inputs == {"score": {"features": "random 7x4"}}


def test_verification_input_errors_say_what_to_do(models, tmp_path):
    source, output, _ = models("module_two_signatures")
    with pytest.raises(ModelError, match="need data that cannot be made up: lookup/words \\(string\\).*--inputs"):
        verify_saved_models(source, output, signatures="lookup")
    with pytest.raises(ModelError, match="name no signature input: feature"):
        verify_saved_models(source, output, signatures="score", inputs={"feature": np.ones((2, 4))})
    with pytest.raises(ModelError, match="has shape \\(2, 5\\) but signature 'score' input 'features' needs"):
        verify_saved_models(source, output, signatures="score", inputs={"features": np.ones((2, 5))})
    with pytest.raises(ModelError, match="no signature 'nope'"):
        verify_saved_models(source, output, signatures="nope")


def test_a_model_tensorflow_cannot_load_is_a_one_line_error(models, tmp_path):
    source, output, _ = models("module_nested")
    broken = tmp_path / "broken"
    shutil.copytree(output, broken)
    shutil.rmtree(broken / "variables")
    with pytest.raises(ModelError, match="^TensorFlow cannot load the converted SavedModel '.*broken': ") as error:
        verify_saved_models(source, broken)
    assert "\n" not in str(error.value)


def test_undefined_dimensions_are_filled_and_can_be_chosen(tmp_path):
    class Ragged(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.matmul(x, x, transpose_b=True)}
    tf.saved_model.save(Ragged(), str(tmp_path / "src"), signatures=Ragged().__call__)
    convert_saved_model(tmp_path / "src", tmp_path / "out", "bfloat16")
    report = verify_saved_models(tmp_path / "src", tmp_path / "out")
    assert report.passed and report.inputs == {"serving_default": {"x": "random 2x16"}}
    report = verify_saved_models(tmp_path / "src", tmp_path / "out", input_shapes="x=3x128", dim=4)
    assert report.passed and report.inputs == {"serving_default": {"x": "random 3x128"}}
    report = verify_saved_models(tmp_path / "src", tmp_path / "out", dim=4, batch_size=5)
    assert report.checks[0].shape == (5, 5)
    with pytest.raises(OptionError, match="--input-shapes gives x=3x4x5, but .* has shape"):
        verify_saved_models(tmp_path / "src", tmp_path / "out", input_shapes="x=3x4x5")
    assert verify_saved_models(tmp_path / "src", tmp_path / "out", inputs={"x": np.ones((3, 5), np.float32)}).passed


class Unsigned(tf.Module):
    """A traced tf.function without an input signature: restored by the object graph, but no signature."""

    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([8, 4], seed=[5, 6]))

    @tf.function
    def __call__(self, x):
        return tf.matmul(x, self.w)


def test_object_graph_functions_are_converted_without_signatures(tmp_path):
    module, x = Unsigned(), tf.ones([2, 8])
    module(x)
    tf.saved_model.save(module, str(tmp_path / "src"))
    convert_saved_model(tmp_path / "src", tmp_path / "out", "bfloat16")
    loaded = tf.saved_model.load(str(tmp_path / "out"))
    assert not loaded.signatures
    (concrete,) = loaded.__call__.concrete_functions
    assert [op[3] for op in _heavy_ops(concrete)] == ["bfloat16"]
    np.testing.assert_allclose(loaded(x), module(x), rtol=5e-2, atol=5e-2)
    with pytest.raises(ModelError, match="has no signatures, so there is nothing to run"):
        verify_saved_models(tmp_path / "src", tmp_path / "out")


def test_compare_outputs_rules():
    ref = {"a": np.array([1.0, 2.0, np.nan], np.float32), "ids": np.array([1, 2]), "gone": np.zeros(2)}
    got = {"a": np.array([1.01, 2.0, np.nan], np.float32), "ids": np.array([1, 3]), "new": np.zeros(2)}
    checks = {c.output: c for c in compare_outputs(ref, got, rtol=0.02, atol=0.0, signature="s")}
    assert checks["a"].passed and checks["a"].nan == (1, 1) and checks["a"].max_abs == pytest.approx(0.01, 1e-3)
    assert checks["a"].max_rel == pytest.approx(0.01, 1e-3) and checks["a"].signature == "s"
    assert not checks["ids"].passed and checks["ids"].bad == 1 and checks["ids"].cosine is None
    assert not checks["gone"].passed and "missing" in checks["gone"].problem
    assert not checks["new"].passed and "does not have" in checks["new"].problem
    (tight,) = compare_outputs({"a": ref["a"]}, {"a": got["a"]}, rtol=0.005, atol=0.0)
    assert not tight.passed and tight.bad == 1


def test_compare_outputs_catches_overflow_and_shape_changes():
    ref = {"y": np.array([1.0, 7e4], np.float32)}
    (overflow,) = compare_outputs(ref, {"y": np.array([1.0, np.inf], np.float32)}, rtol=1.0, atol=1.0)
    assert not overflow.passed and overflow.inf == (0, 1) and "NaN/Inf where the original is finite" in overflow.problem
    (shape,) = compare_outputs(ref, {"y": np.ones((1, 2), np.float32)}, rtol=1.0, atol=1.0)
    assert not shape.passed and "shape (1, 2) instead of (2,)" in shape.problem
    (dtype,) = compare_outputs(ref, {"y": ref["y"].astype(np.float64)}, rtol=1.0, atol=1.0)
    assert not dtype.passed and "dtype float64 instead of float32" in dtype.problem
