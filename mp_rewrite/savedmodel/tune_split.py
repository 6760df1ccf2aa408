"""`convert --tune --split auto|N`: the tuning winner's split raced beside it.

Once `--tune` has chosen the candidate to write, its signatures are split (split_in_place.split_written: proven by
the batch-rows analysis and checked equal on random inputs, in place or on the frozen model alike) into N branches
(N as asked; for "auto", 2 and the number of cores, at most 8). Each split that was made is verified against the
original as the candidates were, then the winner and its splits are timed interleaved, in rotated rounds, in WALL
time (the split buys wall time with a second core, never CPU time, which is what the candidates' race compares).
A split is written only if it is faster beyond the noise: a tie goes to the unsplit winner (tune.choose, with the
winner first). The times are taken with this process's intra-op threads: tune under TF_NUM_INTRAOP_THREADS=1 to
choose for a server that uses one.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from .batch_split import split_candidates
from .split_in_place import split_written
from .split_option import SERVE
from .split_timing import ONE_THREAD, this_setting


@dataclasses.dataclass(frozen=True)
class SplitRace:
    """What the split race measured and chose.

    Attributes:
        directory: the model to write (the winner's, or its split's).
        branches: the number of branches written (1: the winner as it was).
        line: what was chosen and why, with the times.
        record: the tuning record's "split" entry.
    """

    directory: Path
    branches: int
    line: str
    record: dict


def race_split(winner: str, work: Path, split, race) -> SplitRace:
    """Split the winner (its conversion at `work / winner`) and race it against its splits.

    Args:
        split: "auto" or N.
        race: callable({name: directory}, clock) -> (RaceTimes in that order, {name: passed verification}): tune's
            timing and verification of the candidates.
    """
    splits, said = {}, []
    for n in split_candidates(split):
        name = f"{winner}, split in {n}"
        made, lines = split_written(work / winner, work / f"split-{n}", n)
        said += [line for line in lines if line not in said]
        if made:
            splits[name] = (n, work / f"split-{n}")
    if not splits:
        why = "; ".join(line.split(": ", 1)[-1] for line in said) or "no signature to split"
        return SplitRace(work / winner, 1, f"--split {split}: {why}", {"asked": str(split), "chosen": 1, "why": why})
    paths = {winner: work / winner, **{name: path for name, (_, path) in splits.items()}}
    times, passed = race(paths, time.perf_counter)
    from .tune import choose
    order = list(paths)
    chosen, tie = choose([n for n in order if passed[n]], order, times)
    milliseconds = dict(zip(order, times.medians))
    setting = this_setting()
    measured = ", ".join(f"{'whole' if n == winner else n.split(', ')[1]} {ms:.1f} ms" for n, ms in
                         milliseconds.items())
    branches = splits[chosen][0] if chosen in splits else 1
    if branches > 1:
        line = f"--split {split}: '{winner}' split in {branches} branches: faster here with {setting} (median wall " \
               f"time per call: {measured}); {SERVE}"
    else:
        hint = "" if setting == ONE_THREAD else \
            "; to choose for one intra-op thread, tune with TF_NUM_INTRAOP_THREADS=1"
        failed = [n for n in splits if not passed[n]]
        why = tie.split(", so the candidate")[0] if tie else f"'{failed[0]}' fails verification" if failed else \
            "no split measured faster"
        line = f"--split {split}: '{winner}' not split: {why}" + \
            f" (median wall time per call with {setting}: {measured}){hint}"
    record = {"asked": str(split), "chosen": branches, "setting": setting, "median_wall_ms_per_call": milliseconds,
              "verified": passed, "tie": tie, "why": line}
    return SplitRace(paths[chosen], branches, line, record)
