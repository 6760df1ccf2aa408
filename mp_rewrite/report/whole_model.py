"""The whole-model picture: the graph that holds the network (network.network_table) as a LayerGraph, drawn as
SVG with what was left out and how it was collapsed said in the picture."""

from __future__ import annotations

from .layer_graph import build_layer_graph
from .layer_svg import layer_svg
from .network import network_table

HIDDEN_WORDS = {"variable or constant": "variables, constants and weight arithmetic",
                "inserted Cast": "inserted Casts (marked on the edges, counted in the boxes)",
                "identity": "identities", "ordering": "ordering-only nodes"}


def layer_picture(result, function: str | None = None, max_nodes: int = 150, tables=None):
    """The LayerGraph to draw and its notes.

    Args:
        result: a RewriteResult.
        function: draw this graph ("" for the main graph); None for the graph holding the network.
        max_nodes: the box budget for opening nested layers (layer_scopes.group_ops).
        tables: node_table.build_tables(result, ...), if already built.

    Returns:
        (LayerGraph, title, notes).

    Raises:
        OptionError: an unknown function.
    """
    from .node_table import build_tables
    if tables is None:
        tables = build_tables(result, None if function is None else function, with_flops=False)
    if function is not None:
        table = next(t for t in tables if t.name == function)
        how = "as asked"
    else:
        table = network_table(tables)
        how = "the graph that holds the network" + (" (the function the signatures call)" if table.name else "")
    graph = build_layer_graph(table, max_nodes, {t.name: t for t in tables})
    layers = sum(1 for layer in graph.layers.values() if layer.kind in ("layer", "op"))
    title = f"{table.label}: {layers} layers, {len(graph.box_of)} ops ({result.precision})"
    hidden = ", ".join(f"{n} {HIDDEN_WORDS.get(role, role)}" for role, n in graph.hidden.most_common() if role)
    notes = [f"Drawn: {table.label}, {how}. Each box is a layer (name scope), colored by the precision its ops "
             "compute in (striped when mixed).", f"Not drawn as boxes: {hidden}."]
    if graph.note:
        notes.append(f"Collapsed: {graph.note}; open a layer in the HTML page, or draw it with --around NODE.")
    return graph, title, notes


def whole_model_svg(result, function: str | None = None, max_nodes: int = 150, tables=None) -> str:
    """The SVG of the whole model (see layer_picture for the arguments)."""
    graph, title, notes = layer_picture(result, function, max_nodes, tables)
    svg, _ = layer_svg(graph, title, notes, result.precision)
    return svg
