"""The network explorer of the HTML report: the whole-model layer graph (whole_model.layer_picture) as data the page
lays out in the browser with dagre (vendored, MIT: vendor/NOTICE.md), so that a layer opens into its ops on a click
and an op shows its `explain` text. Nothing is fetched: dagre is inlined with the page."""

from __future__ import annotations

import html
import importlib.resources

from .explorer_assets import EXPLORER_CSS, EXPLORER_JS, EXPLORER_MARKUP
from .layer_svg import _short, box_lines, shown_classes
from .palette import CLASS_NAMES, FILL, LEGEND

DAGRE = "vendor/dagre.min.js"


def dagre_source() -> str:
    """The vendored dagre (dist/dagre.min.js of npm @dagrejs/dagre 3.1.3, MIT), as text to inline."""
    return importlib.resources.files(__package__).joinpath(DAGRE).read_text(encoding="utf-8")


def explorer_data(graph, precision: str, node_index: dict) -> dict:
    """The page's data for one LayerGraph.

    Args:
        graph: a layer_graph.LayerGraph.
        precision: "float16" or "bfloat16".
        node_index: node name -> index in the page's node table (html._node_data), for the graph drawn.

    Returns:
        {"layers": [{"key", "kind", "lines", "classes": [[class, n]], "members": [node index]}],
         "edges": [[node index, node index, "2× f32→bf16" or ""]], "graph": the graph's name}.
    """
    layers = []
    for key, layer in graph.layers.items():
        classes = shown_classes(layer) if layer.kind not in ("input", "output") else [("untouched", 1)]
        layers.append({"key": key, "kind": layer.kind, "lines": box_lines(layer, precision),
                       "classes": [[c, n] for c, n in classes],
                       "members": [node_index[m] for m in layer.members if m in node_index]})
    edges = [[node_index[a], node_index[b], ",".join(_short(c) for c in casts)]
             for a, b, casts in graph.op_edges if a in node_index and b in node_index]
    return {"layers": layers, "edges": edges, "graph": graph.source or "(main graph)"}


def _legend(graph) -> str:
    present = [c for c in CLASS_NAMES if c != "cast" and any(layer.classes.get(c) for layer in graph.layers.values())]
    chips = "".join(f'<span class="xchip" title="{html.escape(LEGEND[c])}"><span class="chip" '
                    f'style="background:{FILL[c]}"></span>{html.escape(LEGEND[c])}</span>' for c in present)
    return chips + '<span class="xchip"><span class="xcast">f32→bf16</span>Casts the rewrite inserted there</span>'


def explorer_markup(graph, title: str, notes: list) -> str:
    """The explorer's HTML (toolbar, legend, notes and the empty SVG the page script fills)."""
    return EXPLORER_MARKUP.substitute(title=html.escape(title), legend=_legend(graph),
                                      notes="".join(f"<li>{html.escape(n)}</li>" for n in notes))


def explorer_scripts() -> str:
    """The `<style>` and `<script>` blocks of the explorer: dagre, then the page script."""
    return (f"<style>{EXPLORER_CSS}</style><script>{dagre_source()}</script>"
            f"<script>{EXPLORER_JS}</script>")
