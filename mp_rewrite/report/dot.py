"""Pictures: the colored graph as Graphviz DOT and SVG — a fill per node class, inserted Casts as dashed
ellipses, collapsed name scopes as boxes striped by the classes of their nodes."""

from __future__ import annotations

import math
import shutil
import subprocess

import graphviz

from ..errors import ModelError, OptionError
from .palette import CLASS_NAMES, FILL, LEGEND, dtype_label
from .subgraph import Picture, cut
from .wording import reason_text

DOT_TIMEOUT = 300  # seconds; a collapsed picture lays out in a few
# Above these (boxes, edges), dot's default crossing minimisation and network simplex take minutes; these limits
# bring a 400-box, 900-edge picture down to seconds, with straight edges.
BIG_PICTURE = (120, 250)
FAST_LAYOUT = {"mclimit": "0.1", "nslimit": "1", "nslimit1": "1", "splines": "line"}


def short_name(name: str, width: int = 36) -> str:
    """The last two name-scope components, cut from the left to `width` characters."""
    short = "/".join(name.split("/")[-2:])
    return short if len(short) <= width else "…" + short[-(width - 1):]


def _node_attrs(row) -> dict:
    """DOT attributes of one node: fill by class, label "name\\nop dtype", tooltip with the reason."""
    decision = row.decision
    short = short_name(row.name)
    if row.cast is not None:
        label = f"Cast {dtype_label(row.cast.from_dtype)}→{dtype_label(row.cast.to_dtype)}"
        return {"label": label, "shape": "ellipse", "style": "dashed,filled", "fillcolor": FILL["cast"],
                "class": "mp-cast", "tooltip": f"{row.name}: inserted Cast", "fontsize": "9"}
    dtype = f" {dtype_label(decision.dtype_after)}" if decision is not None else ""
    tip = f"{row.name}: {reason_text(decision.reason)}" if decision is not None else row.name
    return {"label": f"{short}\\n{row.op}{dtype}", "shape": "box", "style": "rounded,filled",
            "fillcolor": FILL[row.node_class], "class": f"mp-{row.node_class}", "tooltip": tip[:300]}


def _scope_attrs(name: str, data: dict) -> dict:
    """DOT attributes of a collapsed scope: a box striped by its node classes, with the counts."""
    classes = data["classes"]
    total = sum(classes.values())
    parts = [f"{c} {classes[c]}" for c in CLASS_NAMES if classes.get(c)]
    stripes = ":".join(f"{FILL[c]};{classes[c] / total:.3f}" for c in CLASS_NAMES if classes.get(c))
    return {"label": f"{name} ({total} nodes)\\n{' · '.join(parts)}", "shape": "box", "style": "striped",
            "fillcolor": stripes, "class": "mp-scope", "tooltip": f"{name}: {total} nodes; " + ", ".join(parts),
            "penwidth": "2"}


def _legend(dot: graphviz.Digraph, classes) -> None:
    with dot.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontsize="10", style="dashed")
        for c in classes:
            legend.node(f"legend: {c}", label=c, shape="box", style="rounded,filled" if c != "cast" else
                        "dashed,filled", fillcolor=FILL[c], fontsize="9", tooltip=LEGEND[c], **{"class": "mp-legend"})


def to_dot_source(picture: Picture) -> str:
    """The DOT text of a Picture."""
    dot = graphviz.Digraph("mp_rewrite", graph_attr={"rankdir": "TB", "label": picture.title, "labelloc": "t",
                                                     "fontsize": "12", "fontname": "Helvetica"},
                           node_attr={"fontname": "Helvetica", "fontsize": "10"},
                           edge_attr={"arrowsize": "0.6", "color": "#555555"})
    present = set()
    for name, data in picture.graph.nodes(data=True):
        if data["kind"] == "scope":
            attrs = _scope_attrs(name, data)
            present.update(data["classes"])
        else:
            attrs = _node_attrs(data["row"])
            present.add(data["row"].node_class)
            if name == picture.center:
                attrs["penwidth"] = "3"
        dot.node(name, **attrs)
    for src, dst, data in picture.graph.edges(data=True):
        attrs = {"style": "dashed", "color": "#aaaaaa"} if data["control"] else {}
        if data["count"] > 1:  # no edge labels: dot lays each one out as a node, which is slow on big pictures
            attrs.update(tooltip=f"{data['count']} edges", penwidth=f"{1 + math.log10(data['count']):.2f}")
        dot.edge(src, dst, **attrs)
    if picture.graph.number_of_nodes() > BIG_PICTURE[0] or picture.graph.number_of_edges() > BIG_PICTURE[1]:
        dot.graph_attr.update(FAST_LAYOUT)
    _legend(dot, [c for c in CLASS_NAMES if c in present])
    return dot.source


def pick_graph(tables, function: str | None, around: str | None = None):
    """The table to draw: `function`'s; else the first (main graph first) holding the `around` node; else the main
    graph when it converts or denies anything, else the function that converts or denies the most (a SavedModel's
    main graph only calls its functions)."""
    if function is not None:
        return next(t for t in tables if t.name == function)
    if around is not None:
        return next((t for t in tables if around in t.rows), tables[0])

    def work(table, classes=("allow", "deny", "infer-kept", "clear-kept", "allow-kept")):
        return sum(1 for r in table.rows.values() if r.node_class in classes)
    main = tables[0]
    if main.name != "" or work(main, ("allow", "deny")) or len(tables) == 1:
        return main
    return max(tables, key=lambda t: (work(t, ("allow", "deny")), work(t)))


def picture(result, function: str | None = None, around: str | None = None, depth: int = 2,
            collapse_scopes=None, max_nodes: int = 150, tables=None, control: bool = False) -> Picture:
    """The Picture of a RewriteResult's graph (see subgraph.cut for the options; `control` draws control edges).

    Raises:
        OptionError: an unknown function or --around node, or a bad depth.
    """
    from .node_table import build_tables
    tables = build_tables(result, function, with_flops=False) if tables is None else tables
    return cut(pick_graph(tables, function, around), around, depth, collapse_scopes, max_nodes, control)


def is_whole_model(options: dict) -> bool:
    """True when the options ask for no neighbourhood and no particular collapsing: the whole-model layer picture
    (whole_model.py) is drawn then."""
    return options.get("around") is None and options.get("collapse_scopes") is None


def to_dot(result, function: str | None = None, **options) -> str:
    """The DOT text of a RewriteResult's colored graph (options as picture()); without --around or
    --collapse-scopes, the whole-model layer picture's."""
    if is_whole_model(options):
        from .layer_dot import layer_dot
        from .whole_model import layer_picture
        graph, title, notes = layer_picture(result, function, options.get("max_nodes", 150))
        return layer_dot(graph, title, notes, result.precision)
    return to_dot_source(picture(result, function, **options))


def render_svg(source: str) -> str:
    """Lay DOT text out with Graphviz's `dot` and return the SVG.

    Raises:
        ModelError: `dot` is not installed, fails or takes longer than DOT_TIMEOUT seconds.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise ModelError("Graphviz's 'dot' program is not installed (apt-get install graphviz); without it "
                         "pictures are laid out in Python (--engine python, the default when dot is missing)")
    try:
        done = subprocess.run([exe, "-Tsvg"], input=source.encode(), capture_output=True, timeout=DOT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ModelError(f"Graphviz took over {DOT_TIMEOUT} s to lay the graph out; draw less with --around NODE "
                         "--depth K, --function NAME or --collapse-scopes") from None
    if done.returncode != 0:
        raise ModelError(f"Graphviz failed: {done.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
    return done.stdout.decode()


ENGINES = ("auto", "python", "graphviz")


def picture_svg(pic: Picture, engine: str = "auto") -> str:
    """The SVG of a Picture: laid out by Graphviz's `dot` where it is installed ("auto") or asked for
    ("graphviz"), else in pure Python (report/svg.py), which needs nothing beyond `pip install`.

    Raises:
        ModelError: engine "graphviz" without Graphviz, or Graphviz failing. OptionError: an unknown engine.
    """
    if engine not in ENGINES:
        raise OptionError(f"unknown picture engine {engine!r}: use {', '.join(ENGINES)}")
    if engine == "graphviz" or (engine == "auto" and shutil.which("dot")):
        return render_svg(to_dot_source(pic))
    from .svg import picture_to_svg
    return picture_to_svg(pic)


def to_svg(result, function: str | None = None, engine: str = "auto", **options) -> str:
    """The SVG of a RewriteResult's colored graph (options as picture(); engine as picture_svg()). Without
    --around or --collapse-scopes it is the whole-model layer picture, laid out in Python (it wraps long chains
    into columns; Graphviz does not) unless engine is "graphviz".

    Raises:
        ModelError: Graphviz asked for and missing or failing. OptionError: as picture().
    """
    if is_whole_model(options) and engine != "graphviz":
        if engine not in ENGINES:
            raise OptionError(f"unknown picture engine {engine!r}: use {', '.join(ENGINES)}")
        from .whole_model import whole_model_svg
        return whole_model_svg(result, function, options.get("max_nodes", 150))
    if is_whole_model(options):
        return render_svg(to_dot(result, function, **options))
    return picture_svg(picture(result, function, **options), engine)
