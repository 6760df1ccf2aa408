"""One source for every number (issue 39, item 4): the text report, the JSON report and the HTML page of one
inspection give the same counts; convert's last line says where the written copy's casts differ from the
rewrite's records, and why."""

from __future__ import annotations

import json
import re

import pytest

from mp_rewrite.commands import cli


def _inspect(model, tmp_path, fmt: str) -> str:
    out = tmp_path / f"report.{fmt}"
    assert cli.main(["inspect", str(model), "--precision", "bfloat16", "--format", fmt, "-o", str(out)]) == 0
    return out.read_text()


@pytest.fixture(scope="module")
def small_transformer(tmp_path_factory):
    """A Transformer encoder block and a classifier head, exported (only read)."""
    from mp_rewrite.testing import example_models
    path = tmp_path_factory.mktemp("transformer") / "encoder"
    example_models.transformer_encoder(seq_len=8, d_model=32, heads=2, ff=64).export(str(path),
                                                                                               verbose=False)
    return path


@pytest.mark.parametrize("model", ["small_cnn", "small_transformer"])
def test_text_json_and_html_say_the_same_counts(model, request, tmp_path, capsys):
    model = request.getfixturevalue(model)
    text, page = _inspect(model, tmp_path, "text"), _inspect(model, tmp_path, "html")
    summary = json.loads(_inspect(model, tmp_path, "json"))["summary"]
    converted, total = map(int, re.search(r"Converted (\d+)/(\d+) nodes", text).groups())
    assert converted > 0 and summary["grappler_line"] == re.search(r"Converted [^\n]*", text).group(0)
    assert summary["grappler_line"] in page
    casts = int(re.search(r"casts inserted: (\d+)", text).group(1))
    assert casts == summary["casts"] and f"casts inserted: {casts} " in page
    all_nodes = re.search(r"\((\d+) nodes in all\)", text)
    assert all_nodes is None or int(all_nodes.group(1)) == total, text.splitlines()[0]


def test_convert_says_how_the_written_casts_differ_from_the_inserted(small_cnn, tmp_path, capsys):
    assert cli.main(["convert", str(small_cnn), str(tmp_path / "out"), "--precision", "bfloat16", "--freeze"]) == 0
    out = capsys.readouterr().out
    table = [int(row.split("│")[4]) for row in out.splitlines() if row.startswith("│ signature")]
    written = re.search(r"wrote \S+: \d+ nodes? converted .*?, (\d+) casts? (inserted|in the written copy of the "
                        r"(\d+) the rewrite inserted)", out)
    assert written and table, out
    if written.group(2) == "inserted":  # the copy holds what the table says
        assert int(written.group(1)) == table[0], out
    else:
        assert int(written.group(3)) == table[0] and "folded into bfloat16 constants" in out, out
    assert "casts inserted" in out  # the table's column says what it counts


def test_the_pictures_title_counts_the_boxes_the_page_counts():
    """The title said '151 layers' where the page's search line said '153 boxes' (its inputs and outputs)."""
    from mp_rewrite import rewrite_graph_def
    from mp_rewrite.report.whole_model import layer_picture
    from mp_rewrite.testing import example_models, examples
    g = examples.inference_graph(example_models.mlp(), batch=2)
    graph, title, _ = layer_picture(rewrite_graph_def(g.graph_def, "bfloat16", g.fetches))
    layers = sum(1 for layer in graph.layers.values() if layer.kind in ("layer", "op"))
    assert len(graph.layers) > layers  # the model's input and output are boxes of the page too
    assert f"{layers} layers ({len(graph.layers)} boxes with the " in title, title
