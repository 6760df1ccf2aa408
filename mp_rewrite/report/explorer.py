"""The network explorer of the HTML report: the whole-model layer graph (whole_model.layer_picture) as data the page
lays out in the browser with dagre (vendored, MIT: vendor/NOTICE.md), so that a layer opens into its ops on a click
and an op shows its `explain` text. Nothing is fetched: dagre is inlined with the page."""

from __future__ import annotations

import html
import importlib.resources

from .explorer_assets import EXPLORER_CSS, EXPLORER_JS, EXPLORER_MARKUP
from .layer_svg import SHORT, _short, box_lines, counts_text, legend_chips, shown_classes, time_line
from .palette import NO_TIME_FILL, heat_fill

DAGRE = "vendor/dagre.min.js"


def dagre_source() -> str:
    """The vendored dagre (dist/dagre.min.js of npm @dagrejs/dagre 3.1.3, MIT), as text to inline."""
    return importlib.resources.files(__package__).joinpath(DAGRE).read_text(encoding="utf-8")


def explorer_data(graph, precision: str, node_index: dict, times=None) -> dict:
    """The page's data for one LayerGraph.

    Args:
        graph: a layer_graph.LayerGraph.
        precision: "float16" or "bfloat16".
        node_index: node name -> index in the page's node table (html._node_data), for the graph drawn.
        times: its layer_times.TimeView, or None without a time view.

    Returns:
        {"layers": [{"key", "kind", "lines", "classes": [[class, n]], "members": [node index]}],
         "edges": [[node index, node index, "2× f32→bf16" or "", [cast index]]], "graph": the graph's name};
        with times, each layer also has "time": [float32 ms, ms as converted], "heat" (its fill) and "tline" (its
        time line), and "casts": [ms of each Cast the edges name], "ops": {node index: [float32 ms, ms, fill,
        time text]} for the ops drawn when a layer opens, "noTime" (the fill of an op without one), "totals"
        (layer_times.TimeView's total, total_fp32, edge_casts and undrawn).
    """
    layers = []
    for key, layer in graph.layers.items():
        classes = shown_classes(layer) if layer.kind not in ("input", "output") else [("untouched", 1)]
        layers.append({"key": key, "kind": layer.kind, "lines": box_lines(layer, precision),
                       "classes": [[c, n] for c, n in classes],
                       "members": [node_index[m] for m in layer.members if m in node_index]})
    casts = {}  # cast node -> its index in data["casts"]
    edges = [[node_index[a], node_index[b], ",".join(_short(c) for c in directions),
              [casts.setdefault(name, len(casts)) for name in names]]
             for a, b, directions, names in graph.op_edges if a in node_index and b in node_index]
    data = {"layers": layers, "edges": edges, "graph": graph.source or "(main graph)"}
    if times is not None:
        _add_times(data, graph, node_index, times, casts)
    return data


def _add_times(data: dict, graph, node_index: dict, times, casts: dict) -> None:
    """The time view's part of the explorer data (see explorer_data)."""
    from .layer_times import LayerTime, kernel_text, time_label
    own = times.nodes.get(graph.table.name, {})
    kernels = {name: ran for (g, name), ran in times.kernels.items() if g == graph.table.name}
    for entry, (key, layer) in zip(data["layers"], graph.layers.items()):
        if layer.kind in ("input", "output"):
            continue
        t = times.layers[key]
        entry.update(time=[t.fp32, t.ms], heat=times.fill(key), tline=time_line(times, key))
        if t.kernels:
            entry["kline"] = kernel_text(t)
    data["casts"] = [own.get(name, (0.0, 0.0))[1] for name in casts]
    data["noTime"] = NO_TIME_FILL
    data["totals"] = {"total": times.total, "fp32": times.total_fp32, "edgeCasts": times.edge_casts,
                      "undrawn": list(times.undrawn), "elsewhere": list(times.elsewhere),
                      "between": list(times.between)}
    data["ops"] = {}
    for name in graph.box_of:
        if name in own and name in node_index:
            fp32, ms = own[name]
            text = time_label(LayerTime(fp32, ms, 1, 0, 0, 1)) + (f" · {kernels[name]}" if name in kernels else "")
            data["ops"][node_index[name]] = [fp32, ms, heat_fill(ms, times.top_ms), text]



def _legend(graph, times=None) -> str:
    chips = "".join(f'<span class="xchip" title="{html.escape(tip)}"><span class="chip" '
                    f'style="background:{fill}"></span>{html.escape(text if times else tip)}</span>'
                    for text, tip, fill in legend_chips(graph, times))
    cast = "Casts the rewrite inserted there" + (" (their time per call)" if times else "")
    return chips + f'<span class="xchip"><span class="xcast">f32→bf16</span>{cast}</span>'


def explorer_markup(graph, title: str, notes: list, times=None, show: str = "precision") -> str:
    """The explorer's HTML (toolbar, legend, notes and the empty SVG the page script fills); with a time view, the
    total per call and the slowest layers above it, the time legend and the toggle (`show`: the colors it opens
    with)."""
    legend = f'<div id="xlegend" data-mode="precision">{_legend(graph)}</div>'
    toggle = ""
    if times is not None:
        legend += (f'<div id="xlegend-time" data-mode="time"><b>time per call as converted:</b> '
                   f'{_legend(graph, times)}</div>')
        toggle = (f'<button data-x="mode" id="xmode" data-show="{html.escape(show)}">color by time</button> ')
    return EXPLORER_MARKUP.substitute(title=html.escape(title), legend=legend, toggle=toggle,
                                      times="" if times is None else slowest_markup(graph, times),
                                      notes="".join(f"<li>{html.escape(n)}</li>" for n in notes))


def slowest_markup(graph, times) -> str:
    """The total per call and the slowest layers, each a link to its box (the page script centres it)."""
    from .layer_scopes import distinct_labels
    from .layer_times import kernel_text, ms_text
    from .whole_model import total_line
    precision = SHORT.get(times.precision, times.precision)
    labels = distinct_labels(graph.layers)
    rows = "".join(
        f'<tr><td class="num">{i}</td><td><a href="#" data-goto="{html.escape(key)}">'
        f'{html.escape(labels[key])}</a></td><td class="num">{ms_text(t.fp32)} → {ms_text(t.ms)}</td>'
        f'<td class="num">{100 * t.ms / times.total:.1f}%</td>'
        f'<td>{html.escape(counts_text(graph.layers[key], times.precision))}</td>'
        f'<td>{html.escape(kernel_text(t, 3)[4:])}</td></tr>'
        for i, (key, t) in enumerate(times.slowest(), 1))
    return (f'<div id="xtimes" data-total="{times.total:.6f}" data-total-fp32="{times.total_fp32:.6f}">'
            f'<p id="xtotal">{html.escape(total_line(times))}.</p><table id="xslowest"><thead><tr><th>#</th>'
            f'<th>slowest layers</th><th>float32 → as converted (ms)</th><th>share</th><th>ops per precision '
            f'({precision}: low precision)</th><th>fused kernels TF ran</th></tr></thead><tbody>{rows}</tbody></table>'
            f'<p class="muted">Times: {html.escape(times.source)}.</p></div>')


def explorer_scripts() -> str:
    """The `<style>` and `<script>` blocks of the explorer: dagre, then the page script."""
    return (f"<style>{EXPLORER_CSS}</style><script>{dagre_source()}</script>"
            f"<script>{EXPLORER_JS}</script>")
