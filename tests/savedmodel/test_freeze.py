"""`convert --freeze` on real Keras models: an inference SavedModel with every signature, weights folded into
low-precision constants (no weight Cast left to run), smaller on disk, within the precision's tolerance."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.errors import ModelError, OptionError  # noqa: E402
from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel.frozen_function import remove_tree  # noqa: E402
from mp_rewrite.savedmodel.loadable_copy import loadable_copy  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.verify import verify_saved_models  # noqa: E402
from mp_rewrite.testing import example_models  # noqa: E402

HEAVY_OPS = {"MatMul", "BatchMatMulV2", "Einsum", "Conv2D", "DepthwiseConv2dNative"}
LOW = {"float16": tf.float16, "bfloat16": tf.bfloat16}


def _mobilenet_style():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.Conv2D(64, 1, use_bias=False)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(256)(x))


BUILDERS = {
    "cnn_bn": lambda: example_models.cnn_bn(image_size=16),
    "mobilenet_style": _mobilenet_style,
    "transformer": lambda: example_models.transformer_encoder(),
    "lstm": lambda: example_models.lstm(),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("freeze")
    cache = {}

    def get(name):
        if name not in cache:
            path = root / name
            BUILDERS[name]().export(str(path), verbose=False)
            cache[name] = path
        return cache[name]
    return get


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _bodies(function):
    graph_def = function.graph.as_graph_def()
    return [graph_def.node] + [f.node_def for f in graph_def.library.function]


def _weight_casts(function) -> list[str]:
    """Casts that read a constant: the per-run weight casts a frozen conversion must fold away."""
    found = []
    for nodes in _bodies(function):
        consts = {n.name for n in nodes if n.op == "Const"}
        found += [n.name for n in nodes if n.op == "Cast" and n.input[0].split(":")[0] in consts]
    return found


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_frozen_model_keeps_signatures_runs_low_and_matches(exported, tmp_path, name, precision):
    source = exported(name)
    output = tmp_path / "frozen"
    result = convert_saved_model(source, output, precision, freeze=True, device="any")
    assert result.frozen and result.converted_nodes > 0
    original, frozen = tf.saved_model.load(str(source)), tf.saved_model.load(str(output))
    assert set(frozen.signatures) == set(original.signatures)
    for key, function in original.signatures.items():
        twin = frozen.signatures[key]
        assert twin.structured_input_signature == function.structured_input_signature
        assert {k: (v.dtype, v.shape) for k, v in twin.structured_outputs.items()} == \
               {k: (v.dtype, v.shape) for k, v in function.structured_outputs.items()}
        heavy = [n.attr["T"].type for nodes in _bodies(twin) for n in nodes if n.op in HEAVY_OPS]
        assert heavy and all(t == LOW[precision].as_datatype_enum for t in heavy), f"{key}: {heavy}"
        assert not _weight_casts(twin), f"{key}: weight casts left to run: {_weight_casts(twin)[:5]}"
        assert not twin.graph.variables, "a frozen model holds no variables"
    report = verify_saved_models(source, output, precision=precision)
    assert report.passed, report
    assert _size(output) < _size(source), (_size(output), _size(source))  # small models: graph overhead dominates


def test_frozen_bfloat16_weights_are_about_half_the_size(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((64,), name="features")
    model = keras.Model(inp, keras.layers.Dense(10)(keras.layers.Dense(512, activation="relu")(
        keras.layers.Dense(512, activation="relu")(inp))))
    model.export(str(tmp_path / "mlp"), verbose=False)
    convert_saved_model(tmp_path / "mlp", tmp_path / "frozen", "bfloat16", freeze=True)
    # Against the float32 weights themselves (Keras 3's export stores them twice, which would flatter the ratio).
    ratio = _size(tmp_path / "frozen") / (model.count_params() * 4)
    assert 0.45 < ratio < 0.6, ratio
    assert _size(tmp_path / "frozen") < 0.55 * _size(tmp_path / "mlp")


class Counter(tf.Module):
    def __init__(self):
        self.count = tf.Variable(0.0)
        self.w = tf.Variable(np.ones((4, 4), np.float32))

    @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32, name="x")])
    def __call__(self, x):
        self.count.assign_add(1.0)
        return {"y": tf.matmul(x, self.w)}


def test_a_signature_that_changes_state_is_refused_naming_the_op(tmp_path):
    module = Counter()
    tf.saved_model.save(module, str(tmp_path / "counter"), signatures=module.__call__)
    with pytest.raises(ModelError, match=r"cannot be frozen: node '.*' \(AssignAddVariableOp\).*without --freeze"):
        convert_saved_model(tmp_path / "counter", tmp_path / "out", "bfloat16", freeze=True)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter"]


def test_weights_low_needs_freeze_and_works_with_it(exported, tmp_path):
    source = exported("cnn_bn")
    with pytest.raises(OptionError, match="--weights low needs --freeze"):
        convert_saved_model(source, tmp_path / "out", "bfloat16", weights="low")
    assert not (tmp_path / "out").exists()
    convert_saved_model(source, tmp_path / "out", "bfloat16", weights="low", freeze=True)
    assert tf.saved_model.load(str(tmp_path / "out")).signatures


def _executed(function, feeds) -> dict:
    """{op: how many nodes of it TensorFlow executed} in one call (analysis.execution.executed_nodes: the partition
    graphs TF ran, after its own runtime optimizations; what earlier calls left in the run metadata is dropped)."""
    from mp_rewrite.analysis.execution import executed_nodes
    counts: dict = {}
    for node in executed_nodes(function, **feeds):
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


def test_no_weight_is_read_or_cast_when_the_frozen_model_runs(exported, tmp_path):
    source = exported("cnn_bn")
    convert_saved_model(source, tmp_path / "frozen", "bfloat16", freeze=True)
    convert_saved_model(source, tmp_path / "unfrozen", "bfloat16")
    feeds = {"image": tf.constant(np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype(np.float32))}
    frozen = _executed(tf.saved_model.load(str(tmp_path / "frozen")).signatures["serving_default"], feeds)
    unfrozen = _executed(tf.saved_model.load(str(tmp_path / "unfrozen")).signatures["serving_default"], feeds)
    assert unfrozen.get("ReadVariableOp", 0) > 0 and "ReadVariableOp" not in frozen
    # Left to run: the Casts of activations at the float32 boundaries (the input and the output), not of weights.
    assert frozen.get("Cast", 0) <= 2 < unfrozen.get("Cast", 0), (frozen.get("Cast"), unfrozen.get("Cast"))


class Tied(tf.Module):
    """One weight read by a MatMul (bfloat16) and by a Mul that feeds an Exp (deny list: float32), like a tied
    embedding."""

    def __init__(self):
        self.w = tf.Variable(np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.matmul(x, self.w) + tf.reduce_sum(tf.exp(self.w * x[:1, :1]))}


def test_weights_low_refuses_a_weight_also_read_in_float32(tmp_path):
    module = Tied()
    tf.saved_model.save(module, str(tmp_path / "tied"), signatures=module.__call__)
    with pytest.raises(ModelError, match=r"--weights low: weight '.*' of signature 'serving_default' is read in low "
                                         r"precision and in float32 \(by '.*', Mul\)"):
        convert_saved_model(tmp_path / "tied", tmp_path / "out", "bfloat16", freeze=True, weights="low")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tied"]
    convert_saved_model(tmp_path / "tied", tmp_path / "out", "bfloat16", freeze=True)  # stored in both
    x = tf.constant(np.eye(4, dtype=np.float32))
    want = module(x)["y"].numpy()
    got = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](x=x)["y"].numpy()
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)


class Lookup(tf.Module):
    """String input: a static table (constant initializer) and a mutable one (its contents checkpointed) map words to
    ids, an embedding and a matmul follow."""

    def __init__(self):
        self.static = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(["a", "b", "c"]), tf.constant([1, 2, 3], tf.int64)), default_value=0)
        self.mutable = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)
        self.mutable.insert(tf.constant(["b", "c"]), tf.constant([2, 1], tf.int64))
        rng = np.random.default_rng(0)
        self.embedding = tf.Variable(rng.normal(size=(4, 8)).astype(np.float32))
        self.w = tf.Variable(rng.normal(size=(8, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="words")])
    def __call__(self, words):
        ids = tf.stack([self.static.lookup(words), self.mutable.lookup(words)], axis=1)
        return {"y": tf.matmul(tf.reduce_sum(tf.gather(self.embedding, ids), axis=1), self.w)}


def test_lookup_tables_are_kept_and_looked_up_in_the_frozen_model(tmp_path):
    module = Lookup()
    tf.saved_model.save(module, str(tmp_path / "lookup"), signatures=module.__call__)
    convert_saved_model(tmp_path / "lookup", tmp_path / "out", "bfloat16", freeze=True)
    del module  # the frozen model must hold the tables itself
    frozen = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    assert not frozen.graph.variables
    words = tf.constant(["a", "b", "c", "zz", "b"])
    want = tf.saved_model.load(str(tmp_path / "lookup")).signatures["serving_default"](words=words)["y"].numpy()
    got = frozen(words=words)["y"].numpy()
    assert len({tuple(row) for row in want.round(3)}) == 4  # every table entry and the default give another row
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * np.abs(want).max())
    report = verify_saved_models(tmp_path / "lookup", tmp_path / "out",
                                 inputs={"words": np.array([b"c", b"a", b"q"])}, precision="bfloat16")
    assert report.passed, report


def _functions(directory) -> list[str]:
    from tensorflow.core.protobuf import saved_model_pb2
    model = saved_model_pb2.SavedModel.FromString((Path(directory) / "saved_model.pb").read_bytes())
    return [f.signature.name for f in model.meta_graphs[0].graph_def.library.function]


class Vocabulary(tf.Module):
    """A table read from a vocabulary file: an asset of the SavedModel."""

    def __init__(self, path):
        self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            str(path), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            default_value=-1)
        self.w = tf.Variable(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="words")])
    def __call__(self, words):
        return {"y": tf.matmul(tf.one_hot(self.table.lookup(words) + 1, 4), self.w)}


def test_the_source_is_loaded_without_its_saver_functions_and_its_assets_are_kept(tmp_path, monkeypatch):
    import tempfile
    (tmp_path / "vocab.txt").write_text("a\nb\nc\n")
    module = Vocabulary(tmp_path / "vocab.txt")
    tf.saved_model.save(module, str(tmp_path / "vocab"), signatures=module.__call__)
    (tmp_path / "vocab.txt").unlink()
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "vocab").rglob("*"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    copy = loadable_copy(tmp_path / "vocab", read_saved_model(tmp_path / "vocab"))
    saver = [name for name in _functions(tmp_path / "vocab") if "traced_save" in name or "traced_restore" in name]
    assert len(saver) == 2 and not set(saver) & set(_functions(copy)) and _functions(copy)
    assert tf.saved_model.load(copy).signatures["serving_default"](words=tf.constant(["b"]))["y"].shape == (1, 3)
    remove_tree(copy)
    convert_saved_model(tmp_path / "vocab", tmp_path / "out", "bfloat16", freeze=True)
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "vocab").rglob("*")) == before
    assert list((tmp_path / "scratch").iterdir()) == []  # the loading copy is gone, not the source it linked to
    assert (tmp_path / "out" / "assets" / "vocab.txt").read_text() == "a\nb\nc\n"
    got = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](words=tf.constant(["c", "a", "q"]))
    want = module(tf.constant(["c", "a", "q"]))["y"].numpy()
    np.testing.assert_allclose(got["y"].numpy(), want, rtol=3e-2, atol=3e-2)


def test_a_graph_frozen_for_two_signatures_counts_its_flops_once(exported, tmp_path):
    source = exported("cnn_bn")  # Keras exports "serve" and "serving_default", one function
    frozen = convert_saved_model(source, tmp_path / "frozen", "bfloat16", freeze=True)
    plain = convert_saved_model(source, tmp_path / "plain", "bfloat16")
    assert len(frozen.graphs) == 2 and frozen.flops.total > 0
    assert frozen.flops.total == plain.flops.total, (frozen.flops.total, plain.flops.total)
