"""The HTML report: ONE self-contained file (CSS, JavaScript, data and the SVG inlined; nothing fetched) with the
summary, a searchable, sortable table of every node with its color and reason, and the picture; clicking a node
in the table or the picture shows its explanation. The page honours `#search=TEXT`, `#class=CLASS` and
`#node=NAME` (also as ?query parameters), so a link can open it searched or on one node."""

from __future__ import annotations

import html
import json

from ..errors import ModelError
from .dot import is_whole_model, picture as make_picture, picture_svg
from .explanation import Explainer
from .html_assets import CSS, JS, PAGE
from .node_times import explained_times
from .palette import CLASSES, FILL, dtype_label
from .stats import summarize
from .text import blocks
from .wording import reason_text


def _summary_html(items) -> str:
    """The text report's blocks as HTML paragraphs and tables."""
    out = []
    for item in items:
        if isinstance(item, str):
            if item.startswith("Converted "):
                out.append(f'<p class="line"><span class="grappler">{html.escape(item)}</span></p>')
            elif item and not item.startswith("ask why"):
                out.append(f'<p class="line">{html.escape(item)}</p>')
            continue
        out.append(f"<h3>{html.escape(item.title)}</h3>")
        head = "".join(f"<th>{html.escape(h)}</th>" for h in item.headers)
        body = "".join("<tr>" + "".join(_cell(c, i) for i, c in enumerate(row)) + "</tr>" for row in item.rows)
        out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "\n".join(out)


def _cell(value: str, column: int) -> str:
    text = html.escape(str(value))
    if column == 0 and value in FILL:
        return f'<td><span class="chip" style="background:{FILL[value]}"></span>{text}</td>'
    numeric = column > 0 and text.replace(",", "").isdigit()
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def _node_data(tables, explainer) -> dict:
    """The table's data: graphs, nodes as [graph, name, op, class, dtype, flops, reason, explanation], texts."""
    graphs, nodes, texts = [], [], []
    for g, table in enumerate(tables):
        graphs.append(table.name or "(main graph)")
        for row in table.rows.values():
            decision = row.decision
            if row.cast is not None:
                dtype, reason = dtype_label(row.cast.to_dtype), f"inserted Cast of {row.cast.src}:{row.cast.src_port}"
            else:
                dtype = dtype_label(decision.dtype_after) if decision else ""
                reason = reason_text(decision.reason) if decision else "no type attributes"
            nodes.append([g, row.name, row.op, row.node_class, dtype, row.flops, reason, len(texts)])
            texts.append(explainer.explain_row(row).text())
    return {"graphs": graphs, "nodes": nodes, "explanations": texts, "fills": FILL}


def _picture_html(result, tables, options) -> tuple:
    """(SVG markup or a note, name of the graph drawn as the table shows it, or None)."""
    pic = make_picture(result, tables=tables, **options)
    try:
        svg = picture_svg(pic)
    except ModelError as e:
        return f'<p class="muted">No picture: {html.escape(str(e))}</p>', None
    svg = svg[svg.find("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inline
    label = html.escape(pic.title if pic.collapsed else f"{pic.title} ({pic.graph.number_of_nodes()} nodes)")
    return (f'<p><button data-zoom="1.25">zoom in</button> <button data-zoom="0.8">zoom out</button> '
            f'<button data-zoom="0">fit width</button></p><p class="muted">{label}</p><div id="svg-box">{svg}</div>',
            pic.source or "(main graph)")


def _explorer_html(result, tables, data: dict, options: dict, costs=None, show: str = "precision") -> str:
    """The network explorer (explorer.py) of the graph holding the network, with its time view when `costs` has
    times; adds its data to `data`."""
    from .explorer import explorer_data, explorer_markup
    from .whole_model import layer_picture, picture_times
    graph, title, notes = layer_picture(result, options.get("function"), options.get("max_nodes", 150), tables)
    times = None if costs is None else picture_times(graph, tables, costs, result)
    if costs is not None and times is None:
        notes = [f"No times: {costs.note}."] + notes
    g = next(i for i, t in enumerate(tables) if t.name == graph.source)
    index = {n[1]: i for i, n in enumerate(data["nodes"]) if n[0] == g}
    data["explorer"] = explorer_data(graph, result.precision, index, times)
    data["pictureGraph"] = data["graphs"][g]
    return explorer_markup(graph, title, notes, times, show)


def to_html(result, function: str | None = None, tables=None, model: str | None = None, top: int = 15,
            costs=None, show: str = "precision", **picture_options) -> str:
    """The HTML report of a RewriteResult as one self-contained page.

    Args:
        result: a RewriteResult.
        function: only this rewritten function; None for all graphs.
        tables: build_tables(result, function), if already built.
        model: the model path for the title.
        top: rows in the summary tables.
        costs: the CostTable the rewrite read (or one measured for it): the whole-model explorer gains its time
            view (layer_times), and each node's explanation its times.
        show: "time" opens the explorer colored by time, "precision" by precision.
        picture_options: dot.picture options (around, depth, collapse_scopes, max_nodes).

    Raises:
        OptionError: an unknown function or --around node.
    """
    from .node_table import build_tables
    tables = build_tables(result, function) if tables is None else tables
    summary = summarize(tables, result)
    explainer = Explainer(tables, result.precision, explained_times(tables, costs, result))
    data = _node_data(tables, explainer)
    options = {"function": function, **picture_options}
    scripts = ""
    if is_whole_model(options):
        from .explorer import explorer_scripts
        picture_markup, scripts = _explorer_html(result, tables, data, options, costs, show), explorer_scripts()
    else:
        picture_markup, data["pictureGraph"] = _picture_html(result, tables, options)
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title = f"mp-rewrite inspect: {model}" if model else "mp-rewrite inspect"
    options = "".join(f'<option value="{c}">{c}</option>' for c, _, _ in CLASSES)
    headers = "".join(f"<th>{h}</th>" for h in ("graph", "node", "op", "color", "dtype", "FLOPs", "reason"))
    return PAGE.substitute(title=html.escape(title), css=CSS, js=JS, payload=payload, options=options,
                           headers=headers, picture=picture_markup, summary=_summary_html(blocks(summary, top)),
                           precision=html.escape(result.precision), device=html.escape(result.device),
                           scripts=scripts)
