"""The piece of a graph to draw: a networkx DiGraph of the rewritten graph (inserted Casts included), cut to a
node's neighbourhood and/or contracted by name scope so that thousands of nodes stay legible."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import re

import networkx as nx

from ..errors import OptionError


@dataclasses.dataclass
class Picture:
    """What to draw.

    Attributes:
        graph: nx.DiGraph; node attributes: kind ("node" or "scope"), and for nodes `row` (NodeRow), for scopes
            `members` (node names) and `classes` (Counter of node classes). Edge attribute `count` (edges merged)
            and `control` (True for a control edge).
        title: what the picture shows.
        collapsed: how name scopes were collapsed ("at depth 2", "to fit 400 boxes"), or None.
        center: the --around node, if any.
        source: the name of the graph drawn ("" for the main graph).
    """

    graph: nx.DiGraph
    title: str
    collapsed: str | None = None
    center: str | None = None
    source: str = ""


def table_graph(table, control: bool = True) -> nx.DiGraph:
    """The rewritten graph of a GraphTable as a DiGraph (data edges; control edges marked, if `control`)."""
    graph = nx.DiGraph()
    for name, row in table.rows.items():
        graph.add_node(name, kind="node", row=row)
    for name, row in table.rows.items():
        for src, _ in row.drawn_inputs:
            if src in table.rows:
                graph.add_edge(src, name, count=1, control=False)
        for src in row.control_inputs if control else ():
            if src in table.rows and not graph.has_edge(src, name):
                graph.add_edge(src, name, count=1, control=True)
    return graph


def neighbourhood(graph: nx.DiGraph, center: str, depth: int) -> nx.DiGraph:
    """The nodes within `depth` edges of `center` (either direction) and the edges among them.

    Raises:
        OptionError: `center` is not in the graph, or depth is negative.
    """
    if center not in graph:
        raise OptionError(f"--around: no node named '{center}' in this graph")
    if depth < 0:
        raise OptionError(f"--depth must be 0 or more, got {depth}")
    # A breadth-first walk over both directions; nx.ego_graph(undirected=True) deep-copies every node's data.
    seen, frontier = {center}, [center]
    for _ in range(depth):
        frontier = [m for n in frontier for m in (*graph.predecessors(n), *graph.successors(n)) if m not in seen]
        seen.update(frontier)
    return graph.subgraph(seen).copy()


def _prefixes(name: str):
    """The name scopes of a node name, outermost first, as group keys ("a/b/c" -> "a/", "a/b/")."""
    parts = name.split("/")
    return ["/".join(parts[:i]) + "/" for i in range(1, len(parts))]


def depth_boxes(names, depth: int, keep=()) -> dict:
    """node -> box: its name scope at `depth` ("a/b/"), or the node itself when its name is not deeper."""
    boxes = {}
    for name in names:
        scopes = _prefixes(name)
        boxes[name] = name if name in keep or len(scopes) < depth else scopes[depth - 1]
    return boxes


SERIES = re.compile(r"_\d+$")
SMALL_SERIES = 4  # a longer series stays one box: opened, it is a wide row of look-alike nodes


def _series(names) -> dict:
    """node -> its series box ("scope/AddN_*") when siblings differ only by TF's "_<n>" suffix, as TensorBoard
    groups them; nodes without such siblings are left out."""
    key = {n: SERIES.sub("", n) + "_*" for n in names}
    counts = collections.Counter(key.values())
    return {n: k for n, k in key.items() if counts[k] > 1}


def budget_boxes(names, max_nodes: int, keep=()) -> dict:
    """node -> box, opening the biggest name scopes first while the picture stays within `max_nodes` boxes.

    Boxes are name scopes ("a/b/") and series of siblings ("a/b/AddN_*"). It starts from the outermost ones; a box
    opens into what it holds when that fits the budget (a box of one node always opens; a series of more than
    SMALL_SERIES nodes never does), so a big model keeps its structure where most of its nodes are.
    """
    series = _series(names)
    children, size, frontier = collections.defaultdict(set), collections.Counter(), set()
    for name in names:
        scopes = _prefixes(name) + ([series[name]] if name in series else [])
        if name in keep or not scopes:
            frontier.add(name)
            continue
        frontier.add(scopes[0])
        for outer, inner in zip(scopes, scopes[1:] + [name]):
            size[outer] += 1
            children[outer].add(inner)
    heap = [(-size[g], g) for g in frontier if g in size]
    heapq.heapify(heap)
    count = len(frontier)
    while heap:
        _, group = heapq.heappop(heap)
        kids = children[group]
        if count + len(kids) - 1 > max_nodes or (group.endswith("_*") and len(kids) > SMALL_SERIES):
            continue
        frontier.discard(group)
        frontier |= kids
        count += len(kids) - 1
        for kid in kids:
            if kid in size:
                heapq.heappush(heap, (-size[kid], kid))
    return {name: name if name in frontier else
            next(g for g in _prefixes(name) + [series.get(name)] if g in frontier) for name in names}


def collapse(graph: nx.DiGraph, boxes: dict) -> nx.DiGraph:
    """Contract the graph by `boxes` (node -> box name; a node in its own box stays itself): a box of several
    nodes becomes a "scope" node; edges between boxes are merged and counted."""
    members = collections.defaultdict(list)
    for name, box in boxes.items():
        members[box].append(name)
    out = nx.DiGraph()
    for box, names in members.items():
        if names == [box] or len(names) == 1:
            boxes[names[0]] = names[0]
            out.add_node(names[0], **graph.nodes[names[0]])
        else:
            classes = collections.Counter(graph.nodes[n]["row"].node_class for n in names)
            out.add_node(box, kind="scope", members=names, classes=classes)
    for src, dst, data in graph.edges(data=True):
        a, b = boxes[src], boxes[dst]
        if a == b:
            continue
        if out.has_edge(a, b):
            out[a][b]["count"] += data["count"]
            out[a][b]["control"] = out[a][b]["control"] and data["control"]
        else:
            out.add_edge(a, b, count=data["count"], control=data["control"])
    return out


def cut(table, around: str | None = None, depth: int = 2, collapse_scopes=None, max_nodes: int = 150,
        control: bool = True) -> Picture:
    """The Picture of one GraphTable.

    Args:
        table: a GraphTable (node_table.graph_table).
        around: draw only this node's neighbourhood...
        depth: ...of this many edges (either direction).
        collapse_scopes: None (collapse automatically above `max_nodes` nodes), False (never), True (always, within
            `max_nodes` boxes) or an int (every name scope at that depth becomes a box).
        max_nodes: the box budget of a collapsed picture.
        control: draw control edges (dashed).

    Raises:
        OptionError: an unknown --around node or a bad depth.
    """
    graph = table_graph(table, control)
    title = table.label
    if around is not None:
        graph = neighbourhood(graph, around, depth)
        title += f", {depth} edge(s) around {around}"
    collapsed = None
    if collapse_scopes is not False and (collapse_scopes is not None or graph.number_of_nodes() > max_nodes):
        keep = [around] if around else []
        casts = {n: d["row"].cast.src for n, d in graph.nodes(data=True) if d["row"].cast is not None}
        names = [n for n in graph if n not in casts]
        if isinstance(collapse_scopes, int) and not isinstance(collapse_scopes, bool):
            if collapse_scopes < 1:
                raise OptionError(f"--collapse-scopes depth must be 1 or more, got {collapse_scopes}")
            boxes, collapsed = depth_boxes(names, collapse_scopes, keep), f"at depth {collapse_scopes}"
        else:
            boxes, collapsed = budget_boxes(names, max_nodes, keep), f"to fit {max_nodes} boxes"
        boxes.update({cast: boxes.get(src, cast) for cast, src in casts.items()})  # a Cast joins its source
        graph = collapse(graph, boxes)
        title += f", {graph.number_of_nodes()} name scopes and nodes (collapsed {collapsed})"
    return Picture(graph, title, collapsed, around, table.name)
