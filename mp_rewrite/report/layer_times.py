"""The time view of the whole-model picture: each layer's time per call in float32 and as converted.

Where the cost table was measured in the model (analysis.graph_profile) it carries what the runs measured
(analysis.run_times.RunTimes): every executed node's time, counted once (each instant of a run goes to the kernel
running longest then), in float32 and in Grappler's coloring, the kernels TF ran, and the whole runs untraced. A
layer's time is its nodes' times and the arithmetic on its weights done every call; the total adds the Casts on
edges, the nodes no box holds or reads, and what ran elsewhere (other graphs, and TF's own nodes: function-call
plumbing, Grappler's additions), so it accounts for the whole run and can be held against the measured one.

Rendered, never decided: a node counts in the precision its row says it computes in (the cut's or the lists'
choice). With runs, the time as converted comes from one run as far as it can: the lists' coloring is all of the
lists' run; a cut the profile kept is all of its own traced run (RunTimes.cut, drawn_runs); a cut without one is
the lists' run -- it is the lists' graph but for the nodes it moved to float32 -- with those nodes at their float32
run's time (lists_run_time), which misses what its own Casts and split fusions cost (its sum fell ~20% short of its
run on MobileNetV2 and BERT). A node's time counted once depends on which kernels ran
beside it in that run (MobileNetV2's filter scaling at each call, float32 in both runs, read 1.0 ms more in the
float32 run than in the lists'), so a sum taking each float32 node from the float32 run and each low one from the
lists' run counted the instants they shared twice (docs/pictures.md has the measured gaps). A Cast the result
inserted is priced as it ran in the lists' run when that run had it (the same name: the same tensor, the same
way), else per tensor as the assignment prices it (this machine's cast times by size, timed alone: 1.2-1.8x what
the same Casts took in the model). A node TF fused into another kernel, or folded away, ran no kernel of its own:
the kernel that ran it has the time, in the box of the op the kernel starts from (a convolution's, not the
activation's TF names it after: time_owners).
A table without runs (the op table, a cost file: ops timed alone) times the candidates only; the rest is counted
as untimed, not guessed.
"""

from __future__ import annotations

import dataclasses

from .layer_graph import callee_ops, called_functions, computes_in_float
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


def converted_variant(costs, result) -> str:
    """Which measured variant the result is: "float32" or "lists" when the run kept that coloring ("float32" too
    for the model as given, kept without the rules: its float32 run is the nearest measured), "cut" when the cut
    demoted something, else "lists"."""
    from ..core.assignment import SOURCE
    demoted = any(r.assignment is not None and r.assignment.demoted for r in (result, *result.functions.values()))
    keep = getattr(costs, "keep", "")
    return "float32" if keep == SOURCE else keep or ("cut" if demoted else "lists")


def demoted_nodes(result) -> dict:
    """{graph name: frozenset of nodes}: the nodes the cut moved to float32 from the lists' coloring, per graph
    ("" the main graph)."""
    return {name: frozenset(sub.assignment.demoted) for name, sub in (("", result), *result.functions.items())
            if sub.assignment is not None}


def drawn_runs(costs, variant: str) -> tuple:
    """(the run_times.RunTimes a coloring's times come from, or None; the variant as that RunTimes holds it): the
    cut's own traced runs where the profile made them (RunTimes.cut: float32 and the cut, the cut in the column the
    lists' run holds otherwise, so it reads as "lists" there), else the table's runs as they are."""
    runs = getattr(costs, "runs", None)
    if variant == "cut" and runs is not None and runs.cut is not None:
        return runs.cut, "lists"
    return runs, variant


def lists_run_time(row, variant: str, demoted: dict, profiled: bool) -> bool:
    """Whether a row's time as converted is its time in the lists' run (else in float32's).

    Args:
        row: a node_table.NodeRow of the result.
        variant: converted_variant(costs, result).
        demoted: demoted_nodes(result).
        profiled: the table has runs (run_times.RunTimes); without them (ops timed alone) a row's precision alone
            decides.
    """
    if not profiled:
        return row.node_class == "allow"
    if variant == "cut":  # the lists' graph but for what the cut moved to float32
        return row.name not in demoted.get(row.graph, ())
    return variant == "lists"


def node_times(tables, costs, variant: str = "lists", demoted: dict | None = None) -> dict:
    """{graph name: {node: (float32 ms, ms as converted)}} of the nodes with a time and the inserted Casts (a Cast
    costs nothing in float32, where it does not exist).

    Args:
        tables: node_table.build_tables(result).
        costs: the core.assignment.CostTable the rewrite read (or one measured for it).
        variant: converted_variant(costs, result).
        demoted: demoted_nodes(result) (needed for the cut's coloring).
    """
    from ..analysis.graph_costs import MAIN
    from ..core.assignment import DEFAULT_CAST_MS
    (runs, variant), demoted = drawn_runs(costs, variant), demoted or {}
    out = {}
    for table in tables:
        label = table.name or MAIN
        timed = costs.nodes.get(label, {}) if runs is None else runs.nodes.get(label, {})
        priced = costs.casts.get(label, {})
        times = out[table.name] = {}
        for name, row in table.rows.items():
            if row.cast is not None:
                if runs is not None and variant != "float32" and name in timed:
                    times[name] = (0.0, timed[name][1])  # a Cast the lists' run ran, as it ran there
                elif runs is None or variant != "lists":
                    to_low, to_fp32 = priced.get((row.cast.src, row.cast.src_port), (DEFAULT_CAST_MS,) * 2)
                    times[name] = (0.0, to_low if row.cast.to_low else to_fp32)
                # else a Cast the lists' own run did not run under its name: TF folded it, or Grappler moved and
                # renamed it (its time is then with TF's own nodes, `elsewhere`): priced, it was counted twice
            elif name in timed:
                fp32, low = timed[name]
                times[name] = (fp32, low if lists_run_time(row, variant, demoted, runs is not None) else fp32)
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


def measured_totals(costs, result, graph_name: str = "") -> dict:
    """The whole model's measured time per call, float32 and as converted, when the table was profiled in the model
    ({} otherwise): the untraced runs made beside the traced ones the nodes' times come from (the cut's own, where
    the profile traced it: drawn_runs), and for a cut without runs of its own its ratio to the lists' in the runs
    that raced it. "As converted" is the variant the result is (converted_variant). A run that called the drawn
    graph n times (every signature of a Keras export calls the model) counts as n calls."""
    from ..analysis.graph_costs import MAIN
    from ..analysis.graph_profile import measured_runs
    drawn, variant = drawn_runs(costs, converted_variant(costs, result))
    runs = measured_runs(costs)
    calls = max(1, costs.runs.calls.get(graph_name or MAIN, 1)) if runs else 1
    per = f", {calls} calls of the model each (one per signature): per call" if calls > 1 else ""
    if "untraced" not in runs:
        return {}
    fp32, lists = (ms / calls for ms in drawn.untraced)
    raced = runs.get("raced", (0.0, 0.0, 0.0))
    if variant == "cut":
        # The cut's graph ran only in the race, whose medians a busy machine puts far above the fastest runs the
        # layers add up to (MobileNetV2 at load 4: float32 31.5 ms raced, 12.7 ms at its fastest): the cut's time
        # is its ratio there, measured side by side, to the run its layers' times come from (the lists', but for
        # the nodes it demoted: node_times), times that run's fastest -- float32's where the lists' failed.
        for base, name, ms in ((1, "the lists'", lists), (0, "float32's", fp32)):
            if 0 < raced[base] < float("inf"):
                ratio = raced[2] / raced[base]
                return {"float32": fp32, "converted": ms * ratio,
                        "how": f"fastest whole runs untraced; as converted, {name} times the cut's ratio to it in "
                               f"the race ({ratio:.2f}, medians of alternated runs){per}"}
    mine = " (the cut's own runs)" if drawn is not costs.runs else ""
    return {"float32": fp32, "converted": fp32 if variant == "float32" else lists,
            "how": f"fastest whole runs, untraced{mine}{per}"}


def explained_times(tables, costs, result) -> dict | None:
    """node_times for explain and the node table, or None when the table has no times to show."""
    if not has_times(costs):
        return None
    return node_times(tables, costs, converted_variant(costs, result), demoted_nodes(result))


def has_times(costs) -> bool:
    """Whether a cost table (or None) holds times to show: a machine without low-precision units measures none."""
    return costs is not None and costs.low_units
