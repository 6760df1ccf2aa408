"""The HTML report's network explorer in a real headless browser (Debian's chromium): the page lays a keras-hub
BERT out with the vendored dagre, `#find=` finds a node (opening its layer and showing its explanation), `#click=`
clicks a layer's box (a real click event on the drawn SVG) and the layer opens into its ops."""

from __future__ import annotations

import re

import pytest

from mp_rewrite.report import to_html
from mp_rewrite.report.explanation import Explainer
from headless_browser import dump_dom, needs_chromium
from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.report.node_table import build_tables

pytestmark = needs_chromium
ATTENTION = "bert_backbone_1/transformer_layer_0_1/self_attention_layer_1/"
DENSE = "bert_backbone_1/transformer_layer_1_1/feedforward_intermediate_dense_1/"


def _dump(url: str) -> str:
    return dump_dom(url, "--window-size=1400,1000")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    import keras
    import keras_hub
    keras.utils.clear_session()  # layer names count up per session: the scopes below are those of a fresh one
    root = tmp_path_factory.mktemp("explorer")
    model = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32,
                                          intermediate_dim=64)
    model.export(str(root / "bert"), verbose=False)
    result = rewrite_model(load_model(str(root / "bert")), "bfloat16")
    path = root / "report.html"
    path.write_text(to_html(result, model="bert"), encoding="utf-8")
    return result, path


def _open_layers(dom: str) -> list:
    found = re.search(r'<g id="xview"[^>]*data-open="([^"]*)"', dom)
    assert found, "the explorer drew nothing"
    return [k for k in found.group(1).split("|") if k]


def test_page_draws_every_layer_with_casts_and_no_network(page):
    result, path = page
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\((?!#)|sourceMappingURL", text)
    dom = _dump(path.as_uri())
    assert 'data-explorer="ready"' in dom and _open_layers(dom) == []
    boxes = re.findall(r'<g class="xnode[^"]*" data-key="([^"]*)" data-layer="\d+"', dom)
    assert len(boxes) > 30 and ATTENTION + "query_1/" in boxes
    assert len(re.findall(r'class="xcast-mark"', dom)) >= 3


def test_find_opens_the_layer_and_explains_the_node(page):
    result, path = page
    name = ATTENTION + "query_1/einsum/Einsum"
    dom = _dump(path.as_uri() + "#find=" + name)
    assert _open_layers(dom) == [ATTENTION + "query_1/"]
    selected = re.findall(r'<g class="xnode xmatch xsel" data-key="([^"]*)" data-op', dom)
    assert selected == [name]
    function = next(t for t in build_tables(result, with_flops=False) if name in t.rows)
    expected = Explainer([function], result.precision).explain_row(function.rows[name]).text()
    panel = re.search(r'<pre id="explain-text">(.*?)</pre>', dom, re.S).group(1)
    assert "panel-open" in dom and panel.strip() == expected.replace("&", "&amp;").replace("<", "&lt;")
    assert "bfloat16" in panel and "Einsum" in panel


def test_clicking_a_layer_opens_it_into_its_ops(page):
    result, path = page
    dom = _dump(path.as_uri() + "#click=" + DENSE)
    assert _open_layers(dom) == [DENSE]
    ops = re.findall(r'<g class="xnode[^"]*" data-key="([^"]*)" data-op="\d+"', dom)
    assert DENSE + "Tensordot/MatMul" in ops and all(op.startswith(DENSE) for op in ops)
    assert re.search(r'<g class="xframe" data-layer="\d+" data-key="' + re.escape(DENSE), dom)
