"""The accuracy guard: convert, check against float32 on calibration inputs, and when the outputs miss the
tolerance keep the few nodes that must stay float32 -- found by measurement, not by blind bisection.

1. Screen (the float32 run, which also gives the reference outputs): fetch every tensor the plain rewrite holds in
   low precision; a node producing or reading one that overflows the low precision (or lives below its normal
   range where that matters) must stay float32.
2. Check the plain rewrite (run 2). If it meets the tolerance it is returned untouched: 2 executions.
3. Attribute (one side-by-side run): the float32 graph, the rewrite with the screen's keeps, and per unit
   (an allow-list node and the clear/infer nodes that follow it) a copy where only that unit is low precision;
   this ranks the units by the output error each adds alone.
4. Search: keep the worst units (as keep_fp32 seeds, so deny propagation stays consistent) where the attribution
   predicts the tolerance is met, then bisect the prefix, then drop kept units with the most FLOPs that turn out
   not to be needed. Every keep set is checked by one cached run. Without attribution (v1 control flow) the
   search falls back to halving the candidate list.

The result (guard_result) says which nodes were kept and why, with the output error before and after, and the
number of graph executions; `save_overrides` writes the keep set so it can be re-applied with `load_overrides`.
Modules: guard_screen (structure, screen, units), guard_attribution (side-by-side runs), guard_search (errors, runs,
search), guard_result (results, overrides file), guard_saved_model (SavedModel front end).
"""

from __future__ import annotations

import dataclasses
import math
import time

from ..errors import OptionError
from .attribution import (UnitError, attribute, function_units, isolate, measure_alone, node_flops, unit_flops,
                                with_shares)
from .result import (PREFIX, Analysis, GuardColoring, GuardResult, KeptNode, load_override_reasons,
                           load_overrides)
from .screen import Finding, GraphInfo, output_tensors, range_findings, screen_targets
from .search import Attempt, Checker, OutputError, Runner, prune, search_blind, search_ranked
from ..core.body import RewriteResult
from ..core.rewrite import rewrite_graph_def
from ..analysis.compare import DEFAULT_TOLERANCES, default_tolerance

REWRITE_OPTIONS = ("device", "lists", "keep_fp32", "force_low", "preserve", "level", "functions")


def exact_patterns(nodes, all_names) -> dict:
    """name -> a keep_fp32 pattern matching that node only, readable and editable: the name itself where it is no
    name scope and has no glob character, else "=name" (a plain name also matches its scope: "dense/Tensordot"
    matches "dense/Tensordot/MatMul"; "=dense/Tensordot" does not)."""
    scopes = {name[:i] for name in all_names for i, c in enumerate(name) if c == "/"}
    return {name: name if name not in scopes and not any(c in name for c in "*?[=") else f"={name}"
            for name in nodes}


# --------------------------------------------------------------------------------------------- the guard


def guard(graph_def, fetches, feeds, precision: str = "float16", rtol: float | None = None,
          atol: float | None = None, *, underflow_share: float | None = 0.5, max_executions: int = 16,
          granularity: str = "auto", max_side_by_side_nodes: int = 50_000, **rewrite_options) -> GuardResult:
    """Convert `graph_def` to mixed precision, keeping float32 only the few nodes its outputs need.

    Args:
        graph_def: a self-contained float32 GraphDef (runnable by execution.run_graph_def); never modified.
        fetches: the output node or tensor names (they are preserved, as in rewrite_graph_def).
        feeds: calibration inputs, placeholder name -> array (one batch; stack samples along the batch axis).
        precision: "float16" or "bfloat16".
        rtol, atol: the np.allclose tolerance every output must meet against float32; None takes the precision's
            default (analysis.compare.DEFAULT_TOLERANCES, the same as `mp-rewrite verify`).
        underflow_share: the screen's underflow rule (see guard_screen.range_findings); None turns it off.
        max_executions: the most graph executions the search may use; when they run out it keeps more rather than
            less. The result is always measured (the final check may add one run beyond the budget).
        granularity: what attribution isolates: "unit" (an allow-list node and the nodes that follow it),
            "region" (connected low-precision regions, refined to units once the search has kept some), or
            "auto" (units, unless their copies would exceed ten times the graph and regions are much cheaper).
        max_side_by_side_nodes: the most nodes the attribution copies may add (regions beyond it for units; a
            blind search beyond it for regions).
        **rewrite_options: as for rewrite_graph_def (device, lists, keep_fp32, force_low, preserve, level,
            functions); the caller's keep_fp32 patterns are applied in every rewrite.

    Returns:
        A GuardResult.

    Raises:
        OptionError: a bad option; GraphError/ExecutionError: the graph cannot be rewritten or run.
    """
    start = time.perf_counter()
    unknown = sorted(set(rewrite_options) - set(REWRITE_OPTIONS))
    if unknown:
        raise OptionError(f"guard: unknown option {unknown[0]!r}; rewrite options are {', '.join(REWRITE_OPTIONS)}")
    if granularity not in ("auto", "unit", "region"):
        raise OptionError(f"guard: unknown granularity {granularity!r}: use 'auto', 'unit' or 'region'")
    default_rtol, default_atol = default_tolerance(precision)
    rtol, atol = default_rtol if rtol is None else rtol, default_atol if atol is None else atol
    user_keep = rewrite_options.pop("keep_fp32", ()) or ()
    user_keep = (user_keep,) if isinstance(user_keep, str) else tuple(user_keep)
    rewrite = keep_set_rewriter(graph_def, precision, fetches, user_keep, rewrite_options)
    plain = rewrite(frozenset())
    ref, outputs, runner = GraphInfo(graph_def), output_tensors(fetches), Runner(feeds)
    refs, findings = _screen(graph_def, plain, ref, outputs, runner, precision, underflow_share)
    checker = Checker(rewrite, runner, outputs, refs, rtol, atol, max_executions)
    checker.results[frozenset()] = plain
    before = checker.error(frozenset(), "plain", force=True)
    analysis = Analysis(findings, unvarying=_unvarying(outputs, refs, feeds, rtol, atol))
    if before.passed:
        return _finish(checker, frozenset(), [], analysis, before, start, user_keep)
    base = frozenset(f.node for f in findings)
    attribution = attribute(graph_def, ref, checker, base, outputs, max_side_by_side_nodes, granularity)
    analysis.units, analysis.boundaries, analysis.level = attribution.measured, attribution.boundaries, \
        attribution.level
    total = checker.error(base, "screen", force=True)
    if total.passed:
        return _finish(checker, base, [], analysis, before, start, user_keep)
    chosen = _search(graph_def, ref, checker, base, attribution.units, analysis, total, outputs)
    return _finish(checker, base | _nodes(chosen), chosen, analysis, before, start, user_keep)


def _search(graph_def, ref: GraphInfo, checker: Checker, base: frozenset, units, analysis: Analysis,
            total: OutputError, outputs) -> list:
    """The candidates to keep on top of `base`: ranked by attribution (function bodies measured whole; kept
    regions refined to their units), or halved blind; every unit when neither finds a set that passes."""
    bodies = function_units(checker.result(base))
    everything = [UnitError(u, None, math.nan, "") for u in units + bodies]
    if analysis.attributed:
        if bodies:
            analysis.units = with_shares(analysis.units + measure_alone(checker, base, units, bodies))
        flops = unit_flops(graph_def, units)
        chosen = _ranked(analysis.units, ref, checker, base, total, flops)
        plain_units = set(units + bodies)
        regions = [c for c in chosen if c.unit not in plain_units]
        if regions and checker.passes(base | _nodes(chosen)) and checker.executions_left() > 1:
            chosen = _refine(graph_def, ref, checker, base, chosen, regions, units, analysis, total, outputs, flops)
    else:
        all_pass = checker.passes(base | _nodes(everything), "all")
        chosen = search_blind(everything, base, checker) if all_pass else everything
    if not checker.passes(base | _nodes(chosen)) and checker.passes(base | _nodes(everything), "all"):
        chosen = [dataclasses.replace(c, where="all") for c in everything]  # an interaction the ranking missed
    return chosen


def _ranked(measured, ref: GraphInfo, checker: Checker, base: frozenset, total: OutputError, flops) -> list:
    """Rank by error alone (then fewer FLOPs, then graph order), search the shortest passing prefix, prune."""
    ranked = sorted((m for m in measured if m.alone.ratio > 0),
                    key=lambda m: (-m.alone.ratio, flops(m), ref.order.get(m.unit.seed, len(ref.order))))
    return prune(search_ranked(ranked, base, checker, total.ratio), base, checker, flops)


def _refine(graph_def, ref, checker, base, chosen, regions, units, analysis, total, outputs, flops) -> list:
    """Narrow the kept regions to the units they need: one side-by-side run over their units, then the ranked
    search among those units (the other chosen candidates stay kept). Returns `chosen` if that does not pass."""
    wanted = {c.unit.region for c in regions}
    inner = [u for u in units if u.region in wanted]
    _, _, measured = isolate(graph_def, ref, checker, base, inner, outputs)
    analysis.units += measured
    others = [c for c in chosen if c not in regions]
    fine = _ranked(measured, ref, checker, base | _nodes(others), total, flops)
    narrowed = others + fine
    return narrowed if checker.passes(base | _nodes(narrowed), "refine") else chosen


def keep_set_rewriter(graph_def, precision, fetches, user_keep: tuple = (), options: dict | None = None):
    """A function keep set (frozenset of node names) -> RewriteResult, rewriting with the user's keep_fp32
    patterns plus an exact pattern per kept node; its `patterns` attribute maps each node to its pattern."""
    options = options or {}
    names = _all_node_names(graph_def)
    order = {name: i for i, name in enumerate(names)}
    patterns = {}

    def rewrite(keep: frozenset) -> RewriteResult:
        patterns.update(exact_patterns([n for n in keep if n not in patterns], names))
        ordered = tuple(patterns[n] for n in sorted(keep, key=lambda n: (order.get(n, len(order)), n)))
        return rewrite_graph_def(graph_def, precision, fetches, keep_fp32=user_keep + ordered, **options)
    rewrite.patterns = patterns  # node -> the exact pattern used for it, for the records and overrides file
    return rewrite


def _all_node_names(graph_def) -> list:
    """Node names of the main graph, then of every library function body (keep_fp32 patterns apply to both)."""
    return [n.name for n in graph_def.node] + [n.name for f in graph_def.library.function for n in f.node_def]


def _screen(graph_def, plain: RewriteResult, ref: GraphInfo, outputs, runner: Runner, precision, underflow_share):
    """Run the float32 graph once: (reference outputs, range Findings of every tensor the plain rewrite holds in
    low precision)."""
    frames = ref.in_frames() if ref.has_v1_control_flow() else set()
    targets = screen_targets(GraphInfo(plain.graph_def), set(plain.converted_nodes), plain.casts, frames)
    what = f"float32 reference + range screen of {len(targets)} tensors"
    values = runner(graph_def, outputs + [t.tensor for t in targets], what)
    return values[:len(outputs)], range_findings(targets, values[len(outputs):], precision, underflow_share)


def _unvarying(outputs, refs, feeds, rtol: float, atol: float) -> dict:
    """{output tensor: how its float32 value shows it does not depend on the feeds} (analysis.compare.unvarying)."""
    from ..analysis.compare import rows_differ, unvarying
    differ = rows_differ(feeds)
    found = {name: unvarying(value, differ, rtol, atol) for name, value in zip(outputs, refs)}
    return {name: how for name, how in found.items() if how}


def _nodes(candidates) -> frozenset:
    return frozenset(n for c in candidates for n in c.unit.nodes)


def _finish(checker: Checker, keep: frozenset, chosen, analysis: Analysis, before: OutputError, start: float,
            user_keep: tuple) -> GuardResult:
    """Measure the final keep set if needed, describe every kept node, and build the GuardResult."""
    after = checker.error(keep, "final", force=True)
    result = checker.result(keep)
    precision = result.precision
    kept = _kept_nodes(result, keep, checker.rewrite.patterns, analysis, chosen, before, after)
    if kept:
        details = {k.node: k.detail for k in kept}
        functions = {name: dataclasses.replace(sub, coloring=GuardColoring(sub.coloring, details))
                     for name, sub in result.functions.items()}
        result = dataclasses.replace(result, coloring=GuardColoring(result.coloring, details), functions=functions)
    return GuardResult(result, kept, before, after, checker.runner.executions, list(checker.runner.log),
                       time.perf_counter() - start,
                       analysis, list(checker.attempts), precision, checker.rtol, checker.atol, user_keep)


def _kept_nodes(result, keep, patterns, analysis: Analysis, chosen, before, after) -> list:
    """KeptNode records of the keep set, in graph order, each with the detail its Reason shows."""
    if not keep:
        return []
    names = _all_node_names(result.graph_def)
    flops = node_flops(result.graph_def, keep)
    precision = result.precision
    outcome = f"; outputs {before.short()} before, {after.short()} after"
    records = {}
    for f in analysis.findings:
        records[f.node] = KeptNode(f.node, patterns[f.node], "screen", PREFIX + f.detail + outcome, f.tensor,
                                   flops=flops.get(f.node, 0))
    for cand in chosen:
        if cand.where == "all":
            part, why = None, "no smaller keep set met the tolerance, so every low-precision unit stays float32"
        elif cand.alone is None:
            part, why = None, f"needed to meet the tolerance (unit {cand.unit.seed}, found by halving the candidates)"
        else:
            part = cand.share or 0.0
            why = (f"contributed {part:.0%} of output error (unit {cand.unit.seed}; alone in {precision} it puts "
                   f"the outputs at {cand.alone.short()})")
        for node in cand.unit.nodes:
            records.setdefault(node, KeptNode(node, patterns[node], "search", PREFIX + why + outcome,
                                              cand.unit.seed, part, cand.alone, flops.get(node, 0)))
    return [records[n] for n in names if n in records]


__all__ = ["guard", "keep_set_rewriter", "GuardResult", "Analysis", "KeptNode", "GuardColoring", "load_overrides",
           "load_override_reasons",
           "exact_patterns", "Finding", "Attempt", "OutputError", "DEFAULT_TOLERANCES"]
