"""The HTML page's time view in a real headless browser (Debian's chromium): the toggle switches the boxes' fills
from precision to time, a slowest-layer link centres its box in the explorer, and the layers' times sum to the
total the page states."""

from __future__ import annotations

import html
import json
import re

import pytest
from headless_browser import dump_dom, needs_chromium
from timed_model import made_up_table, rewritten, small_cnn

from mp_rewrite.report import to_html
from mp_rewrite.report.layer_times import ms_text

pytestmark = needs_chromium
WINDOW = (1400, 1000)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("time_page")
    result = rewritten(small_cnn(str(root / "cnn")))
    path = root / "report.html"
    path.write_text(to_html(result, model="cnn", costs=made_up_table(result)), encoding="utf-8")
    return path


def _dump(url: str) -> str:
    return dump_dom(url, f"--window-size={WINDOW[0]},{WINDOW[1]}")


def _explorer(dom: str) -> dict:
    raw = re.search(r'<script id="mp-data" type="application/json">(.*?)</script>', dom, re.S).group(1)
    return json.loads(html.unescape(raw) if raw.lstrip().startswith("{&") else raw)["explorer"]


def _layer_fills(dom: str) -> dict:
    """layer index -> the fill of the first rect drawn in its box."""
    return {int(i): fill for i, fill in re.findall(
        r'<g class="xnode[^"]*" data-key="[^"]*" data-layer="(\d+)"><title>[^<]*</title><rect [^>]*fill="([^"]+)"',
        dom)}


def test_the_toggle_switches_the_fills_from_precision_to_time(page):
    before = _dump(page.as_uri())
    X = _explorer(before)
    timed = {i for i, layer in enumerate(X["layers"]) if "heat" in layer}
    assert len(timed) >= 6 and "mp-heat" not in before
    fills = _layer_fills(before)
    assert {fills[i] for i in timed} <= set(json.loads(re.search(r'"fills":(\{[^}]*\})', before).group(1)).values())
    after = _dump(page.as_uri() + "#show=time")
    assert re.search(r'<body[^>]*class="[^"]*time-view', after)
    assert re.search(r'<button data-x="mode" id="xmode"[^>]*>color by precision</button>', after)
    fills = _layer_fills(after)
    assert {i: fills[i] for i in timed} == {i: X["layers"][i]["heat"] for i in timed}
    assert len({fills[i] for i in timed}) >= 3  # a scale, not one color


def test_a_slowest_layer_link_centres_its_box(page):
    dom = _dump(page.as_uri() + "#top=1")
    X = _explorer(dom)
    first = re.search(r'<table id="xslowest">.*?data-goto="([^"]+)"', dom, re.S).group(1)
    assert re.search(r'<g id="xview"[^>]*data-goto="' + re.escape(first) + '"', dom)
    i = next(k for k, layer in enumerate(X["layers"]) if layer["key"] == html.unescape(first))
    box = re.search(r'<g class="xnode[^"]*xgoto[^"]*" data-key="[^"]*" data-layer="' + str(i) + r'">.*?'
                    r'<rect x="([-\d.]+)" y="([-\d.]+)" width="([\d.]+)" height="([\d.]+)"[^>]*class="xoutline"',
                    dom, re.S)
    assert box, "the link's box is not marked"
    view = re.search(r'<g id="xview"[^>]*>', dom).group(0)
    tx, ty, k = map(float, re.search(r'transform="translate\(([-\d.e]+),([-\d.e]+)\) scale\(([\d.e]+)\)"',
                                     view).groups())
    x, y, w, h = map(float, box.groups())
    cx, cy = tx + (x + w / 2) * k, ty + (y + h / 2) * k
    assert 0.3 * WINDOW[0] < cx < 0.7 * WINDOW[0] and 0.2 * WINDOW[1] < cy < 0.6 * WINDOW[1]
    assert int(re.search(r'data-scroll-y="(\d+)"', dom).group(1)) > 0  # the page scrolled down to the explorer


def test_the_layers_times_sum_to_the_stated_total(page):
    dom = _dump(page.as_uri())
    X = _explorer(dom)
    totals = X["totals"]
    layers = sum(layer["time"][1] for layer in X["layers"] if "time" in layer)
    assert layers + totals["edgeCasts"] + totals["undrawn"][1] == pytest.approx(totals["total"])
    assert float(re.search(r'<div id="xtimes" data-total="([\d.]+)"', dom).group(1)) == pytest.approx(
        totals["total"], abs=1e-6)
    stated = re.search(r'<p id="xtotal">([^<]*)</p>', dom).group(1)
    assert f"float32 {ms_text(totals['fp32'])} ms → as converted {ms_text(totals['total'])} ms" in stated
    shares = [float(s) for s in re.findall(r'<td class="num">([\d.]+)%</td>', dom)]
    assert len(shares) >= 5 and shares == sorted(shares, reverse=True) and sum(shares) <= 100.5
