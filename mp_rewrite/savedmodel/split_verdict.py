"""What `--split auto` keeps from measured times (split_timing.py times them): a batch split, from which batch, or
none (split_verdict); batch 1's token rows or not (row_verdict). Both read a split's time over the whole call's
round by round, as the precision race reads its variants (split_timing.split_ratio), and keep a split only where it
measured faster beyond the noise in some serving setting and not slower in any: the split never makes a model
slower however it is served.
"""

from __future__ import annotations

import dataclasses
import statistics

from .row_choice import ROW_PARTS, RowChoice
from .split_option import SERVE
from .split_timing import FASTER, ONE_THREAD, split_ratio

NOT_JUDGED = "convert again on a quiet machine, or --split N writes N branches without timing them"


@dataclasses.dataclass(frozen=True)
class SplitChoice:
    """What a signature's batch split became, and why (the convert line).

    Attributes:
        branches: N slices (1: the graph runs whole).
        why: the reason, with what was measured.
        times: {serving setting: {(batch, branches): [ms per call, round by round]}} measured for "auto" (empty
            otherwise); at batch 1, branches N is the token-row split in N.
        rows: token-row branches at batch 1 (row_choice.py; 1: batch 1 runs whole).
        least: the smallest batch split (0: N -- a batch smaller than the branches runs whole); for "auto", the
            smallest batch timed from which the split measured faster, where it did not at a smaller one.
    """

    branches: int
    why: str
    times: dict = dataclasses.field(default_factory=dict)
    rows: int = 1
    least: int = 0


def split_verdict(times: dict, untimed: str = "", busy: str = "", note: str = "") -> SplitChoice:
    """The split to keep from measured times: a number of branches and the smallest batch timed B from which it
    measured faster than the whole call (1) beyond the noise at every batch timed in some serving setting, and not
    slower at any of those batches in any setting timed -- a split that wins with one intra-op thread and loses
    with TF's default threads would make the model slower where it is served so --; of those, the smallest B, then
    the least in sum of its ratios to the whole call from B up; else 1 (a tie keeps the graph whole). Where B is
    not the smallest batch timed, the batches below B run whole (SplitChoice.least: keras-hub BERT and GPT-2 split
    slower at batch 8 with TF's default threads and faster at 32, docs/batch_split.md). Faster and slower are
    _faster's and _slower's: read round by round (split_timing.split_ratio).

    Args:
        times: {setting: {(batch, branches): [ms per call, round by round]}}, with branches 1 for the whole call
            at every batch; this process's setting first.
        untimed: why a setting was not timed ("" where both were), said in the line.
        busy: why the timing cannot judge a split (split_timing.busy_timing), or "": then the graph stays whole.
        note: where the times were read from (split_timing.Timed.note), said after them.
    """
    measured = "; ".join(f"with {s}: {_measured(t)}" for s, t in times.items())
    if busy:
        return SplitChoice(1, f"not split: {busy} ({measured}); {NOT_JUDGED}", times)
    ratios = {s: {(b, n): split_ratio(t[b, 1], walls) for (b, n), walls in t.items() if n > 1}
              for s, t in times.items()}
    splits = sorted({n for r in ratios.values() for _, n in r})
    batches = sorted({b for r in ratios.values() for b, _ in r})

    def faster_in(n: int, least: int) -> list[str]:  # the settings where n branches win at every batch from `least`
        return [s for s, r in ratios.items() if all(_faster(x) for (b, m), x in r.items() if m == n and b >= least)]

    def slower_in(n: int, least: int) -> list[str]:  # the settings where n branches lose at some batch from `least`
        return [s for s, r in ratios.items() if any(_slower(x) for (b, m), x in r.items() if m == n and b >= least)]

    def timed_from(n: int, least: int) -> bool:  # n branches were timed at every batch from `least` up
        return all((b, n) in r for r in ratios.values() for b in batches if b >= least)

    winners = [(least, n) for n in splits for least in batches
               if timed_from(n, least) and faster_in(n, least) and not slower_in(n, least)]
    hint = _hint(untimed, next(iter(times))) + note
    if not winners:
        first = batches[0]
        mixed = next((n for n in splits if faster_in(n, first) and slower_in(n, first)), None)
        if mixed is None:
            return SplitChoice(1, f"not split: no split measured faster beyond the noise with {' or '.join(times)} "
                                  f"({measured}){hint}", times)
        faster, slower = faster_in(mixed, first), slower_in(mixed, first)
        return SplitChoice(1, f"not split: {mixed} branches measured faster with {' and '.join(faster)} but "
                              f"slower with {' and '.join(slower)} ({measured}): the split would make the model "
                              f"slower served so; --split {mixed} writes it for {' and '.join(faster)}{hint}", times)
    least, best = min(winners, key=lambda w: (w[0], sum(x.mid for r in ratios.values() for (b, m), x in r.items()
                                                        if m == w[1] and b >= w[0])))
    faster = faster_in(best, least)
    level = [s for s in times if s not in faster]
    from_here = (f"split in {best} branches: faster at every batch timed" if least == batches[0] else
                 f"split in {best} branches from batch {least}: faster at every batch timed from {least} up")
    return SplitChoice(best, f"{from_here} with {' and '.join(faster)}"
                             + (f", not slower with {' and '.join(level)}" if level else "")
                             + _below(best, least, faster, ratios) + f" ({measured}){hint}; {SERVE}", times,
                       least=0 if least == batches[0] else least)


def _below(branches: int, least: int, faster: list, ratios: dict) -> str:
    """"; smaller batches run whole (batch 8: 2 branches slower with TF's default threads)": why the batches timed
    below `least` are not split ("" where none is); `faster`: the settings where the split wins from `least` up."""
    def why(b):
        slower = [s for s, r in ratios.items() if _slower(r[b, branches])]
        return (f"batch {b}: {branches} branches slower with {' and '.join(slower)}" if slower else
                f"batch {b}: {branches} branches not faster beyond the noise with {' and '.join(faster)}")
    below = [why(b) for b in sorted({b for r in ratios.values() for b, n in r if n == branches}) if b < least]
    return f"; smaller batches run whole ({'; '.join(below)})" if below else ""


def _faster(ratio) -> bool:
    """Whether a split's time over the whole call's (a Ratio) is below 1 beyond the noise -- every round but the
    interval's outliers faster -- and by more than the tie (FASTER)."""
    return ratio.high < 1 and ratio.mid < FASTER


def _slower(ratio) -> bool:
    """Whether a split's time over the whole call's is above the tie (1 / FASTER): its median, so that "never
    slower" does not lean on the noise. Read beyond the noise instead (the whole interval above 1 / FASTER, as the
    precision race reads a variant slower), keras-hub GPT-2's split was kept at 1.04x and 1.07x by the median at
    batch 8 with TF's default threads (intervals 0.92-1.15x and 0.91-1.25x), and served so it then ran 1.22x
    --freeze's time (docs/batch_split.md): the conversion's timing under-reads that loss, so the median decides."""
    return ratio.mid > 1 / FASTER


def _measured(times: dict) -> str:
    """"batch 8: whole 14.4 ms, 2 branches 8.3 ms (per round 0.58x, 0.55-0.61x); batch 32: ..." of {(batch,
    branches): [ms per call, round by round]}: medians, and each split's ratio to the whole call with its
    interval."""
    def one(b, n):
        if n == 1:
            return f"whole {statistics.median(times[b, n]):.1f} ms"
        return f"{n} branches {statistics.median(times[b, n]):.1f} ms ({_ratio_text(times[b, 1], times[b, n])})"
    batches = sorted({b for b, _ in times})
    return "; ".join(f"batch {b}: " + ", ".join(one(b, n) for n in sorted(m for c, m in times if c == b))
                     for b in batches)


def _ratio_text(whole, split) -> str:
    """"per round 0.58x, 0.55-0.61x": a split's time over the whole call's, the median of the rounds' ratios (not
    the ratio of the medians beside it: the two can fall on either side of 1), and its interval."""
    r = split_ratio(whole, split)
    return f"per round {r.mid:.2f}x, {r.low:.2f}-{r.high:.2f}x"


def _hint(untimed: str, here: str) -> str:
    """The line's note on a setting not timed, and how to choose for one intra-op thread then."""
    if not untimed:
        return ""
    return f"; {untimed}" + ("" if here == ONE_THREAD else "; to choose for one intra-op thread, convert with "
                             "TF_NUM_INTRAOP_THREADS=1")


def row_verdict(times: dict, untimed: str = "", busy: str = "", note: str = "", more: str = "") -> RowChoice:
    """Batch 1's choice from measured times, by split_verdict's rule: the token-row split if faster than the whole
    call beyond the noise in some serving setting timed and not slower in any; else whole.

    Args:
        times: {setting: {(1, 1): the whole call's ms per call round by round, (1, ROW_PARTS): the row split's}},
            this process's first.
        untimed: why a setting was not timed ("" where both were), said in the line.
        busy: why the timing cannot judge the split (split_timing.busy_timing), or "": then batch 1 runs whole.
        note: where the times were read from (split_timing.Timed.note), said after them.
        more: what the line says of the kept split after "token rows in 2 branches" (an unknown length's least).
    """
    ratio = {s: split_ratio(t[1, 1], t[1, ROW_PARTS]) for s, t in times.items()}
    faster = [s for s, x in ratio.items() if _faster(x)]
    slower = [s for s, x in ratio.items() if _slower(x)]
    measured = "; ".join(f"{statistics.median(t[1, ROW_PARTS]):.2f} ms against whole {statistics.median(t[1, 1]):.2f}"
                         f" ms with {s} ({_ratio_text(t[1, 1], t[1, ROW_PARTS])})" for s, t in times.items())
    if busy:
        return RowChoice(1, f"runs whole: {busy} ({measured}); {NOT_JUDGED}", times)
    hint = _hint(untimed, next(iter(times))) + note
    if faster and not slower:
        return RowChoice(ROW_PARTS, f"token rows in {ROW_PARTS} branches{more}, {measured}{hint}", times)
    if faster:
        return RowChoice(1, f"runs whole: token rows in {ROW_PARTS} branches faster with {' and '.join(faster)} but "
                            f"slower with {' and '.join(slower)} ({measured}){hint}", times)
    return RowChoice(1, f"runs whole: token rows in {ROW_PARTS} branches not faster beyond the noise ({measured})"
                        f"{hint}", times)
