"""The text report: a rich table in a terminal, plain columns when piped. Renders stats.Summary only."""

from __future__ import annotations

import dataclasses

from .palette import CLASS_NAMES, FILL, LEGEND, dtype_label
from .stats import Summary, op_rows, percent


@dataclasses.dataclass(frozen=True)
class Table:
    """A titled table of strings (the first column left-aligned, the others right-aligned)."""

    title: str
    headers: tuple
    rows: list


def human_flops(value: int) -> str:
    """12345678 -> "12.3 MFLOP"."""
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} FLOP"


def flop_line(summary: Summary) -> str:
    """The share of matmul/conv FLOPs in low precision, in words."""
    share, low = summary.flops, dtype_label({"float16": "half"}.get(summary.precision, summary.precision))
    if share.nodes == 0:
        return "matmul/conv FLOPs: the graph has no matmul or convolution"
    unknown = f"; {share.unknown} of {share.nodes} matmul/conv nodes have unknown shapes" if share.unknown else ""
    if not share.total:
        return (f"matmul/conv FLOPs in {low}: unknown (no shapes known{unknown}; save the graph with "
                "as_graph_def(add_shapes=True) or give a SavedModel)")
    return (f"matmul/conv FLOPs in {low}: {percent(share.low, share.total)} ({human_flops(share.low)} of "
            f"{human_flops(share.total)} per step{unknown})")


def blocks(summary: Summary, top: int = 12) -> list:
    """The report as a list of lines (str) and Tables."""
    main_nodes = summary.graphs.get("", (0, ""))[0]
    functions = [g for g in summary.graphs if g]
    head = f"mixed precision rewrite to {summary.precision} (device {summary.device})"
    head += f": main graph {main_nodes} nodes" if "" in summary.graphs else ""
    head += f", {len(functions)} function(s) rewritten" if functions else ""
    if functions and "" in summary.graphs:  # Grappler's line counts every graph's nodes: say the two add up
        head += f" ({sum(n for n, _ in summary.graphs.values())} nodes in all)"
    out = [head, summary.grappler_line, "",
           f"float32 type attributes converted: {summary.attrs_converted} of {summary.attrs_float32} "
           f"({percent(summary.attrs_converted, summary.attrs_float32)})",
           f"casts inserted: {summary.casts} ({summary.casts_to_low} to {summary.precision}, "
           f"{summary.casts - summary.casts_to_low} to float32)",
           flop_line(summary), ""]
    out.append(Table("nodes per color", ("color", "nodes", "meaning"),
                     [(c, str(n), LEGEND[c]) for c, n in summary.by_class.items()]))
    classes = [c for c in CLASS_NAMES if c != "cast" and any(c in counts for counts in summary.by_op.values())]
    rows = [(op, *(str(counts.get(c, 0) or "") for c in classes), str(sum(counts.values())))
            for op, counts in op_rows(summary, top)]
    out.append(Table(f"nodes per color per op type (top {top} ops)", ("op", *classes, "total"), rows))
    kept = [(g.text, str(g.nodes), human_flops(g.flops) if g.flops else "?", _where(g.example))
            for g in summary.kept[:top]]
    out.append(Table("why compute-heavy ops stayed float32 (matmul/conv and allow-list ops)",
                     ("reason", "nodes", "FLOPs", "example node"), kept) if kept
               else "every compute-heavy op computes in low precision")
    if functions:
        out.append(Table("graphs", ("graph", "nodes", "Grappler's line"),
                         [(g or "(main graph)", str(n), line) for g, (n, line) in summary.graphs.items()][:top + 1]))
    out.append("ask why a node kept its dtype: mp-rewrite explain MODEL NODE")
    return out


def _where(example: tuple) -> str:
    graph, node = example
    return f"{node} (in {graph})" if graph else node


def render_plain(items) -> str:
    """Render blocks() as plain text columns."""
    lines = []
    for item in items:
        if isinstance(item, str):
            lines.append(item)
            continue
        lines.append(f"{item.title}:")
        if not item.rows:
            lines.append("  (none)")
            continue
        widths = [max(len(str(r[i])) for r in [item.headers, *item.rows]) for i in range(len(item.headers))]
        right = [i > 0 and _numeric(item, i) for i in range(len(widths))]
        for r in [item.headers, *item.rows]:
            cells = [str(c).rjust(w) if right[i] else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
            lines.append("  " + "  ".join(cells).rstrip())
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_rich(items, console) -> None:
    """Print blocks() to a rich Console as tables."""
    from rich.table import Table as RichTable
    from rich.text import Text
    for item in items:
        if isinstance(item, str):
            console.print(item, highlight=False, markup=False)
            continue
        table = RichTable(title=item.title, title_justify="left")
        for i, header in enumerate(item.headers):
            table.add_column(header, justify="left" if i == 0 or not _numeric(item, i) else "right")
        for r in item.rows:
            table.add_row(*(Text(c, style=f"black on {FILL[c]}") if c in FILL else c for c in r))
        console.print(table)


def _numeric(table: Table, column: int) -> bool:
    return all(str(r[column]).replace(",", "").isdigit() or r[column] in ("", "?") for r in table.rows)


def to_text(result, top: int = 12, function: str | None = None, tables=None) -> str:
    """The inspection report of a RewriteResult as plain text.

    Args:
        result: a RewriteResult.
        top: rows per table.
        function: report only this rewritten function ("" for the main graph only); None reports all graphs.
        tables: build_tables(result, function), if already built.

    Raises:
        OptionError: an unknown function.
    """
    from .node_table import build_tables
    from .stats import summarize
    tables = build_tables(result, function) if tables is None else tables
    return render_plain(blocks(summarize(tables, result), top))
