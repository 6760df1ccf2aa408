"""Where the boxes of a layer picture go: a layered (Sugiyama) layout by grandalf, top to bottom along the data,
then cut into side-by-side columns when it is much taller than wide.

The bound: a column is at most COLUMN_ASPECT times as tall as the picture is wide (about a screen's shape), so no
side of the picture is more than about 3x the other for a chain; columns break between the ranks crossed by the
fewest edges (between residual blocks rather than inside one). Edges that leave a column run down past its bottom,
through the gutter and into the next column from the top.
"""

from __future__ import annotations

import dataclasses
import math

from grandalf.graphs import Edge, Graph, Vertex
from grandalf.layouts import SugiyamaLayout

COLUMN_ASPECT = 1.3  # a column's height over the picture's width that wrapping aims for
COLUMN_GAP, COMPONENT_GAP, RANK_GAP, BOX_GAP = 70.0, 40.0, 34.0, 26.0
BREAK_WINDOW = 0.15  # a column may end this share of a column earlier or later to cut fewer edges


@dataclasses.dataclass
class Placed:
    """The layout: box key -> (x, y) centre; edge (a, b) -> points; width and height of the drawing."""

    centers: dict
    paths: dict
    width: float
    height: float
    columns: int = 1


class _View:
    def __init__(self, w: float, h: float):
        self.w, self.h, self.xy = w, h, (0.0, 0.0)


class _EdgeView:
    def __init__(self):
        self.points = []

    def setpath(self, points):
        self.points = list(points)


def _sugiyama(component):
    layout = SugiyamaLayout(component)
    layout.xspace, layout.yspace = BOX_GAP, RANK_GAP
    layout.init_all(optimize=True)  # sources (an input feeding a later layer) just above what reads them
    layout.draw(N=2.5)
    return layout


def _rank_bands(layout) -> list:
    """Per rank: (top, bottom) of its boxes."""
    bands = []
    for rank in layout.layers:
        tops = [v.view.xy[1] - v.view.h / 2 for v in rank]
        bottoms = [v.view.xy[1] + v.view.h / 2 for v in rank]
        bands.append((min(tops), max(bottoms)))
    return bands


def _crossings(layout, ranks: int) -> list:
    """Per boundary b (between rank b and b + 1): how many edges cross it."""
    cross = [0] * max(ranks - 1, 0)
    for e in layout.g.sE:
        a, b = sorted((layout.grx[e.v[0]].rank, layout.grx[e.v[1]].rank))
        for boundary in range(a, b):
            cross[boundary] += 1
    return cross


def column_breaks(bands: list, cross: list, width: float) -> list:
    """The first rank of every column (0 first), so that columns are about COLUMN_ASPECT x width tall."""
    height = bands[-1][1] - bands[0][0]
    k = max(1, round(math.sqrt(height / (COLUMN_ASPECT * max(width, 1.0)))))
    if k == 1:
        return [0]
    step, starts = height / k, [0]
    for c in range(1, k):
        target = bands[0][0] + c * step
        window = [b for b in range(starts[-1] + 1, len(bands))
                  if abs(bands[b][0] - target) <= BREAK_WINDOW * step]
        if not window:
            window = [min(range(starts[-1] + 1, len(bands)), key=lambda b: abs(bands[b][0] - target),
                          default=None)]
        if window[0] is None:
            break
        starts.append(min(window, key=lambda b: (cross[b - 1], abs(bands[b][0] - target))))
    return starts


def _wrap(layout, vertices: list, edge_views: dict) -> tuple:
    """Cut one laid-out component into columns; returns (centers, paths, width, height, columns)."""
    bands = _rank_bands(layout)
    every = [v for rank in layout.layers for v in rank]
    width = max(v.view.xy[0] + v.view.w / 2 for v in every) - min(v.view.xy[0] - v.view.w / 2 for v in every)
    starts = column_breaks(bands, _crossings(layout, len(bands)), width)
    column_of = {}
    for c, start in enumerate(starts):
        end = starts[c + 1] if c + 1 < len(starts) else len(bands)
        column_of.update({r: c for r in range(start, end)})
    shifts, x, height = [], 0.0, 0.0
    for c, start in enumerate(starts):
        members = [v for v in every if column_of[layout.grx[v].rank] == c]
        left = min(v.view.xy[0] - v.view.w / 2 for v in members)
        right = max(v.view.xy[0] + v.view.w / 2 for v in members)
        shifts.append((x - left, -bands[start][0]))
        height = max(height, max(v.view.xy[1] + v.view.h / 2 for v in members) - bands[start][0])
        x += right - left + COLUMN_GAP
    width = x - COLUMN_GAP

    def moved(point, rank):
        dx, dy = shifts[column_of[rank]]
        return point[0] + dx, point[1] + dy
    centers = {v.data: moved(v.view.xy, layout.grx[v].rank) for v in vertices}
    paths = {}
    for key, (edge, view) in edge_views.items():
        r0, r1 = layout.grx[edge.v[0]].rank, layout.grx[edge.v[1]].rank
        ranks = range(r0, r1 + 1) if r0 <= r1 else range(r0, r1 - 1, -1)
        points = view.points or [edge.v[0].view.xy, edge.v[1].view.xy]
        pairs = list(zip(points, ranks)) if len(points) == len(ranks) else [(points[0], r0), (points[-1], r1)]
        paths[key] = _through_gutters(pairs, moved, column_of, shifts, height)
    return centers, paths, width, height, len(starts)


def _through_gutters(pairs, moved, column_of, shifts, height) -> list:
    """The points of an edge, with a detour below, through the gutter and above where it changes column."""
    out = []
    for (point, rank), nxt in zip(pairs, pairs[1:] + [None]):
        out.append(moved(point, rank))
        if nxt is None or column_of[nxt[1]] == column_of[rank]:
            continue
        here, there = moved(point, rank), moved(*nxt)
        gutter = shifts[column_of[nxt[1]]][0] - COLUMN_GAP / 2 if column_of[nxt[1]] > column_of[rank] else \
            shifts[column_of[rank]][0] - COLUMN_GAP / 2
        out += [(here[0], height + RANK_GAP / 2), (gutter, height + RANK_GAP / 2), (gutter, -RANK_GAP / 2),
                (there[0], -RANK_GAP / 2)]
    return out


def lay_out(sizes: dict, edges: list) -> Placed:
    """Lay boxes out top to bottom along `edges`, each connected component wrapped into columns, components in
    rows.

    Args:
        sizes: box key -> (width, height).
        edges: (a, b) box keys.
    """
    vertices = {k: Vertex(k) for k in sizes}
    for k, v in vertices.items():
        v.view = _View(*sizes[k])
    edge_views = {}
    graph_edges = []
    for a, b in edges:
        e = Edge(vertices[a], vertices[b])
        e.view = _EdgeView()
        edge_views[(a, b)] = (e, e.view)
        graph_edges.append(e)
    graph = Graph(list(vertices.values()), graph_edges)
    centers, paths, x, y, row_height, widest, columns = {}, {}, 0.0, 0.0, 0.0, 0.0, 1
    for component in sorted(graph.C, key=lambda c: -len(c.sV)):
        layout = _sugiyama(component)
        mine = {key: ev for key, ev in edge_views.items() if ev[0] in component.sE}
        c, p, w, h, cols = _wrap(layout, list(component.sV), mine)
        columns = max(columns, cols)
        if x > 0 and x + w > max(widest, 600.0):
            x, y, row_height = 0.0, y + row_height + COMPONENT_GAP, 0.0
        centers.update({k: (px + x, py + y) for k, (px, py) in c.items()})
        paths.update({k: [(px + x, py + y) for px, py in pts] for k, pts in p.items()})
        x += w + COMPONENT_GAP
        row_height, widest = max(row_height, h), max(widest, x - COMPONENT_GAP)
    return Placed(centers, paths, widest, y + row_height, columns)
