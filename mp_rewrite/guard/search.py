"""The accuracy guard's measurements and search: output errors against float32, counted and cached runs, and
the search for the fewest units to keep in float32 (ranked by attribution, or blind by halving)."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from tensorflow.core.framework import graph_pb2


# --------------------------------------------------------------------------------------------- errors


@dataclasses.dataclass(frozen=True)
class OutputError:
    """How far a run's outputs are from the float32 reference.

    Attributes:
        ratio: max over every output element of |got - ref| / (atol + rtol * |ref|); at most 1 meets the tolerance
            (np.allclose's rule); inf for a non-finite value where the reference has a finite one.
        max_abs: the largest |got - ref| over finite pairs; output: the tensor with the largest ratio.
        passed: every output meets the tolerance (by analysis.compare.compare_outputs, the rule `mp-rewrite verify` applies;
            ratio <= 1 when not given).
    """

    ratio: float
    max_abs: float
    output: str
    passed: bool | None = None

    def __post_init__(self):
        if self.passed is None:
            object.__setattr__(self, "passed", self.ratio <= 1.0)

    def short(self) -> str:
        """"0.42x the tolerance" or "non-finite"."""
        return "non-finite" if math.isinf(self.ratio) else f"{self.ratio:.3g}x the tolerance"

    def text(self) -> str:
        """One phrase: the ratio and the worst absolute difference."""
        if math.isinf(self.ratio):
            return f"non-finite values where float32 has finite ones (at {self.output})"
        return f"{self.short()} (max |diff| {self.max_abs:.3g} at {self.output})"


def element_ratio(ref, got, rtol: float, atol: float) -> tuple[float, float]:
    """(max |got - ref| / (atol + rtol |ref|), max finite |got - ref|) for one tensor; equal non-finite values
    (inf and inf, nan and nan) count as equal; non-numeric outputs must be equal (0 or inf)."""
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return math.inf, math.inf
    if ref.size == 0:
        return 0.0, 0.0
    if ref.dtype.kind not in "biuf" and ref.dtype.name != "bfloat16":
        return (0.0 if np.array_equal(ref, got) else math.inf), 0.0
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(ref) & np.isfinite(got)
    same = (ref == got) | (np.isnan(ref) & np.isnan(got))
    worst = 0.0 if np.all(finite | same) else math.inf
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(got - ref), 0.0)
    bound = atol + rtol * np.abs(np.where(finite, ref, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / bound)
    return max(worst, float(ratio.max())), float(diff.max())


def output_error(refs, gots, names, rtol: float, atol: float) -> OutputError:
    """The OutputError of one run (`gots`) against the reference outputs."""
    from ..analysis.compare import compare_outputs
    worst, output, max_abs = 0.0, names[0] if names else "", 0.0
    for name, ref, got in zip(names, refs, gots):
        ratio, diff = element_ratio(ref, got, rtol, atol)
        max_abs = max(max_abs, diff)
        if ratio > worst:
            worst, output = ratio, name
    checks = compare_outputs(dict(zip(names, refs)), dict(zip(names, gots)), rtol, atol)
    return OutputError(worst, max_abs, output, all(c.passed for c in checks))


def relative_error(ref, got) -> float:
    """max |got - ref| / max |ref| of one intermediate tensor; inf where a finite value went non-finite."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    finite = np.isfinite(ref)
    if not np.all(np.isfinite(got[finite])):
        return math.inf
    if not finite.any():
        return 0.0
    scale = float(np.abs(ref[finite]).max()) or 1e-30
    return float(np.abs(got[finite] - ref[finite]).max()) / scale


# --------------------------------------------------------------------------------------------- runs


class Runner:
    """Runs GraphDefs on the calibration feeds, counting executions; `log` holds (what, seconds) per execution."""

    def __init__(self, feeds: dict):
        self.feeds, self.log = feeds, []

    @property
    def executions(self) -> int:
        """Graph executions so far."""
        return len(self.log)

    def __call__(self, graph_def: graph_pb2.GraphDef, fetches, what: str, optimize: bool = True) -> list:
        from ..analysis.execution import run_graph_def
        start = time.perf_counter()
        try:
            return run_graph_def(graph_def, self.feeds, list(fetches), optimize=optimize)
        finally:
            self.log.append((what, time.perf_counter() - start))


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One checked keep set: what asked for it, how many nodes it keeps, and the outputs' error."""

    stage: str
    kept: int
    error: OutputError


class Checker:
    """Rewrites with a keep set, runs the result once and compares its outputs; cached per keep set.

    Args:
        rewrite: keep set (frozenset of node names) -> RewriteResult.
        runner: the Runner; outputs, refs: output tensor names and their float32 values.
        budget: the most executions the search may use in all (runs already made count).
    """

    def __init__(self, rewrite, runner: Runner, outputs, refs, rtol: float, atol: float, budget: int):
        self.rewrite, self.runner, self.outputs, self.refs = rewrite, runner, list(outputs), refs
        self.rtol, self.atol, self.budget = rtol, atol, budget
        self.errors, self.results, self.attempts = {}, {}, []

    def executions_left(self) -> int:
        """Executions the budget still allows."""
        return self.budget - self.runner.executions

    def result(self, keep: frozenset):
        """The RewriteResult for a keep set (cached)."""
        if keep not in self.results:
            self.results[keep] = self.rewrite(keep)
        return self.results[keep]

    def record(self, keep: frozenset, error: OutputError, stage: str) -> OutputError:
        """Store an error measured elsewhere (e.g. in the side-by-side run)."""
        self.errors[keep] = error
        self.attempts.append(Attempt(stage, len(keep), error))
        return error

    def error(self, keep: frozenset, stage: str = "search", force: bool = False) -> OutputError | None:
        """The OutputError of a keep set; None when it was not measured and the budget is spent (unless force)."""
        if keep in self.errors:
            return self.errors[keep]
        if not force and self.runner.executions >= self.budget:
            return None
        gots = self.runner(self.result(keep).graph_def, self.outputs, f"{stage}: check with {len(keep)} nodes kept")
        return self.record(keep, output_error(self.refs, gots, self.outputs, self.rtol, self.atol), stage)

    def passes(self, keep: frozenset, stage: str = "search") -> bool:
        """True if the keep set meets the tolerance; False if it does not or could not be measured."""
        error = self.error(keep, stage)
        return error is not None and error.passed


# --------------------------------------------------------------------------------------------- search


def first_probe(alone: list, total: float) -> int:
    """How many of the ranked units to keep first: the fewest whose remaining isolated errors, scaled so that
    they add up to the mixed graph's measured error, come within the tolerance (errors add, to first order)."""
    infinite = sum(1 for e in alone if math.isinf(e))
    finite_sum = sum(e for e in alone if not math.isinf(e))
    scale = total / finite_sum if math.isfinite(total) and finite_sum > 0 else 1.0
    for k in range(max(1, infinite), len(alone) + 1):
        if scale * sum(alone[k:]) <= 1.0:
            return k
    return len(alone)


def search_ranked(candidates: list, base: frozenset, checker: Checker, total: float) -> list:
    """The shortest prefix of the ranked candidates (UnitErrors, worst first) that, kept on top of `base`,
    meets the tolerance: probe where the attribution predicts, grow by doubling on a miss, then bisect down.
    Returns the whole list if no measured prefix passes (the caller measures it)."""
    if not candidates:
        return []
    keep = lambda k: base | frozenset(n for c in candidates[:k] for n in c.unit.nodes)  # noqa: E731
    k = first_probe([c.alone.ratio for c in candidates], total)
    lo, hi = 0, None
    while hi is None:
        if checker.passes(keep(k)):
            hi = k
        elif k == len(candidates) or checker.error(keep(k)) is None:
            return candidates
        else:
            lo, k = k, min(len(candidates), 2 * k)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if checker.passes(keep(mid)):
            hi = mid
        elif checker.error(keep(mid)) is None:
            break
        else:
            lo = mid
    return candidates[:hi]


def prune(chosen: list, base: frozenset, checker: Checker, flops) -> list:
    """Try dropping each chosen candidate but the last (the prefix without it already failed), most FLOPs first,
    while the budget lasts; keep each drop that still meets the tolerance."""
    chosen = list(chosen)
    if len(chosen) < 2 or not checker.passes(base | frozenset(n for c in chosen for n in c.unit.nodes)):
        return chosen
    for cand in sorted(chosen[:-1], key=lambda c: -flops(c)):
        if flops(cand) <= 0:
            continue
        trial = [c for c in chosen if c is not cand]
        if checker.passes(base | frozenset(n for c in trial for n in c.unit.nodes), "prune"):
            chosen = trial
    return chosen


def search_blind(candidates: list, base: frozenset, checker: Checker) -> list:
    """Without attribution: split the candidates in halves and keep only the halves the tolerance needs
    (delta debugging). Assumes keeping all of them passes; an unmeasured set counts as failing (keeps more)."""
    nodes = lambda cs: frozenset(n for c in cs for n in c.unit.nodes)  # noqa: E731

    def shrink(group, fixed):
        if len(group) <= 1:
            return group
        half = len(group) // 2
        first, second = group[:half], group[half:]
        if checker.passes(fixed | nodes(first)):
            return shrink(first, fixed)
        if checker.passes(fixed | nodes(second)):
            return shrink(second, fixed)
        kept_first = shrink(first, fixed | nodes(second))
        return kept_first + shrink(second, fixed | nodes(kept_first))
    return shrink(list(candidates), base)
