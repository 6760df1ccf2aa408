"""The time view of the whole-model picture: each layer's time per call in float32 and as converted.

Where the cost table was measured in the model (analysis.graph_profile) it carries what the runs measured
(analysis.run_times.RunTimes): every executed node's time, counted once (each instant of a run goes to the kernel
running longest then), in float32 and in Grappler's coloring, the kernels TF ran, and the whole runs untraced. A
layer's time is its nodes' times and the arithmetic on its weights done every call; the total adds the Casts on
edges, the nodes no box holds or reads, and what ran elsewhere (other graphs, and TF's own nodes: function-call
plumbing, Grappler's additions), so it accounts for the whole run and can be held against the measured one.

Which run each node's time comes from is report.node_times's.
A table without runs (the op table, a cost file: ops timed alone) times the candidates only; the rest is counted
as untimed, not guessed.
"""

from __future__ import annotations

import dataclasses

from .layer_graph import callee_ops, called_functions, computes_in_float
from .node_times import converted_variant, demoted_nodes, drawn_runs, lists_run_time, measured_totals, node_times
from .time_owners import fused_homes, weight_owners
from .palette import heat_fill, heat_steps

TOP = 10  # the slowest layers listed above the picture


@dataclasses.dataclass(frozen=True)
class LayerTime:
    """One box's time per call.

    Attributes:
        fp32: ms in float32 (the model as it was: no Casts).
        ms: ms as converted (each op in the precision it computes in, the Casts inside it or on its weights).
        timed: ops with a time; untimed: ops without one (see the module doc: fused or folded by TF where the runs
            timed every op, else ops that were never a candidate).
        low: ops computing in low precision; ops: ops counted (the box's and those of the functions it calls).
        kernels: (kernel, count) of the fused kernels TF ran for its ops, as converted ("_MklNativeFusedConv2D:
            BiasAdd+Relu6"), most frequent first; a kernel is the box's where the op it starts from is (fused_homes).
        fused_into: the label of the box whose fused kernel ran this box's ops, when that is one other box (a
            Relu6 layer after a convolution, a frozen BatchNorm's bias add), else "".
        weights: (float32 ms, ms) of the arithmetic on its weights done every call (included in fp32 and ms): a
            BatchNorm folded into a filter in place scales the filter at each call (weight_owners).
    """

    fp32: float
    ms: float
    timed: int
    untimed: int
    low: int
    ops: int
    kernels: tuple = ()
    fused_into: str = ""
    weights: tuple = (0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class TimeView:
    """The times of one LayerGraph.

    Attributes:
        precision: the low precision.
        layers: box key -> LayerTime (boxes with nothing timed included, at 0 ms).
        edges: (box, box) -> ms of the Casts inserted on that edge (a Cast read by two boxes is on both).
        edge_casts: ms of the Casts on edges, each counted once (none of them is inside a box).
        undrawn: (float32 ms, ms) of the timed nodes of the drawn graph no box holds or reads (arithmetic on
            weights a box reads, done every call, is in that box: LayerTime.weights), Casts no drawn edge carries.
        elsewhere: (float32 ms, ms) of what ran outside the drawn graph: the other graphs' nodes no box counts, and
            TF's own nodes (run_times.RunTimes.elsewhere); (0, 0) without runs.
        total_fp32, total: per call, float32 and as converted: the sum of the layers, edge_casts, undrawn,
            elsewhere and between.
        measured: {"float32": ms, "converted": ms, "how": phrase} of whole runs, or {} (see measured_totals).
        source: where the times come from (the cost table's note).
        nodes: graph name -> node -> (float32 ms, ms as converted), for explain and the node table.
        complete: every executed op is timed (the table has runs), not only the candidates.
        kernels: (graph name, node) -> the fused kernel TF ran for it as converted, for the boxes' ops.
        between: (float32 ms, ms) per call while no kernel ran, between the run's first kernel and its last: TF's
            executor scheduling the next (run_times.RunTimes.between); (0, 0) without runs.
    """

    precision: str
    layers: dict
    edges: dict
    edge_casts: float
    undrawn: tuple
    elsewhere: tuple
    total_fp32: float
    total: float
    measured: dict
    source: str
    nodes: dict
    complete: bool = False
    kernels: dict = dataclasses.field(default_factory=dict)
    between: tuple = (0.0, 0.0)

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


def time_label(t: LayerTime, complete: bool = False) -> str:
    """A box's time line, "1.42 → 0.78 ms" (float32 → as converted), or why it has none."""
    if not t.timed:
        plural = "s" if t.untimed > 1 else ""
        if not t.untimed:
            return "no time of its own"
        if complete and t.fused_into:
            return f"ran in {t.fused_into}'s kernel"
        if complete:
            return f"no kernel of its own ({t.untimed} op{plural} fused or folded by TF)"
        return f"not timed ({t.untimed} f32 op{plural}, never a candidate)"
    return f"{ms_text(t.fp32)} → {ms_text(t.ms)} ms"


def kernel_text(t: LayerTime, limit: int = 2) -> str:
    """The fused kernels a box ran, "ran _MklNativeFusedConv2D: BiasAdd+Relu6" ("" when none)."""
    if not t.kernels:
        return ""
    shown = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in t.kernels[:limit])
    return "ran " + shown + (f" +{len(t.kernels) - limit}" if len(t.kernels) > limit else "")


def _ops_of(graph, tables: dict, calls: dict, key: str) -> list:
    """The NodeRows a box computes: its members and the ops of the functions they call (an LSTM's loop body);
    `calls` maps a member to the functions it calls."""
    rows, memo, out = graph.table.rows, {}, []
    for name in graph.layers[key].members:
        out.append(rows[name])
        for function in calls.get(name, ()):
            out += callee_ops(function, tables, frozenset({graph.table.name}), memo)
    return out


def _layer_time(graph, tables: dict, calls: dict, times: dict, key: str, kernel, ran: dict, owners: dict,
                homes: list) -> tuple:
    """(LayerTime, the (graph, node) pairs it counted); `kernel(row)` names the fused kernel a row ran as
    converted, or "", written into `ran` by (graph, node); `owners` (weight_owners) gives it the arithmetic on its
    weights; `homes`, per column of the times (float32, as converted), fused_homes' (homes, within): a fused
    kernel's time and name move from the box of the node TF named it after to the box of the op it starts from."""
    import collections
    ops = _ops_of(graph, tables, calls, key)
    rows, name, members = graph.table.rows, graph.table.name, graph.layers[key].members
    unique = list({(row.graph, row.name): row for row in ops}.values())
    total, into, timed, kernels = [0.0, 0.0], set(), set(), collections.Counter()
    for column, (moved, within) in enumerate(homes):
        away = {n for n in members if moved.get(n, key) != key}
        arrived = [rows[n] for n, home in moved.items() if home == key and graph.box_of[n] != key]
        for row in unique + arrived:
            t = times.get(row.graph, {}).get(row.name)
            if t is not None and not (row.graph == name and row.name in away):
                total[column] += t[column]
                timed.add((row.graph, row.name))
                if column and kernel(row):
                    kernels[kernel(row)] += 1
        into |= {graph.layers[moved[n]].label for n in away}
        into |= {graph.layers[within[n]].label for n in members if within.get(n, key) != key}
    ran.update(((row.graph, row.name), kernel(row)) for row in unique if kernel(row))
    untimed = sum(1 for row in unique if (row.graph, row.name) not in timed and row.node_class != "cast"
                  and (row.node_class != "untouched" or computes_in_float(row)))
    own = times.get(name, {})
    total[1] += sum(own.get(c, (0.0, 0.0))[1] for c in graph.layers[key].cast_nodes)
    mine = [n for n, box in owners.items() if box == key]
    weights = tuple(sum(own.get(n, (0.0, 0.0))[i] for n in mine) for i in (0, 1))
    counted = {(row.graph, row.name) for row in unique} | {(name, n) for n in [*graph.layers[key].cast_nodes, *mine]}
    low = sum(row.node_class == "allow" for row in ops)
    return LayerTime(total[0] + weights[0], total[1] + weights[1], len(timed), untimed, low, len(ops),
                     tuple(kernels.most_common()), into.pop() if len(into) == 1 else "", weights), counted


def time_view(graph, tables, costs, result) -> TimeView:
    """The TimeView of a LayerGraph (whole_model.layer_picture).

    Args:
        graph: the LayerGraph.
        tables: node_table.build_tables(result) (the functions a box calls are looked up in them).
        costs: the CostTable the rewrite read (or one measured for it).
        result: the RewriteResult (which variant the measured whole runs stand for).
    """
    variant, demoted = converted_variant(costs, result), demoted_nodes(result)
    times = node_times(tables, costs, variant, demoted)
    runs, variant = drawn_runs(costs, variant)
    by_name = {t.name: t for t in tables}
    calls = {n.name: called_functions(n) for n in graph.table.result.graph_def.node if n.name in graph.box_of}
    kernel, float32_kernel = _kernel_of(runs, variant, demoted), _kernel_of(runs, "float32", {})
    owners = weight_owners(graph)
    homes = [fused_homes(graph, times, float32_kernel, 0), fused_homes(graph, times, kernel, 1)]
    layers, counted, ran = {}, set(), {}
    for key in graph.layers:
        layers[key], pairs = _layer_time(graph, by_name, calls, times, key, kernel, ran, owners, homes)
        counted |= pairs
    own = times.get(graph.table.name, {})
    inside = set().union(*(layer.cast_nodes for layer in graph.layers.values()))
    edges, on_edges = {}, set()
    for pair, data in graph.edges.items():
        names = data["cast_nodes"] - inside
        on_edges |= names
        if names:
            edges[pair] = sum(own.get(c, (0.0, 0.0))[1] for c in names)
    edge_casts = sum(own.get(c, (0.0, 0.0))[1] for c in on_edges)
    drawn = set(graph.box_of) | inside | on_edges | set(owners)
    undrawn = tuple(sum(t[i] for name, t in own.items() if name not in drawn) for i in (0, 1))
    counted |= {(graph.table.name, name) for name in own}
    elsewhere = _elsewhere(times, runs, variant, counted, graph.table.name)
    between = _between(runs, variant, graph.table.name)
    total_fp32 = sum(t.fp32 for t in layers.values()) + undrawn[0] + elsewhere[0] + between[0]
    total = sum(t.ms for t in layers.values()) + edge_casts + undrawn[1] + elsewhere[1] + between[1]
    return TimeView(result.precision, layers, edges, edge_casts, undrawn, elsewhere, total_fp32, total,
                    measured_totals(costs, result, graph.table.name), costs.note, times, runs is not None, ran,
                    between)


def _between(runs, variant: str, drawn: str) -> tuple:
    """(float32 ms, ms) per call of the drawn graph while no kernel ran (run_times.RunTimes.between): the second
    run's for the lists' coloring and the cut's (its own run's, or the lists', whose kernels are nearly all its
    kernels: drawn_runs), else float32's."""
    from ..analysis.graph_costs import MAIN
    if runs is None:
        return (0.0, 0.0)
    per = max(1, runs.calls.get(drawn or MAIN, 1))
    return runs.between[0] / per, runs.between[1 if variant in ("lists", "cut") else 0] / per


def _kernel_of(runs, variant: str, demoted: dict):
    """row -> the fused kernel TF ran under its name in the run its time as `variant` comes from (lists_run_time;
    "" when none, or without runs)."""
    from ..analysis.graph_costs import MAIN
    if runs is None or not runs.kernels:
        return lambda row: ""
    return lambda row: runs.kernel(row.graph or MAIN, row.name, lists_run_time(row, variant, demoted, True))


def _elsewhere(times: dict, runs, variant: str, counted: set, drawn: str) -> tuple:
    """(float32 ms, ms) per call of the drawn graph (`drawn`) of what ran and no box, edge or undrawn line counts:
    the other graphs' timed nodes (in the precision their rows say; a graph without rows, as the variant ran it)
    and TF's own nodes. A run that called the drawn graph n times (a Keras export's two signatures) ran TF's own
    nodes and a graph it ran once (the signatures' wrappers) once for the n calls: 1/n of them is one call's.
    TF's own nodes as converted are the lists' run's for the lists' coloring, else float32's: the lists' run's
    hold the Casts Grappler moved and renamed, which the cut's coloring prices per tensor (node_times)."""
    from ..analysis.graph_costs import MAIN
    if runs is None:
        return (0.0, 0.0)
    per = max(1, runs.calls.get(drawn or MAIN, 1))

    def share(label: str) -> float:  # one call's share of a graph's time per call site
        return runs.calls.get(label or MAIN, 1) / per
    fp32 = runs.elsewhere[0] / per
    ms = (runs.elsewhere[1] if variant == "lists" else runs.elsewhere[0]) / per
    for graph, nodes in times.items():
        for name, t in nodes.items():
            if (graph, name) not in counted:
                fp32, ms = fp32 + t[0] * share(graph), ms + t[1] * share(graph)
    for label, nodes in runs.nodes.items():
        graph = "" if label == MAIN else label
        if graph in times:
            continue
        for a, b in nodes.values():
            fp32, ms = fp32 + a * share(label), ms + (b if variant == "lists" else a) * share(label)
    return fp32, ms
