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
    # The page's search line counts every box, inputs and outputs too: the title says both, so they agree.
    ends = len(graph.layers) - layers
    boxes = f" ({len(graph.layers)} boxes with the {ends} inputs and outputs)" if ends else ""
    title = f"{table.label}: {layers} layers{boxes}, {len(graph.box_of)} ops ({result.precision})"
    hidden = ", ".join(f"{n} {HIDDEN_WORDS.get(role, role)}" for role, n in graph.hidden.most_common() if role)
    notes = [f"Drawn: {table.label}, {how}. Each box is a layer (name scope), colored by the precision its ops "
             "compute in (striped when mixed).", f"Not drawn as boxes: {hidden}."]
    if graph.note:
        notes.append(f"Collapsed: {graph.note}; open a layer in the HTML page, or draw it with --around NODE.")
    return graph, title, notes


def whole_model_svg(result, function: str | None = None, max_nodes: int = 150, tables=None, costs=None) -> str:
    """The SVG of the whole model (see layer_picture for the arguments); with `costs` (the CostTable the rewrite
    read, or one measured for it) its time view (layer_times)."""
    from .node_table import build_tables
    tables = build_tables(result, function, with_flops=False) if tables is None else tables
    graph, title, notes = layer_picture(result, function, max_nodes, tables)
    times = None
    if costs is not None:
        times = picture_times(graph, tables, costs, result)
        notes = (time_notes(times, graph) if times else [f"No times: {costs.note}."]) + notes
    svg, _ = layer_svg(graph, title, notes, result.precision, times)
    return svg


def picture_times(graph, tables, costs, result):
    """The layer_times.TimeView of a picture's LayerGraph, or None when the table has no times (a machine without
    low-precision units measures nothing: its note says so)."""
    from .layer_times import time_view
    from .node_times import has_times
    if not has_times(costs):
        return None
    return time_view(graph, tables, costs, result)


def total_line(times) -> str:
    """"Time per call: float32 73.5 ms → as converted 56.4 ms, the sum of the layers' ...; measured: ..."."""
    from .layer_times import ms_text
    line = (f"Time per call: float32 {ms_text(times.total_fp32)} ms → as converted {ms_text(times.total)} ms, the "
            f"sum of the layers' times, the Casts on edges ({ms_text(times.edge_casts)} ms)")
    if max(times.undrawn) >= 0.001:  # nothing to say where every node is in a box (or in what its box reads)
        line += (f", the nodes no box holds or reads ({ms_text(times.undrawn[0])} → {ms_text(times.undrawn[1])} "
                 "ms)")
    if times.complete:
        line += (f", what ran outside the layers (TF's own nodes, other graphs: {ms_text(times.elsewhere[0])} → "
                 f"{ms_text(times.elsewhere[1])} ms) and TF's executor between kernels, when none ran "
                 f"({ms_text(times.between[0])} → {ms_text(times.between[1])} ms)")
    measured = times.measured
    if measured:
        line += (f"; measured: float32 {ms_text(measured['float32'])} ms → {ms_text(measured['converted'])} ms "
                 f"({measured['how']})")
    return line


def time_notes(times, graph) -> list:
    """The time view's lines above the picture: the total per call, the three slowest layers, where the times
    come from."""
    from .layer_scopes import distinct_labels
    from .layer_times import kernel_text, time_label
    labels = distinct_labels(graph.layers)
    slowest = "; ".join(f"{labels[key]} {time_label(t, times.complete)}" + (f" ({kernel_text(t, 1)})" if t.kernels
                                                                              else "")
                        for key, t in times.slowest(3))
    return [total_line(times), f"Slowest layers: {slowest}.", f"Times: {times.source}."]
