"""The SavedModel wing on exports the other tests do not use: a TF1 SavedModel with several MetaGraphs (as
`tf.compat.v1.saved_model.Builder` and Estimators write them for TF Serving), TF Serving's assets.extra, the same
options through both strategies, inputs verify cannot make, Keras .keras files, and weights too large to freeze."""

from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from mp_rewrite.commands import cli  # noqa: E402
from mp_rewrite.errors import ModelError, OptionError  # noqa: E402
from mp_rewrite.model.files import read_saved_model  # noqa: E402
from mp_rewrite.savedmodel import freeze  # noqa: E402
from mp_rewrite.savedmodel.convert import convert_saved_model  # noqa: E402
from mp_rewrite.savedmodel.verify import verify_saved_models  # noqa: E402

TAG_SETS = (["serve"], ["serve", "gpu"], ["train"])


@pytest.fixture(scope="module")
def tf1_model(tmp_path_factory):
    """A TF1 export with three MetaGraphs sharing one set of variables, and a TF Serving warm-up file."""
    path = tmp_path_factory.mktemp("tf1") / "model"
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        rng = np.random.default_rng(0)
        w1 = tf.compat.v1.get_variable("w1", initializer=rng.standard_normal((16, 32)).astype("float32") / 4)
        w2 = tf.compat.v1.get_variable("w2", initializer=rng.standard_normal((32, 4)).astype("float32") / 4)
        y = tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, w1, name="dense1")), w2, name="dense2"), name="y")
        signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(session, TAG_SETS[0], signature_def_map={"serving_default": signature})
            for tags in TAG_SETS[1:]:
                builder.add_meta_graph(tags, signature_def_map={"serving_default": signature})
            builder.save()
    (path / "assets.extra").mkdir()
    (path / "assets.extra" / "tf_serving_warmup_requests").write_bytes(b"warm-up records")
    return path


def test_the_default_conversion_rewrites_every_metagraph_and_each_loads(tf1_model, tmp_path):
    result = convert_saved_model(tf1_model, tmp_path / "out", "bfloat16")
    assert set(result.graphs) == {"serve", "serve,gpu", "train"}
    assert all(len(r.converted_nodes) >= 2 for r in result.graphs.values())  # both MatMuls, in the main graph
    for tags in TAG_SETS:
        tf.saved_model.load(str(tmp_path / "out"), tags=tags)


def test_a_tag_set_converts_that_metagraph_only(tf1_model, tmp_path):
    result = convert_saved_model(tf1_model, tmp_path / "out", "bfloat16", tag_set="serve,gpu")
    assert list(result.graphs) == ["serve,gpu"]
    before, after = read_saved_model(tf1_model).meta_graphs, read_saved_model(tmp_path / "out").meta_graphs
    assert after[0] == before[0] and after[2] == before[2] and after[1] != before[1]
    with pytest.raises(ModelError, match=r"no MetaGraph tagged 'gpu'.*serve; serve,gpu; train.*--tag-set"):
        convert_saved_model(tf1_model, tmp_path / "other", "bfloat16", tag_set="gpu")
    assert not (tmp_path / "other").exists()


def test_freeze_takes_the_serve_metagraph_and_refuses_to_guess_without_one(tf1_model, tmp_path):
    from mp_rewrite.model.tags import single_meta_graph
    result = convert_saved_model(tf1_model, tmp_path / "out", "bfloat16", freeze=True)
    assert result.frozen and read_saved_model(tmp_path / "out").meta_graphs[0].meta_info_def.tags == ["serve"]
    no_serve = read_saved_model(tf1_model)
    del no_serve.meta_graphs[0]  # serve,gpu and train: which one is meant cannot be known
    with pytest.raises(ModelError, match=r"2 MetaGraphs \(tag-sets: serve,gpu; train\) and --freeze needs one; "
                                         r"choose it with --tag-set"):
        single_meta_graph(no_serve, None, "--freeze")


def test_freeze_with_a_tag_set_keeps_the_tags_and_assets_extra_and_verifies(tf1_model, tmp_path):
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("tensorflow").addHandler(handler)
    try:
        result = convert_saved_model(tf1_model, tmp_path / "out", "bfloat16", freeze=True, tag_set="serve,gpu")
    finally:
        logging.getLogger("tensorflow").removeHandler(handler)
    assert not any("Issue encountered when serializing" in line for line in logged), logged  # TF1 collections
    assert result.frozen and result.converted_nodes >= 2
    (meta_graph,) = read_saved_model(tmp_path / "out").meta_graphs
    assert sorted(meta_graph.meta_info_def.tags) == ["gpu", "serve"]
    assert (tmp_path / "out" / "assets.extra" / "tf_serving_warmup_requests").read_bytes() == b"warm-up records"
    loaded = tf.saved_model.load(str(tmp_path / "out"), tags=["serve", "gpu"])
    assert loaded.signatures["serving_default"](x=tf.ones([2, 16]))["y"].shape == (2, 4)
    report = verify_saved_models(tf1_model, tmp_path / "out", tag_set="serve,gpu")
    assert report.passed
    assert verify_saved_models(tf1_model, tmp_path / "out").passed  # the source's serve MetaGraph, the output's one


def test_the_cli_takes_a_tag_set_everywhere(tf1_model, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["convert", str(tf1_model), str(out), "--precision", "bfloat16", "--freeze", "--verify",
                     "--tag-set", "gpu"]) == 2
    assert "--tag-set" in capsys.readouterr().err and not out.exists()  # refused before writing
    assert cli.main(["convert", str(tf1_model), str(out), "--precision", "bfloat16", "--freeze",
                     "--tag-set", "serve", "--verify"]) == 0
    assert "verification passed" in capsys.readouterr().out
    assert cli.main(["verify", str(tf1_model), str(out), "--tag-set", "serve"]) == 0
    capsys.readouterr()
    assert cli.main(["inspect", str(tf1_model), "--precision", "bfloat16", "--tag-set", "train"]) == 0
    assert "converted" in capsys.readouterr().out
    assert cli.main(["explain", str(tf1_model), "--precision", "bfloat16", "--tag-set", "serve", "dense1"]) == 0
    assert "dense1" in capsys.readouterr().out


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory):
    import keras
    path = tmp_path_factory.mktemp("dense") / "model"
    inputs = keras.Input((8, 16))
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    logits = keras.layers.Dense(4, name="head")(hidden)
    model = keras.Model(inputs, keras.layers.Activation("exponential", name="exp")(logits))  # Exp: deny list
    model.export(str(path), verbose=False)
    return path, model


@pytest.mark.parametrize("freeze_it", [False, True], ids=["in-place", "frozen"])
def test_both_strategies_honour_the_same_options(dense_model, tmp_path, freeze_it):
    source, _ = dense_model
    with pytest.raises(OptionError, match="keep-fp32 .no_such_layer. matches no node"):
        convert_saved_model(source, tmp_path / "a", "bfloat16", freeze=freeze_it, keep_fp32=["no_such_layer"])
    kept = convert_saved_model(source, tmp_path / "b", "float16", device="cpu", freeze=freeze_it, keep_fp32=["*head*"])
    plain = convert_saved_model(source, tmp_path / "c", "float16", device="cpu", freeze=freeze_it)
    forced = convert_saved_model(source, tmp_path / "d", "float16", device="cpu", freeze=freeze_it,
                                 level="UNSAFE_FORCE_ALL")
    assert kept.converted_nodes < plain.converted_nodes < forced.converted_nodes
    removed = convert_saved_model(source, tmp_path / "e", "float16", device="cpu", freeze=freeze_it,
                                  remove=["MatMul"])
    assert removed.converted_nodes < plain.converted_nodes
    assert not (tmp_path / "a").exists()


def test_verify_refuses_inputs_it_cannot_make_before_writing(tmp_path, capsys):
    class Lookup(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words"),
                                      tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, words, x):
            return {"n": tf.strings.length(words), "y": tf.matmul(x, tf.ones([4, 4]))}
    module = Lookup()
    tf.saved_model.save(module, str(tmp_path / "m"), signatures=module.__call__)
    assert cli.main(["convert", str(tmp_path / "m"), str(tmp_path / "out"), "--precision", "bfloat16",
                     "--verify"]) == 2
    error = capsys.readouterr().err
    assert "serving_default/words (string)" in error and "--inputs" in error and "nothing was written" in error
    assert not (tmp_path / "out").exists()


def test_a_keras_file_is_converted_and_inspected_as_its_export(tmp_path, capsys):
    import keras
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    model.save(str(tmp_path / "m.keras"))
    assert cli.main(["convert", str(tmp_path / "m.keras"), str(tmp_path / "out"), "--precision", "bfloat16",
                     "--freeze", "--verify"]) == 0
    captured = capsys.readouterr()
    assert "read the Keras model" in captured.err and "verification passed" in captured.out
    # Both titles name the file the user gave, not the temporary SavedModel it was exported to.
    out = " ".join(captured.out.split())  # titles wrap at the console's width
    assert f"{tmp_path / 'm.keras'} -> {tmp_path / 'out'}" in out and f"against {tmp_path / 'm.keras'}" in out
    assert "mp_rewrite-keras" not in out
    assert "serving_default" in tf.saved_model.load(str(tmp_path / "out")).signatures
    assert cli.main(["inspect", str(tmp_path / "m.keras"), "--precision", "bfloat16"]) == 0
    assert "converted" in capsys.readouterr().out


def test_weights_too_large_for_constants_stay_low_precision_variables(tmp_path, monkeypatch):
    import keras
    inputs = keras.Input((8, 64))
    hidden = keras.layers.Dense(256, activation="gelu", name="up")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(64, name="down")(hidden))
    for layer in model.layers[1:]:
        layer.bias.assign(np.random.default_rng(1).standard_normal(layer.bias.shape).astype("float32") / 10)
    model.export(str(tmp_path / "m"), verbose=False)
    monkeypatch.setattr(freeze, "GRAPH_LIMIT", 1000)  # this model's weights now "pass the limit"
    with pytest.raises(ModelError, match=r"^--freeze-weights constants cannot hold .* \(protobuf.s 2 GB limit\)"):
        convert_saved_model(tmp_path / "m", tmp_path / "c", "bfloat16", freeze=True, freeze_weights="constants")
    result = convert_saved_model(tmp_path / "m", tmp_path / "out", "bfloat16", freeze=True)
    assert any("weights kept as variables" in note for note in result.notes)
    (meta_graph,) = read_saved_model(tmp_path / "out").meta_graphs
    consts = [n for f in meta_graph.graph_def.library.function for n in f.node_def if n.op == "Const"
              and n.attr["value"].tensor.tensor_shape.dim and n.attr["value"].tensor.tensor_shape.dim[0].size >= 64]
    assert consts == []  # no weight is a graph constant
    reader = tf.train.load_checkpoint(str(tmp_path / "out" / "variables" / "variables"))
    dtypes = {name: reader.get_variable_to_dtype_map()[name] for name in reader.get_variable_to_shape_map()
              if reader.get_variable_to_shape_map()[name] in ([64, 256], [256, 64])}
    assert sorted(map(str, dtypes.values())) == ["<dtype: 'bfloat16'>"] * 2  # both kernels, stored in bfloat16
    casts = [n for f in meta_graph.graph_def.library.function for n in f.node_def if n.op == "Cast"]
    assert len(casts) <= 2  # the input and the output, not the weights
    assert verify_saved_models(tmp_path / "m", tmp_path / "out").passed
    size = lambda d: sum(f.stat().st_size for f in (d / "variables").glob("*.data-*"))  # noqa: E731
    assert size(tmp_path / "out") < 0.6 * size(tmp_path / "m")


@pytest.mark.parametrize("freeze_it", [False, True], ids=["in-place", "frozen"])
def test_force_low_over_whole_layers_writes_a_model_that_runs(dense_model, tmp_path, freeze_it):
    """A pattern that also matches a layer's Consts and variable reads ('*hidden*'): those are not retyped (a
    bfloat16 Const holding float32 data aborted the process inside TF's constant folding)."""
    source, model = dense_model
    result = convert_saved_model(source, tmp_path / "out", "bfloat16", freeze=freeze_it, force_low=["*hidden*"])
    assert result.converted_nodes > 0
    x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype("float32")
    out = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](tf.constant(x))
    np.testing.assert_allclose(next(iter(out.values())).numpy(), model(x).numpy(), rtol=0.05, atol=0.05)


def test_the_variable_form_fuses_and_prices_what_reads_the_variables(tmp_path, monkeypatch):
    """Kept variables reach their readers through an inlined function's input Identities: the rules still know the
    weights' shapes (the Dense and its GELU fuse), and the cost assignment prices the matmuls instead of seeing
    shapes unknown and a predicted time of zero (which kept every op float32)."""
    import keras
    from mp_rewrite.analysis.op_costs import this_machine
    costs = this_machine("bfloat16")
    if not costs.low_units:
        pytest.skip("no bfloat16 units here: the cost assignment keeps float32 whatever it prices")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inputs = keras.Input((8, 64))
    hidden = keras.layers.Dense(256, activation="gelu", name="up")(inputs)
    keras.Model(inputs, keras.layers.Dense(64, name="down")(hidden)).export(str(tmp_path / "m"), verbose=False)
    result = convert_saved_model(tmp_path / "m", tmp_path / "out", "bfloat16", freeze=True,
                                 freeze_weights="variables", assign="cost", costs=costs)
    fusions = {r.fusion for graph in result.graphs.values() for r in graph.rules if r.applied}
    assert "MatMul + BiasAdd + GeluExact" in fusions, fusions
    from mp_rewrite.commands.list_options import predicted
    prices = [predicted(graph) for graph in result.graphs.values()]
    assert prices and all(p["fp32_cost"] > 0.01 and p["lists_cost"] > 0.01 for p in prices), prices


def test_an_options_and_its_parts_together_are_refused_not_ignored(dense_model, tmp_path):
    import mp_rewrite
    source, _ = dense_model
    options = mp_rewrite.make_options("bfloat16")
    with pytest.raises(OptionError, match=r"either options= \(an Options\) or keep_fp32, not both"):
        convert_saved_model(source, tmp_path / "out", options=options, keep_fp32=["*head*"])
    assert not (tmp_path / "out").exists()
    graph = tf.function(lambda x: tf.matmul(x, x)).get_concrete_function(tf.TensorSpec([2, 2])).graph.as_graph_def()
    with pytest.raises(OptionError, match=r"or level, not both"):
        mp_rewrite.rewrite_graph_def(graph, options=options, level="TREAT_INFER_AS_DENY")
    assert mp_rewrite.rewrite_graph_def(graph, options=options, keep_fp32=[]).precision == "bfloat16"
