"""The times of one race of variants, round by round, and the ratios they support: pure numpy, no TensorFlow.

A race runs every variant once per round, back to back (analysis.graph_runs.race), so that whatever else runs on
the machine disturbs a round's variants alike. The ratio of two variants is then read round by round (paired):
its median, and a distribution-free interval around that median from the order statistics of the per-round
ratios (the sign test's: with 9 rounds the 2nd and 8th of the sorted ratios hold the median ratio 96% of the time).
A difference whose interval holds no difference at all is inside the noise: a tie (analysis.variant_race).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

CONFIDENCE = 0.95  # the intervals' coverage, at least (where the rounds allow it)
# A race goes on, round by round up to MORE_ROUNDS times its rounds, while what it decides is not settled (by
# default: the widest ratio interval is wider than SETTLED, high / low; the precision race's own rule is
# variant_race.clear_of_the_limit): a busy machine makes the measurement longer, not its answer different. Twice the
# rounds at most keeps a conversion's time near what it was (the README's MobileNetV2 --freeze --verify).
SETTLED = 1.10
MORE_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class Ratio:
    """One variant's time over another's: the median of the per-round ratios and an interval around it.

    Attributes:
        mid: the median ratio; low, high: the interval (equal to mid where there was one round).
        rounds: how many rounds it was read from.
    """

    mid: float
    low: float
    high: float
    rounds: int = 1

    def text(self) -> str:
        """"1.07x (0.98-1.16x)", or "1.07x" where there is no interval."""
        if not math.isfinite(self.mid):
            return "did not run"
        spread = f" ({self.low:.2f}-{self.high:.2f}x)" if self.high > self.low else ""
        return f"{self.mid:.2f}x{spread}"


@dataclasses.dataclass(frozen=True)
class RaceTimes:
    """Wall ms of each variant's timed runs, round by round (round k of every variant ran back to back).

    Attributes:
        walls: per variant, its ms per round (empty for a variant that failed to run: its time is infinite).
    """

    walls: tuple

    @classmethod
    def of_medians(cls, ms) -> RaceTimes:
        """A race known only by each variant's ms per run (one round: ratios without an interval)."""
        return cls(tuple(() if not math.isfinite(t) else (float(t),) for t in ms))

    @property
    def medians(self) -> list[float]:
        """Each variant's median ms per run (infinite where it did not run)."""
        return [float(np.median(w)) if w else math.inf for w in self.walls]

    @property
    def rounds(self) -> int:
        """The most rounds any variant ran."""
        return max((len(w) for w in self.walls), default=0)

    def ratio(self, i: int, base: int) -> Ratio:
        """Variant i's time over variant base's, read round by round (Ratio; infinite where either did not run)."""
        a, b = self.walls[i], self.walls[base]
        if not a or not b:
            return Ratio(math.inf, math.inf, math.inf, 0)
        n = min(len(a), len(b))
        if len(a) != len(b):  # not paired (a variant known by its median only): its medians' ratio
            mid = float(np.median(a) / np.median(b))
            return Ratio(mid, mid, mid, 1)
        per_round = np.sort(np.asarray(a[:n]) / np.asarray(b[:n]))
        k = order_statistic(n)
        return Ratio(float(np.median(per_round)), float(per_round[k - 1]), float(per_round[n - k]), n)

    def settled(self) -> bool:
        """Whether every variant's ratio to each other one that ran is known to within SETTLED."""
        ran = [i for i, w in enumerate(self.walls) if w]
        return all(r.high <= SETTLED * r.low for i in ran for j in ran if i < j
                   for r in [self.ratio(i, j)])


def order_statistic(n: int) -> int:
    """The k (1-based) whose k-th smallest and k-th largest of n per-round values bound their median at CONFIDENCE
    (the sign test's interval: each value lies below the median with probability 1/2); 1 (the extremes) where n is
    too small for CONFIDENCE."""
    k = 1
    while k < n // 2 and 2 * _below(n, k + 1) <= 1 - CONFIDENCE:
        k += 1
    return k


def _below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k - 1): the chance that the k-th smallest of n values lies above their median."""
    return sum(math.comb(n, j) for j in range(k)) / 2 ** n


def geometric_mean(ratios) -> Ratio:
    """The geometric mean across batch sizes of ratios (each of mid, low and high; low and high so bound the mean
    where each batch's interval holds its ratio)."""
    ratios = list(ratios)
    if not all(math.isfinite(r.mid) for r in ratios):
        return Ratio(math.inf, math.inf, math.inf, 0)

    def mean(values):
        return float(np.exp(np.mean(np.log(values))))
    return Ratio(mean([r.mid for r in ratios]), mean([r.low for r in ratios]), mean([r.high for r in ratios]),
                 min(r.rounds for r in ratios))


ONE = Ratio(1.0, 1.0, 1.0)  # the time a ratio is read against, as a Ratio


def ties(ratio: Ratio, fastest: Ratio = ONE) -> bool:
    """Whether `ratio` is as fast as `fastest` (by default 1: the time it is a ratio to) as far as the race can
    tell: within RESOLUTION (core.assignment: what a cut must save), or inside the noise (the intervals overlap)."""
    from ..core.assignment import RESOLUTION  # imported here: this module stays free of TensorFlow
    return ratio.mid <= (1 + RESOLUTION) * fastest.mid or ratio.low <= fastest.high


def faster(ratio: Ratio) -> bool:
    """Whether a ratio is below 1 beyond the noise (its whole interval) and by more than RESOLUTION."""
    from ..core.assignment import RESOLUTION
    return math.isfinite(ratio.mid) and ratio.high < 1 and ratio.mid < 1 / (1 + RESOLUTION)
