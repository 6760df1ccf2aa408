"""Pictures without Graphviz: a layered (Sugiyama) layout in pure Python (grandalf) written straight to SVG.

The SVG has the structure the HTML page scripts expect from Graphviz's: one `<g class="node mp-CLASS">` per box,
whose `<title>` is the node (or scope) name, shapes as polygons/ellipses, edges as `<g class="edge">` paths. It
needs nothing but `pip install mp_rewrite`; `dot.picture_svg` uses Graphviz instead only where it is installed.
"""

from __future__ import annotations

import html

from grandalf.graphs import Edge, Graph, Vertex
from grandalf.layouts import SugiyamaLayout

from .palette import CLASS_NAMES, FILL, dtype_label

CHAR_WIDTH, LINE_HEIGHT, PAD = 6.2, 13.0, 8.0
COMPONENT_GAP, MARGIN, LEGEND_HEIGHT, ROW_WIDTH = 30.0, 16.0, 34.0, 1400.0


class _Box:
    """What grandalf needs of a vertex's view: its size, and where the layout put it."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.w = max(len(line) for line in lines) * CHAR_WIDTH + 2 * PAD
        self.h = len(lines) * LINE_HEIGHT + PAD
        self.xy = (0.0, 0.0)


def _lines(name: str, data: dict) -> tuple[list[str], str, str]:
    """(label lines, node class, tooltip) of a picture node."""
    from .dot import short_name
    from .wording import reason_text
    if data["kind"] == "scope":
        total = sum(data["classes"].values())
        parts = " · ".join(f"{c} {data['classes'][c]}" for c in CLASS_NAMES if data["classes"].get(c))
        return [f"{name} ({total} nodes)", parts], "scope", f"{name}: {total} nodes; {parts}"
    row = data["row"]
    if row.cast is not None:
        return [f"Cast {dtype_label(row.cast.from_dtype)}→{dtype_label(row.cast.to_dtype)}"], "cast", \
            f"{row.name}: inserted Cast"
    decision = row.decision
    dtype = f" {dtype_label(decision.dtype_after)}" if decision is not None else ""
    tip = f"{row.name}: {reason_text(decision.reason)}" if decision is not None else row.name
    return [short_name(row.name), f"{row.op}{dtype}"], row.node_class, tip[:300]


def _layout(picture) -> tuple[dict, float, float]:
    """{name: _Box placed}, width, height: each connected component laid out in layers, side by side."""
    boxes, vertices = {}, {}
    for name, data in picture.graph.nodes(data=True):
        lines, node_class, tip = _lines(name, data)
        box = _Box(lines)
        box.node_class, box.tip = node_class, tip
        vertices[name] = Vertex(name)
        vertices[name].view = box
        boxes[name] = box
    edges = [Edge(vertices[a], vertices[b]) for a, b in picture.graph.edges() if a != b]
    graph = Graph(list(vertices.values()), edges)
    placed = []  # (members, width, height), biggest component first
    for component in sorted(graph.C, key=lambda c: -len(c.sV)):
        layout = SugiyamaLayout(component)
        layout.init_all()
        layout.draw()
        members = [v.view for v in component.sV]
        left = min(b.xy[0] - b.w / 2 for b in members)
        top = min(b.xy[1] - b.h / 2 for b in members)
        for b in members:
            b.xy = (b.xy[0] - left, b.xy[1] - top)
        placed.append((members, max(b.xy[0] + b.w / 2 for b in members), max(b.xy[1] + b.h / 2 for b in members)))
    return boxes, *_pack(placed)


def _pack(placed) -> tuple[float, float]:
    """Place the components in rows no wider than the widest component (or ROW_WIDTH); return the size."""
    row_width = max([ROW_WIDTH] + [w for _, w, _ in placed])
    x, y, row_height, width = MARGIN, MARGIN + LEGEND_HEIGHT, 0.0, 300.0
    for members, w, h in placed:
        if x > MARGIN and x + w > row_width:
            x, y, row_height = MARGIN, y + row_height + COMPONENT_GAP, 0.0
        for b in members:
            b.xy = (b.xy[0] + x, b.xy[1] + y)
        x += w + COMPONENT_GAP
        row_height, width = max(row_height, h), max(width, x)
    return width, y + row_height + MARGIN


def _shape(box) -> str:
    x, y, w, h = box.xy[0], box.xy[1], box.w, box.h
    fill = FILL.get(box.node_class, "#ffffff")
    if box.node_class == "cast":
        return (f'<ellipse cx="{x:.1f}" cy="{y:.1f}" rx="{w / 2:.1f}" ry="{h / 2:.1f}" fill="{fill}" '
                'stroke="#333" stroke-dasharray="4,2"/>')
    points = " ".join(f"{px:.1f},{py:.1f}" for px, py in ((x - w / 2, y - h / 2), (x + w / 2, y - h / 2),
                                                          (x + w / 2, y + h / 2), (x - w / 2, y + h / 2)))
    width = 2 if box.node_class == "scope" else 1
    return f'<polygon points="{points}" fill="{fill}" stroke="#333" stroke-width="{width}"/>'


def _node(name: str, box, center: bool) -> str:
    text_top = box.xy[1] - box.h / 2 + PAD / 2 + LINE_HEIGHT - 3
    texts = "".join(f'<text x="{box.xy[0]:.1f}" y="{text_top + i * LINE_HEIGHT:.1f}" text-anchor="middle" '
                    f'font-family="Helvetica,Arial,sans-serif" font-size="10">{html.escape(line)}</text>'
                    for i, line in enumerate(box.lines))
    shape = _shape(box).replace('stroke-width="1"', 'stroke-width="3"') if center else _shape(box)
    return (f'<g class="node mp-{box.node_class}"><title>{html.escape(name)}</title>'
            f'<desc>{html.escape(box.tip)}</desc>{shape}{texts}</g>')


def _edge(a, b, data: dict) -> str:
    x1, y1 = a.xy[0], a.xy[1] + a.h / 2
    x2, y2 = b.xy[0], b.xy[1] - b.h / 2
    if y2 < y1:  # an edge the layout reversed (a cycle): leave from the top, arrive at the bottom
        y1, y2 = a.xy[1] - a.h / 2, b.xy[1] + b.h / 2
    style = ' stroke-dasharray="4,3" stroke="#aaa"' if data.get("control") else ' stroke="#555"'
    return (f'<g class="edge"><path d="M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}" fill="none"{style} '
            'marker-end="url(#arrow)"/></g>')


def _legend(classes) -> str:
    parts, x = [], MARGIN
    for c in classes:
        w = len(c) * CHAR_WIDTH + 2 * PAD
        parts.append(f'<g class="mp-legend"><rect x="{x:.1f}" y="{MARGIN / 2 + 12:.1f}" width="{w:.1f}" '
                     f'height="16" fill="{FILL[c]}" stroke="#333"/><text x="{x + w / 2:.1f}" '
                     f'y="{MARGIN / 2 + 24:.1f}" text-anchor="middle" font-family="Helvetica,Arial,sans-serif" '
                     f'font-size="9">{html.escape(c)}</text></g>')
        x += w + 6
    return "".join(parts)


def picture_to_svg(picture) -> str:
    """The SVG of a Picture (mp_rewrite.report.subgraph), laid out in Python."""
    boxes, width, height = _layout(picture)
    classes = [c for c in CLASS_NAMES if any(b.node_class == c for b in boxes.values())]
    edges = "".join(_edge(boxes[a], boxes[b], data) for a, b, data in picture.graph.edges(data=True) if a != b)
    nodes = "".join(_node(name, box, name == picture.center) for name, box in boxes.items())
    title = html.escape(picture.title)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}pt" height="{height:.0f}pt" '
            f'viewBox="0 0 {width:.0f} {height:.0f}"><title>{title}</title>'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="{MARGIN}" y="{MARGIN}" font-family="Helvetica,Arial,sans-serif" font-size="12">{title}</text>'
            f'{_legend(classes)}<g class="graph">{edges}{nodes}</g></svg>')
