"""The HTML report in a real headless browser (Debian's chromium): the table lists the nodes, a search through the
page's URL fragment finds a node, and `#node=NAME` opens its explanation. Chromium runs the page's JavaScript and
dumps the resulting DOM (`--dump-dom`)."""

from __future__ import annotations

import html.parser
import re

import pytest

import mp_rewrite.testing.examples as ex
from headless_browser import dump_dom, needs_chromium
from mp_rewrite import rewrite_graph_def
from mp_rewrite.report import explain, to_html

pytestmark = needs_chromium


class _Dom(html.parser.HTMLParser):
    """The node table's rows (data-name, cell texts) and the explanation panel's text, from a dumped DOM."""

    def __init__(self):
        super().__init__()
        self.rows, self.panel, self.body_class = [], "", ""
        self._in_table = self._in_panel = False
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body_class = attrs.get("class") or ""
        elif tag == "table":
            self._in_table = attrs.get("id") == "node-table"
        elif tag == "tr" and self._in_table and "data-name" in attrs:
            self.rows.append([attrs["data-name"], []])
        elif tag == "td" and self._in_table and self.rows:
            self._cell = ""
        elif tag == "pre" and attrs.get("id") == "explain-text":
            self._in_panel = True

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1][1].append(self._cell)
            self._cell = None
        elif tag == "pre":
            self._in_panel = False
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._in_panel:
            self.panel += data


def _dump_dom(url: str) -> _Dom:
    dom = _Dom()
    dom.feed(dump_dom(url))
    return dom


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    graph = ex.EXAMPLES["cnn_bn/train"]()
    result = rewrite_graph_def(graph.graph_def, fetches=graph.fetches)
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(to_html(result, model="cnn_bn/train"), encoding="utf-8")
    return result, path


def test_page_is_self_contained(report):
    text = report[1].read_text(encoding="utf-8")
    # url(#arrow) points into the page itself (SVG markers and clip paths); any other url( would be fetched
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\((?!#)", text)
    assert not re.search(r"(src|href)=\"https?:", text)


def test_table_lists_every_node(report):
    result, path = report
    dom = _dump_dom(path.as_uri())
    names = [n.name for n in result.graph_def.node]
    assert len(names) < 1000  # the page shows up to 1000 rows
    assert sorted(name for name, _ in dom.rows) == sorted(names)
    conv = next(cells for name, cells in dom.rows if name == "cnn_bn_1/conv2d_1/convolution")
    assert conv[2:5] == ["Conv2D", "allow", "float16"] and conv[6] == "allow list"


def test_search_in_the_fragment_finds_the_nodes(report):
    result, path = report
    dom = _dump_dom(path.as_uri() + "#search=Conv2DBackpropFilter")
    expected = {n.name for n in result.graph_def.node if n.op == "Conv2DBackpropFilter"}
    found = {name for name, _ in dom.rows}
    assert len(expected) == 2 and expected <= found and len(found) < len(result.graph_def.node)
    # The search matches names, ops, colors and reasons ("connected to allow node .../Conv2DBackpropFilter").
    assert all("conv2dbackpropfilter" in " ".join(cells).lower() for _, cells in dom.rows)


def test_node_in_the_fragment_opens_its_explanation(report):
    result, path = report
    name = "sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits"
    dom = _dump_dom(path.as_uri() + f"#search=softmax&node={name}")
    assert "panel-open" in dom.body_class
    assert dom.panel.strip() == explain(result, name).text()
    assert "deny list" in dom.panel and all("softmax" in " ".join(cells).lower() for _, cells in dom.rows)
