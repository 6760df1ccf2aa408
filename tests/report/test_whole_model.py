"""The whole-model picture on real Keras models exported as SavedModels (MobileNetV2, ResNet-50, a keras-hub BERT,
a tf_keras LSTM), rewritten to bfloat16 as `mp-rewrite inspect MODEL --format svg` does.

The bound the pictures keep: no side longer than 6x the other (a long chain wraps into columns), text at its
natural size (11 px names). Every layer of the model that holds a kernel (Conv2D, DepthwiseConv2D, Dense,
EinsumDense, LSTM) is a box labelled with the layer's own name; boxes are colored by their ops' classes; the rewrite's
Casts are marks on the edges; variable handles, ReadVariableOps and constants are no boxes.
"""

from __future__ import annotations

import re

import pytest

from mp_rewrite.report.layer_graph import node_roles
from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.report.node_table import build_tables
from mp_rewrite.report.palette import FILL
from mp_rewrite.report.whole_model import layer_picture, whole_model_svg

MAX_ASPECT = 6.0
KERNEL_LAYERS = ("Conv2D", "DepthwiseConv2D", "Dense", "EinsumDense", "LSTM")
HIDDEN_OPS = ("ReadVariableOp", "VarHandleOp", "Const")


def _kernel_layer_names(model) -> set:
    """Names of the model's leaf layers that hold a kernel (nested layers included)."""
    layers = model._flatten_layers(include_self=False, recursive=True)
    return {layer.name for layer in layers if type(layer).__name__ in KERNEL_LAYERS}


def _export(model, path: str, tf_keras: bool = False) -> str:
    if tf_keras:
        import tensorflow as tf
        tf.saved_model.save(model, path)
    else:
        model.export(path, verbose=False)
    return path


def _boxes(svg: str) -> dict:
    """box title -> (data-kind, bold label, CSS class) of every layer box in the SVG."""
    found = {}
    for m in re.finditer(r'<g class="node mp-layer (mp-[a-z-]+)" data-kind="(\w+)"><title>([^<]*)</title>.*?'
                         r'font-weight="bold">([^<]*)</text>', svg):
        found[m.group(3)] = (m.group(2), m.group(4), m.group(1))
    return found


def _size(svg: str) -> tuple:
    w, h = re.search(r'<svg [^>]*width="([\d.]+)" height="([\d.]+)"', svg).groups()
    return float(w), float(h)


def check_picture(path: str, kernel_layers: set, inputs: int) -> tuple:
    """The checks every model's picture passes; returns (svg, result, LayerGraph)."""
    result = rewrite_model(load_model(path), "bfloat16")
    svg = whole_model_svg(result)
    graph, title, _ = layer_picture(result)
    width, height = _size(svg)
    assert max(width, height) <= MAX_ASPECT * min(width, height), (width, height)
    assert "___call___" in graph.source or "wrapped_model" in graph.source, graph.source
    boxes = _boxes(svg)
    assert len(boxes) == len(graph.layers) and len(boxes) > 3
    labels = {label for _, label, _ in boxes.values()}
    assert kernel_layers and kernel_layers <= labels, f"unlabelled layers: {sorted(kernel_layers - labels)}"
    table = graph.table
    roles, _ = node_roles(table)
    for key, (kind, _, _) in boxes.items():
        row = table.rows.get(key)
        assert row is None or row.op not in HIDDEN_OPS, f"a box for {row.op} {key}"
        assert row is None or row.op != "_Arg" or kind == "input", f"an _Arg box that is no input: {key}"
    assert sum(1 for kind, _, _ in boxes.values() if kind == "input") == inputs
    assert "ReadVariableOp" not in "".join(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
    assert f'fill="{FILL["allow"]}"' in svg and 'class="mp-stripe mp-allow"' in svg
    # the model's input is cast to bfloat16 on its way into the first layer: a mark on that edge
    assert svg.count('class="mp-cast-mark"') >= 1 and "f32→bf16" in svg
    return svg, result, graph


def _in_degree(graph, label: str) -> int:
    key = next(k for k, layer in graph.layers.items() if layer.label == label)
    return sum(1 for (a, b) in graph.edges if b == key and a != key)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import keras
    keras.utils.clear_session()
    root = tmp_path_factory.mktemp("whole")
    return lambda name: str(root / name)


@pytest.mark.slow
def test_mobilenet_v2_depthwise_blocks_and_residual_adds(saved):
    import keras
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
    svg, result, graph = check_picture(_export(model, saved("mobilenet")), _kernel_layer_names(model), inputs=1)
    depthwise = next(layer for layer in graph.layers.values() if layer.label == "block_1_depthwise")
    assert set(depthwise.ops) == {"DepthwiseConv2dNative"} and depthwise.classes == {"allow": 1}
    assert _in_degree(graph, "block_2_add") == 2  # the inverted residual: project BN + the block's input
    # wrapped: a chain of 150 layers is several columns, not a strip
    width, height = _size(svg)
    assert width > 1000 and height < 4000


@pytest.mark.slow
def test_resnet50_residual_blocks(saved):
    import keras
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    _, _, graph = check_picture(_export(model, saved("resnet")), _kernel_layer_names(model), inputs=1)
    assert _in_degree(graph, "conv2_block1_add") == 2 and _in_degree(graph, "conv2_block2_add") == 2
    assert sum(1 for layer in graph.layers.values() if layer.label.endswith("_add")) == 16


def test_bert_attention_is_opened_into_query_key_value(saved):
    import keras_hub
    model = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32,
                                          intermediate_dim=64)
    svg, result, graph = check_picture(_export(model, saved("bert")), _kernel_layer_names(model), inputs=3)
    labels = [layer.label for layer in graph.layers.values()]
    assert all(labels.count(name) == 2 for name in ("query", "key", "value", "attention_output"))
    assert any(label.startswith("softmax") for label in labels)
    # mixed boxes are striped: the feed-forward layer keeps its GELU's erf in float32 (deny) next to bf16 matmuls
    assert 'class="mp-stripe mp-deny"' in svg and 'class="mp-stripe mp-infer-kept"' in svg
    assert "bf16→f32" in svg  # casts back to float32 marked on the edges


def test_tf_keras_lstm_counts_its_loop_body(saved):
    import tf_keras
    model = tf_keras.Sequential([tf_keras.layers.Input((6, 8)), tf_keras.layers.LSTM(16),
                                 tf_keras.layers.Dense(10)])
    _, _, graph = check_picture(_export(model, saved("lstm"), tf_keras=True), {"lstm", "dense"}, inputs=1)
    lstm = next(layer for layer in graph.layers.values() if layer.label == "lstm")
    # drawn through its call node: the While body's MatMuls count in the LSTM's box, in bfloat16
    assert lstm.ops["MatMul"] >= 2 and lstm.classes["allow"] >= 2


def test_a_budget_too_small_for_the_next_level_says_so(saved):
    import keras_hub
    model = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32,
                                          intermediate_dim=64)
    path = _export(model, saved("bert_small"))
    result = rewrite_model(load_model(path), "bfloat16")
    graph, _, notes = layer_picture(result, max_nodes=20)
    assert len(graph.layers) <= 20 + 5 and any("one level more would draw" in n for n in notes)
    labels = {layer.label for layer in graph.layers.values()}
    assert {"transformer_layer_0", "transformer_layer_1"} <= labels


def test_function_option_draws_that_graph(saved):
    import keras
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(keras.layers.Dense(16, name="body")(inputs)))
    result = rewrite_model(load_model(_export(model, saved("mlp"))), "bfloat16")
    tables = build_tables(result, with_flops=False)
    main, _, _ = layer_picture(result, "")
    assert main.source == "" and not any(layer.label == "body" for layer in main.layers.values())
    network, _, _ = layer_picture(result, tables=tables)
    assert {"body", "head"} <= {layer.label for layer in network.layers.values()}


def test_dot_of_the_whole_model_is_the_same_layer_graph(saved):
    import shutil
    import keras
    from mp_rewrite.report import dot
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, name="body")(inputs)
    model = keras.Model(inputs, keras.layers.Softmax(name="probs")(keras.layers.Dense(4, name="head")(hidden)))
    result = rewrite_model(load_model(_export(model, saved("mlp_dot"))), "bfloat16")
    source = dot.to_dot(result)
    graph, _, _ = layer_picture(result)
    from mp_rewrite.report.layer_svg import box_lines
    for key, layer in graph.layers.items():
        first = box_lines(layer, "bfloat16")[0]
        assert f'"{key}" [label="{first}' in source or f'{key} [label="{first}' in source, key
    assert "ReadVariableOp" not in source and "f32→bf16" in source
    if shutil.which("dot"):  # Graphviz only changes who lays the same boxes out
        svg = dot.to_svg(result, engine="graphviz")
        assert "body" in svg and "head" in svg


def test_two_lone_ops_of_one_layer_keep_their_names_apart():
    from mp_rewrite.report.layer_scopes import distinct_labels
    layer = "model/bert_backbone_1/transformer_layer_{}_1/self_attention_layer_1/"
    keys = [layer.format(i) + op for i in (0, 1) for op in ("", "transpose", "transpose_1")]
    labels = distinct_labels(keys)
    # "transpose_1" is another op than "transpose", not a trace suffix: the slowest-layer list told them apart by
    # nothing but the whole path, and then not at all
    assert labels[layer.format(0) + "transpose"] == "transformer_layer_0/self_attention_layer/transpose"
    assert labels[layer.format(0) + "transpose_1"] == "transformer_layer_0/self_attention_layer/transpose_1"
    assert labels[layer.format(0)] == "transformer_layer_0/self_attention_layer"
    assert len(set(labels.values())) == len(keys)
