"""The whole-model picture as Graphviz DOT: the same LayerGraph, boxes and cast marks as layer_svg, for `--format
dot` and for `--engine graphviz`. Graphviz does not wrap a long chain into columns; the Python layout does, which
is why `--engine auto` draws the whole model in Python."""

from __future__ import annotations

import graphviz

from .layer_svg import _short, box_lines, shown_classes
from .palette import FILL


def _node_attrs(key: str, layer, precision: str) -> dict:
    lines = box_lines(layer, precision)
    classes = shown_classes(layer) if layer.kind not in ("input", "output") else [("untouched", 1)]
    total = sum(n for _, n in classes)
    fill = ":".join(f"{FILL[c]};{n / total:.3f}" for c, n in classes) if len(classes) > 1 else FILL[classes[0][0]]
    style = "striped" if len(classes) > 1 else ("rounded,filled" if layer.kind not in ("input", "output")
                                                else "filled")
    return {"label": "\\n".join(line.replace("\\", "\\\\") for line in lines), "shape": "box" if layer.kind not in
            ("input", "output") else "ellipse", "style": style, "fillcolor": fill, "tooltip": key,
            "class": f"mp-layer mp-{classes[0][0]}"}


def layer_dot(graph, title: str, notes: list, precision: str) -> str:
    """The DOT text of a LayerGraph (arguments as layer_svg.layer_svg)."""
    dot = graphviz.Digraph("mp_rewrite", graph_attr={"rankdir": "TB", "label": "\\l".join([title] + notes) + "\\l",
                                                     "labelloc": "t", "labeljust": "l", "fontsize": "11",
                                                     "fontname": "Helvetica", "nodesep": "0.3", "ranksep": "0.35"},
                           node_attr={"fontname": "Helvetica", "fontsize": "10"},
                           edge_attr={"arrowsize": "0.6", "color": "#555555", "fontname": "Helvetica",
                                      "fontsize": "8", "fontcolor": "#c5221f"})
    for key, layer in graph.layers.items():
        dot.node(key, **_node_attrs(key, layer, precision))
    for (a, b), data in graph.edges.items():
        attrs = {}
        if data["casts"]:
            attrs["xlabel"] = ", ".join(f"{n}× {_short(c)}" if n > 1 else _short(c) for c, n in data["casts"].items())
            attrs["style"] = "dashed"
        dot.edge(a, b, **attrs)
    return dot.source
