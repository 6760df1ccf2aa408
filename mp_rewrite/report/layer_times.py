"""The time view of the whole-model picture: each layer's time per call in float32 and as converted, from the cost
table the precision assignment read (analysis.graph_profile: every candidate op timed in the model as it runs, in
float32 and in Grappler's coloring; or the op table, ops timed alone), and the inserted Casts priced per tensor as
the assignment prices them (this machine's cast times by size).

Rendered, never decided: a node counts in the precision its row says it computes in (the cut's or the lists'
choice), a Cast where the rewrite put it. A node TF fused into another kernel has no time of its own (the kernel's
carrier has it); an op the lists keep in float32 in both variants was never a candidate, so the table has no time
for it: those are counted as untimed, not guessed.
"""

from __future__ import annotations

import dataclasses

from .layer_graph import callee_ops, called_functions
from .palette import heat_fill, heat_steps

TOP = 10  # the slowest layers listed above the picture


@dataclasses.dataclass(frozen=True)
class LayerTime:
    """One box's time per call.

    Attributes:
        fp32: ms in float32 (the model as it was: no Casts).
        ms: ms as converted (each op in the precision it computes in, the Casts inside it or on its weights).
        timed: float ops with a time in the table; untimed: float ops without one (see the module doc).
        low: ops computing in low precision; ops: ops counted (the box's and those of the functions it calls).
    """

    fp32: float
    ms: float
    timed: int
    untimed: int
    low: int
    ops: int


@dataclasses.dataclass(frozen=True)
class TimeView:
    """The times of one LayerGraph.

    Attributes:
        precision: the low precision.
        layers: box key -> LayerTime (boxes with nothing timed included, at 0 ms).
        edges: (box, box) -> ms of the Casts inserted on that edge (a Cast read by two boxes is on both).
        edge_casts: ms of the Casts on edges, each counted once (none of them is inside a box).
        undrawn: (float32 ms, ms) of the timed nodes no box holds: arithmetic on weights alone (a BatchNorm's
            scale from its variables, computed every call) and Casts no drawn edge carries.
        total_fp32, total: per call, float32 and as converted: the sum of the layers, edge_casts and undrawn.
        measured: {"float32": ms, "converted": ms, "how": phrase} of whole runs, or {} (see measured_totals).
        source: where the times come from (the cost table's note).
        nodes: graph name -> node -> (float32 ms, ms as converted), for explain and the node table.
    """

    precision: str
    layers: dict
    edges: dict
    edge_casts: float
    undrawn: tuple
    total_fp32: float
    total: float
    measured: dict
    source: str
    nodes: dict

    def slowest(self, n: int = TOP) -> list:
        """The `n` slowest boxes as converted, [(key, LayerTime)], slowest first (ties: float32 time)."""
        timed = [(k, t) for k, t in self.layers.items() if t.timed]
        return sorted(timed, key=lambda kt: (-kt[1].ms, -kt[1].fp32, kt[0]))[:n]

    @property
    def top_ms(self) -> float:
        """The slowest box's time as converted (the top of the heat scale)."""
        return max((t.ms for t in self.layers.values()), default=0.0) or 1e-9

    def fill(self, key: str) -> str:
        """The heat fill of one box."""
        t = self.layers.get(key)
        return heat_fill(t.ms if t is not None and t.timed else None, self.top_ms)

    def steps(self) -> list:
        """The heat scale's steps [(from ms, to ms, fill)]."""
        return heat_steps(self.top_ms)


def ms_text(ms: float) -> str:
    """A time per call as a person reads it: 3 significant digits at most, µs below 0.01 ms."""
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 0.1:
        return f"{ms:.2f}"
    return f"{ms:.3f}" if ms >= 0.001 else "<0.001"


def time_label(t: LayerTime) -> str:
    """A box's time line, "1.42 → 0.78 ms" (float32 → as converted), or why it has none."""
    if not t.timed:
        ops = f"{t.untimed} f32 op{'s' if t.untimed > 1 else ''}"
        return f"not timed ({ops}, never a candidate)" if t.untimed else "no time of its own"
    return f"{ms_text(t.fp32)} → {ms_text(t.ms)} ms"


def node_times(tables, costs) -> dict:
    """{graph name: {node: (float32 ms, ms as converted)}} of the nodes the cost table times and the inserted Casts
    (a Cast costs nothing in float32, where it does not exist).

    Args:
        tables: node_table.build_tables(result).
        costs: the core.assignment.CostTable the rewrite read (or one measured for it).
    """
    from ..analysis.graph_costs import MAIN
    from ..core.assignment import DEFAULT_CAST_MS
    out = {}
    for table in tables:
        label = table.name or MAIN
        timed, priced = costs.nodes.get(label, {}), costs.casts.get(label, {})
        times = out[table.name] = {}
        for name, row in table.rows.items():
            if row.cast is not None:
                to_low, to_fp32 = priced.get((row.cast.src, row.cast.src_port), (DEFAULT_CAST_MS,) * 2)
                times[name] = (0.0, to_low if row.cast.to_low else to_fp32)
            elif name in timed:
                fp32, low = timed[name]
                times[name] = (fp32, low if row.node_class == "allow" else fp32)
    return out


def _ops_of(graph, tables: dict, calls: dict, key: str) -> list:
    """The NodeRows a box computes: its members and the ops of the functions they call (an LSTM's loop body);
    `calls` maps a member to the functions it calls."""
    rows, memo, out = graph.table.rows, {}, []
    for name in graph.layers[key].members:
        out.append(rows[name])
        for function in calls.get(name, ()):
            out += callee_ops(function, tables, frozenset({graph.table.name}), memo)
    return out


def _layer_time(graph, tables: dict, calls: dict, times: dict, key: str) -> LayerTime:
    fp32 = ms = 0.0
    timed = untimed = low = 0
    ops = _ops_of(graph, tables, calls, key)
    for row in ops:
        t = times.get(row.graph, {}).get(row.name)
        if t is not None:
            fp32, ms, timed = fp32 + t[0], ms + t[1], timed + 1
        elif row.node_class not in ("untouched", "cast"):
            untimed += 1
        low += row.node_class == "allow"
    own = times.get(graph.table.name, {})
    ms += sum(own.get(c, (0.0, 0.0))[1] for c in graph.layers[key].cast_nodes)
    return LayerTime(fp32, ms, timed, untimed, low, len(ops))


def time_view(graph, tables, costs, result) -> TimeView:
    """The TimeView of a LayerGraph (whole_model.layer_picture).

    Args:
        graph: the LayerGraph.
        tables: node_table.build_tables(result) (the functions a box calls are looked up in them).
        costs: the CostTable the rewrite read (or one measured for it).
        result: the RewriteResult (which variant the measured whole runs stand for).
    """
    times = node_times(tables, costs)
    by_name = {t.name: t for t in tables}
    calls = {n.name: called_functions(n) for n in graph.table.result.graph_def.node if n.name in graph.box_of}
    layers = {key: _layer_time(graph, by_name, calls, times, key) for key in graph.layers}
    own = times.get(graph.table.name, {})
    inside = set().union(*(layer.cast_nodes for layer in graph.layers.values()))
    edges, on_edges = {}, set()
    for pair, data in graph.edges.items():
        names = data["cast_nodes"] - inside
        on_edges |= names
        if names:
            edges[pair] = sum(own.get(c, (0.0, 0.0))[1] for c in names)
    edge_casts = sum(own.get(c, (0.0, 0.0))[1] for c in on_edges)
    counted = set(graph.box_of) | inside | on_edges
    undrawn = tuple(sum(t[i] for name, t in own.items() if name not in counted) for i in (0, 1))
    total_fp32 = sum(t.fp32 for t in layers.values()) + undrawn[0]
    total = sum(t.ms for t in layers.values()) + edge_casts + undrawn[1]
    return TimeView(result.precision, layers, edges, edge_casts, undrawn, total_fp32, total,
                    measured_totals(costs, result), costs.note, times)


def measured_totals(costs, result) -> dict:
    """The whole model's measured time per run, float32 and as converted, when the table was profiled in the model
    ({} otherwise): the untimed runs that checked the cut when there were any, else the traced ones. "As converted"
    is the variant the result is: the cut's when it demoted something (unless the run kept the lists or float32),
    else Grappler's lists."""
    from ..analysis.graph_profile import measured_runs
    runs = measured_runs(costs)
    demoted = any(r.assignment is not None and r.assignment.demoted for r in (result, *result.functions.values()))
    variant = costs.keep or ("cut" if demoted else "lists")
    if "raced" in runs:
        fp32, lists, cut = runs["raced"]
        converted = {"float32": fp32, "lists": lists, "cut": cut}[variant]
        return {"float32": fp32, "converted": converted, "how": "whole runs, untraced"}
    if "traced" in runs:
        fp32, lists = runs["traced"]
        return {"float32": fp32, "converted": fp32 if variant == "float32" else lists,
                "how": "whole runs with step stats on (slower than untraced)"}
    return {}


def has_times(costs) -> bool:
    """Whether a cost table (or None) holds times to show: a machine without low-precision units measures none."""
    return costs is not None and costs.low_units
