"""The whole-model picture as SVG: one box per layer of the LayerGraph, filled with the color of the precision it
computes in (striped, with counts, when its ops differ), Casts as marks on the edges where they sit.

Each box is `<g class="node mp-layer mp-CLASS">` with the box key as `<title>` (the HTML page finds boxes by it);
cast marks are `<g class="mp-cast-mark">`. Text is 11 and 9.5 px, never scaled down: a big model wraps into columns
(layer_layout) rather than shrinking.

The time view (`--show time`, a layer_times.TimeView) fills each box by its time as converted on the heat scale
instead, adds its time line ("1.42 → 0.78 ms · 2.1%") and the Casts' cost on the edges, and the legend gives the
scale in ms.
"""

from __future__ import annotations

import html

from .layer_layout import lay_out
from .palette import CLASS_NAMES, FILL, LEGEND

FONT = "Helvetica,Arial,sans-serif"
CHAR, SMALL_CHAR, LINE, PAD = 6.6, 5.5, 14.0, 7.0
MIN_WIDTH, MAX_CHARS, MARGIN, HEADER = 120.0, 34, 16.0, 74.0
LEGEND_TITLE = "layer time per call, as converted:"  # the time view's legend
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "half": "f16", "float": "f32"}
# Ops named first in a box: what the layer is (a Dense layer's Tensordot also gathers shapes with GatherV2).
PRIMARY_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2", "BatchMatMulV3",
                         "Einsum", "_FusedConv2D", "_FusedMatMul", "While", "StatelessWhile", "Softmax"})
KEPT = {"deny": "f32 deny", "infer-kept": "f32 infer", "clear-kept": "f32 clear", "allow-kept": "f32 allow-list",
        "untouched": "other"}


def _short(direction: str) -> str:
    a, b = direction.split("→")
    return f"{SHORT.get(a, a)}→{SHORT.get(b, b)}"


def _clip(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def shown_classes(layer) -> list:
    """(class, count) of a box, legend order; "untouched" only when nothing else is there."""
    present = [(c, layer.classes[c]) for c in CLASS_NAMES if layer.classes.get(c)]
    colored = [(c, n) for c, n in present if c != "untouched"]
    return colored or present


def box_lines(layer, precision: str) -> list:
    """The text lines of a box: name, its main ops, precision counts with variables and Casts."""
    if layer.kind in ("input", "output"):
        return [_clip(f"{layer.kind}: {layer.label}")]
    from .network import WEIGHT_OPS
    ops = sorted(layer.ops, key=lambda op: (op not in PRIMARY_OPS, op not in WEIGHT_OPS, -layer.ops[op]))
    shown = ", ".join(f"{op}×{layer.ops[op]}" if layer.ops[op] > 1 else op for op in ops[:2])
    more = f" +{len(ops) - 2}" if len(ops) > 2 else ""
    counts = counts_text(layer, precision)
    extra = []
    if layer.variables:
        extra.append(f"{len(layer.variables)} var{'s' if len(layer.variables) > 1 else ''}")
    if layer.casts:
        extra.append(f"{sum(layer.casts.values())} cast{'s' if sum(layer.casts.values()) > 1 else ''}")
    return [_clip(layer.label), _clip(shown + more, 40), " · ".join([counts] + extra)]


def counts_text(layer, precision: str) -> str:
    """A box's ops per precision: "bf16 5 · f32 deny 7 · f32 infer 2"."""
    low = SHORT.get(precision, precision)
    return " · ".join(f"{low if c == 'allow' else KEPT.get(c, c)} {n}" for c, n in shown_classes(layer))


def box_size(lines: list) -> tuple:
    width = max([len(lines[0]) * CHAR] + [len(line) * SMALL_CHAR for line in lines[1:]]) + 2 * PAD
    return max(MIN_WIDTH, width), len(lines) * LINE + PAD


def _fill(index: int, layer, x: float, y: float, w: float, h: float, heat: str | None = None) -> str:
    """The box: one fill, or vertical stripes in proportion to its classes; in the time view its `heat` fill."""
    classes = shown_classes(layer) if layer.kind not in ("input", "output") else [("untouched", 1)]
    stripes = [(f"mp-stripe mp-{c}", n, FILL[c]) for c, n in classes] if heat is None else [("mp-heat", 1, heat)]
    total, left, parts = sum(n for _, n, _ in stripes), x - w / 2, []
    for cls, n, fill in stripes:
        part = w * n / total
        parts.append(f'<rect class="{cls}" x="{left:.1f}" y="{y - h / 2:.1f}" width="{part:.1f}" '
                     f'height="{h:.1f}" fill="{fill}"/>')
        left += part
    rx = h / 2 if layer.kind in ("input", "output") else 4
    clip = f"clip-{index}"
    return (f'<clipPath id="{clip}"><rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" '
            f'height="{h:.1f}" rx="{rx}"/></clipPath><g clip-path="url(#{clip})">{"".join(parts)}</g>'
            f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" '
            'fill="none" stroke="#333" stroke-width="1.2"/>')


def _box(index: int, key: str, layer, lines: list, center: tuple, size: tuple, heat: str | None = None) -> str:
    (x, y), (w, h) = center, size
    top = y - h / 2 + PAD / 2 + LINE - 3
    texts = []
    for i, line in enumerate(lines):
        bold, font = (' font-weight="bold"', 11) if i == 0 else ("", 9.5)
        texts.append(f'<text x="{x:.1f}" y="{top + i * LINE:.1f}" text-anchor="middle" font-family="{FONT}" '
                     f'font-size="{font}"{bold}>{html.escape(line)}</text>')
    main = shown_classes(layer)[0][0] if layer.kind not in ("input", "output") else "untouched"
    tip = f"{key}: {len(layer.members)} ops; " + ", ".join(f"{c} {n}" for c, n in layer.classes.items())
    return (f'<g class="node mp-layer mp-{main}" data-kind="{layer.kind}"><title>{html.escape(key)}</title>'
            f'<desc>{html.escape(tip)}</desc>{_fill(index, layer, x, y, w, h, heat)}{"".join(texts)}</g>')


def _clip_to_box(point, center, size) -> tuple:
    """Where the segment from `center` toward `point` leaves the box."""
    (px, py), (cx, cy), (w, h) = point, center, size
    dx, dy = px - cx, py - cy
    if dx == 0 and dy == 0:
        return cx, cy
    scale = min((w / 2) / abs(dx) if dx else float("inf"), (h / 2) / abs(dy) if dy else float("inf"))
    return cx + dx * min(scale, 1.0), cy + dy * min(scale, 1.0)


def cast_text(casts, ms: float | None = None) -> str:
    """A cast mark's text: "2× f32→bf16", with the Casts' time per call in the time view."""
    from .layer_times import ms_text
    text = ", ".join(f"{n}× {_short(c)}" if n > 1 else _short(c) for c, n in casts.items())
    return text if ms is None else f"{text} {ms_text(ms)} ms"


def _edge(points: list, data: dict, a: tuple, b: tuple, cast_ms: float | None = None) -> str:
    points = list(points)
    points[0] = _clip_to_box(points[1], *a)
    points[-1] = _clip_to_box(points[-2], *b)
    d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points)
    width = 1.2 + min(data["count"] - 1, 4) * 0.5
    out = (f'<g class="edge"><path d="{d}" fill="none" stroke="#555" stroke-width="{width:.1f}" '
           'marker-end="url(#arrow)"/></g>')
    if data["casts"]:
        text = cast_text(data["casts"], cast_ms)
        (x1, y1), (x2, y2) = points[-2], points[-1]
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        w = len(text) * SMALL_CHAR + 10
        out += (f'<g class="mp-cast-mark"><title>Casts inserted on this edge: {html.escape(text)}</title>'
                f'<rect x="{mx - w / 2:.1f}" y="{my - 7:.1f}" width="{w:.1f}" height="14" rx="7" fill="#fff" '
                f'stroke="#c5221f" stroke-dasharray="3,2"/><text x="{mx:.1f}" y="{my + 3.5:.1f}" '
                f'text-anchor="middle" font-family="{FONT}" font-size="9" fill="#c5221f">{html.escape(text)}'
                '</text></g>')
    return out


def _legend(chips: list, notes: list, title: str = "") -> str:
    """The legend line (`title`, [(text, tooltip, fill)] chips, then the cast mark) and the notes under it."""
    parts, x = [], MARGIN
    if title:
        parts.append(f'<text x="{x:.1f}" y="40.5" font-family="{FONT}" font-size="9.5" font-weight="bold">'
                     f'{html.escape(title)}</text>')
        x += len(title) * SMALL_CHAR + 8
    for text, tip, fill in chips:
        w = len(text) * SMALL_CHAR + 16
        parts.append(f'<g class="legend"><title>{html.escape(tip)}</title><rect x="{x:.1f}" y="30" '
                     f'width="{w:.1f}" height="14" rx="3" fill="{fill}" stroke="#333"/><text x="{x + w / 2:.1f}" '
                     f'y="40.5" text-anchor="middle" font-family="{FONT}" font-size="9">{html.escape(text)}</text></g>')
        x += w + 6
    parts.append(f'<g class="legend mp-cast-mark"><rect x="{x:.1f}" y="30" width="70" height="14" rx="7" '
                 'fill="#fff" stroke="#c5221f" stroke-dasharray="3,2"/><text x="{:.1f}" y="40.5" '
                 'text-anchor="middle" font-family="{}" font-size="9" fill="#c5221f">casts on edge</text></g>'
                 .format(x + 35, FONT))
    for i, note in enumerate(notes):
        parts.append(f'<text x="{MARGIN}" y="{60 + 12 * i}" font-family="{FONT}" font-size="9.5" fill="#444">'
                     f'{html.escape(note)}</text>')
    return "".join(parts)


SHARED_INPUT = 3  # an input feeding this many boxes is drawn once above each of them


def split_shared_inputs(layers: dict, edges: dict) -> tuple:
    """(boxes, edges) to lay out: an input that feeds SHARED_INPUT or more boxes (BERT's padding mask, read by every
    attention layer) becomes one copy above each, instead of one box with long edges across the picture. A copy
    keeps the input's Layer (its key is the `<title>`)."""
    out_layers, out_edges = dict(layers), dict(edges)
    for key, layer in layers.items():
        targets = [b for (a, b) in edges if a == key]
        if layer.kind != "input" or len(targets) < SHARED_INPUT:
            continue
        del out_layers[key]
        for i, target in enumerate(targets):
            out_layers[f"{key}#{i}"] = layer
            out_edges[(f"{key}#{i}", target)] = out_edges.pop((key, target))
    return out_layers, out_edges


def legend_chips(graph, times=None) -> list:
    """[(text, tooltip, fill)] of the legend: the precision classes present, or the time view's heat steps."""
    if times is None:
        present = [c for c in CLASS_NAMES
                   if c != "cast" and any(layer.classes.get(c) for layer in graph.layers.values())]
        return [(LEGEND[c].split(":")[0], LEGEND[c], FILL[c]) for c in present]
    from .layer_times import ms_text
    from .palette import NO_TIME_FILL
    steps = [(f"{'≥ ' + ms_text(lo) if i == len(times.steps()) - 1 else '< ' + ms_text(hi)} ms",
              f"a layer taking {ms_text(lo)} to {ms_text(hi)} ms per call as converted", fill)
             for i, (lo, hi, fill) in enumerate(times.steps())]
    return steps + [("no time", "no op of the layer has a time in the cost table", NO_TIME_FILL)]


def time_line(times, key: str) -> str:
    """A box's time line in the time view: "1.42 → 0.78 ms · 2.1%" (float32 → as converted, share of the total),
    and " · weights 0.41" where the arithmetic on its weights done every call is a tenth of it or more."""
    from .layer_times import time_label
    from .layer_times import ms_text
    t = times.layers[key]
    share = f" · {100 * t.ms / times.total:.1f}%" if t.timed and times.total else ""
    # arithmetic on the weights done at every call, when it is a good part of the layer's time
    weights = f" · weights {ms_text(t.weights[1])}" if t.timed and t.weights[1] >= max(0.1 * t.ms, 0.01) else ""
    return time_label(t, times.complete) + share + weights


def time_lines(times, key: str) -> list:
    """A box's lines in the time view: its time line, and the fused kernels TF ran for it where there are."""
    from .layer_times import kernel_text
    ran = kernel_text(times.layers[key])
    return [time_line(times, key)] + ([_clip(ran, 48)] if ran else [])


def layer_svg(graph, title: str, notes: list, precision: str, times=None) -> tuple:
    """(SVG text, (width, height)) of a LayerGraph.

    Args:
        graph: a layer_graph.LayerGraph.
        title: the first line.
        notes: lines under the legend (what is not drawn, how it was collapsed).
        precision: "float16" or "bfloat16" (names the low precision in the boxes).
        times: a layer_times.TimeView to draw the time view, or None for the precision colors.
    """
    layers, edges = split_shared_inputs(graph.layers, graph.edges)
    lines = {k: box_lines(layer, precision) for k, layer in layers.items()}
    if times is not None:
        lines = {k: v + time_lines(times, layer.key) if layer.kind not in ("input", "output") else v
                 for (k, v), layer in zip(lines.items(), layers.values())}
    sizes = {k: box_size(v) for k, v in lines.items()}
    placed = lay_out(sizes, list(edges))
    top = HEADER + 12 * max(len(notes) - 1, 0)
    width = max(placed.width + 2 * MARGIN, 700.0)
    height = placed.height + top + 2 * MARGIN
    centers = {k: (x + MARGIN, y + top) for k, (x, y) in placed.centers.items()}
    drawn = "".join(_edge([(x + MARGIN, y + top) for x, y in placed.paths[key]], data,
                          (centers[key[0]], sizes[key[0]]), (centers[key[1]], sizes[key[1]]),
                          None if times is None else times.edges.get(_original(key), 0.0))
                    for key, data in edges.items() if key in placed.paths)
    boxes = "".join(_box(i, layer.key, layer, lines[k], centers[k], sizes[k],
                         None if times is None or layer.kind in ("input", "output") else times.fill(layer.key))
                    for i, (k, layer) in enumerate(layers.items()))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" class="mp-layers"><title>{html.escape(title)}</title>'
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>'
           '<rect width="100%" height="100%" fill="white"/>'
           f'<text x="{MARGIN}" y="20" font-family="{FONT}" font-size="13" font-weight="bold">{html.escape(title)}'
           f'</text>{_legend(legend_chips(graph, times), notes, LEGEND_TITLE if times else "")}'
           f'<g class="graph">{drawn}{boxes}</g></svg>')
    return svg, (width, height)


def _original(pair: tuple) -> tuple:
    """The LayerGraph edge of a drawn edge (a shared input's copy "key#2" stands for "key")."""
    return tuple(key.split("#", 1)[0] if "#" in key else key for key in pair)
