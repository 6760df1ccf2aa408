"""Each node's time per call, in float32 and as converted, from the runs the cost table measured, and which run a
coloring's times come from (report.layer_times adds them up per layer; explain and the node table show them).

Rendered, never decided: a node counts in the precision its row says it computes in (the cut's or the lists'
choice). With runs, the time as converted comes from one run as far as it can: the lists' coloring is all of the
lists' run; a cut the profile traced (where it is a graph of its own) is all of its own run (RunTimes.cut,
drawn_runs); a cut without one (a TF1 export's) is the lists' run -- it is the lists' graph but for the
nodes it moved to float32 -- with those nodes at their float32 run's time (lists_run_time), which misses what its
own Casts and split fusions cost (its sum fell ~20% short of its run on MobileNetV2 and BERT). A node's time
counted once depends on which kernels ran beside it in that run (MobileNetV2's filter scaling at each call,
float32 in both runs, read 1.0 ms more in the float32 run than in the lists'), so a sum taking each float32 node
from the float32 run and each low one from the lists' run counted the instants they shared twice
(docs/pictures.md has the measured gaps). A Cast the result inserted is priced as it ran in the lists' run when
that run had it (the same name: the same tensor, the same way), else per tensor as the assignment prices it (this
machine's cast times by size, timed alone: 1.2-1.8x what the same Casts took in the model). A node TF fused into
another kernel, or folded away, ran no kernel of its own: the kernel that ran it has the time (report.layer_times
puts it in the box of the op the kernel starts from).
"""

from __future__ import annotations


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
