"""`convert --tune --split auto|N`: the tuning winner's split raced beside it.

Once `--tune` has chosen the candidate to write, its signatures are split (split_in_place.split_written: proven by
the batch-rows analysis and checked equal on random inputs, in place or on the frozen model alike) into N branches
(N as asked; for "auto", 2 and the number of cores, at most 8). Each split that was made is verified against the
original as the candidates were, then the winner and its splits are timed interleaved, in rotated rounds, in WALL
time (the split buys wall time with a second core, never CPU time, which is what the candidates' race compares).
A split is written only if it is faster beyond the noise here (a tie goes to the unsplit winner: tune.choose, with
the winner first) and not slower beyond it in the other serving setting: the winner and the split are timed again
in a child process started with the other intra-op threads (split_timing.times_elsewhere, on made-up inputs at the
tuning batch), as `convert --split auto` does. A child that fails leaves the other setting untimed, said in the line;
one disturbed by other processes (split_timing.busy_timing) cannot judge it, and the winner is written
unsplit with that reason. Batch 1 is decided apart, as `convert --split` decides it (row_choice.py): the winner's
signatures are written again with the batch as chosen and batch 1 routed to one sample's token rows where they
are proven, equal to the whole call and, for "auto", measured faster at batch 1 in both serving settings.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from .batch_split import split_candidates
from .split_in_place import split_written
from .split_option import SERVE
from .split_timing import CALLS, FASTER, ONE_THREAD, busy_timing, other_setting, this_setting, times_elsewhere
from .split_verdict import NOT_JUDGED


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


def race_split(winner: str, work: Path, split, race, tags=None, batch: int = 8,
               exact: bool | None = None) -> SplitRace:
    """Split the winner (its conversion at `work / winner`) and race it against its splits.

    Args:
        split: "auto" or N.
        race: callable({name: directory}, clock) -> (RaceTimes in that order, {name: passed verification}): tune's
            timing and verification of the candidates.
        tags: the MetaGraph's tags (model.tags.load_tags), for the child process that times the other setting.
        batch: the batch the candidates were raced at, timed there too.
        exact: the winner computes in float32 (its token rows are then checked to float32's round-off); None:
            batch 1 runs whole.
    """
    raced = _batch_race(winner, work, split, race, tags, batch)
    if exact is None:
        return raced
    made, lines = split_written(work / winner, work / "rows", raced.branches, exact=exact, rows=split)
    # What batch 1 got, said once per wrapper, and how to serve the model said once, at the end: the race's line
    # and each wrapper's both end with it where they split.
    said = dict.fromkeys(line[line.index("batch 1"):].removesuffix(f"; {SERVE}") for line in lines if "batch 1" in line)
    serve = SERVE if made or raced.branches > 1 else ""
    line = "; ".join(filter(None, (raced.line.removesuffix(f"; {SERVE}"), *said, serve)))
    return dataclasses.replace(raced, directory=work / "rows" if made else raced.directory, line=line,
                               record={**raced.record, "rows": lines})


def _batch_race(winner: str, work: Path, split, race, tags, batch: int) -> SplitRace:
    """race_split's batch split: the winner or its split, raced."""
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
    raced = {winner: paths[winner], chosen: paths[chosen]}
    other, elsewhere, untimed, busy = _timed_elsewhere(raced, {chosen: branches}, tags, batch) if branches > 1 \
        else ("", {}, "", "")
    there = f"with {other}: whole {elsewhere[winner]:.1f} ms, {branches} branches {elsewhere[chosen]:.1f} ms" \
        if elsewhere else ""
    if busy:
        line = f"--split {split}: '{winner}' not split: {busy} (median wall time per call with {setting}: " \
               f"{measured}; {there}); {NOT_JUDGED}"
        chosen, branches = winner, 1
    elif elsewhere and elsewhere[chosen] / elsewhere[winner] > 1 / FASTER:
        line = f"--split {split}: '{winner}' not split: {branches} branches measured faster with {setting} but " \
               f"slower with {other} (median wall time per call with {setting}: {measured}; {there}): the split " \
               f"would make the model slower served so"
        chosen, branches = winner, 1
    elif branches > 1:
        note = f"; {there}" if there else f"; {other} not timed: {untimed}"
        line = f"--split {split}: '{winner}' split in {branches} branches: faster here with {setting} (median wall " \
               f"time per call: {measured}{note}); {SERVE}"
    else:
        hint = "" if setting == ONE_THREAD else \
            "; to choose for one intra-op thread, tune with TF_NUM_INTRAOP_THREADS=1"
        failed = [n for n in splits if not passed[n]]
        why = tie.split(", so the candidate")[0] if tie else f"'{failed[0]}' fails verification" if failed else \
            "no split measured faster"
        line = f"--split {split}: '{winner}' not split: {why}" + \
            f" (median wall time per call with {setting}: {measured}){hint}"
    record = {"asked": str(split), "chosen": branches, "setting": setting, "median_wall_ms_per_call": milliseconds,
              "verified": passed, "tie": tie, "why": line,
              **({"other_setting": other, "other_median_wall_ms_per_call": elsewhere} if other else {})}
    return SplitRace(paths[chosen], branches, line, record)


def _timed_elsewhere(paths: dict, branches: dict, tags, batch: int) -> tuple[str, dict, str, str]:
    """(the other serving setting, {candidate: the median wall ms of one call of each of its signatures, summed,
    timed there} or {}, why not timed or "", why that timing cannot judge the split or "" (busy_timing's)) of the
    SavedModels `paths` ({candidate: directory}, the same signatures in each; `branches` {candidate: N} of the
    splits among them)."""
    from ..model.files import read_saved_model
    from ..model.signatures import signature_keys
    from ..model.tags import single_meta_graph
    other, env = other_setting(this_setting())
    _, meta_graph = single_meta_graph(read_saved_model(next(iter(paths.values()))),
                                      frozenset(tags) if tags else None)
    summed, busy = dict.fromkeys(paths, 0.0), ""
    for key in signature_keys([meta_graph]):
        places = {name: (str(path), key, tags) for name, path in paths.items()}
        names = sorted(meta_graph.signature_def[key].inputs)
        times, loads, why = times_elsewhere(places, names, [(batch, CALLS, list(paths))], env)
        if why:
            return other, {}, why, ""
        for (_, name), walls in times.items():
            summed[name] += statistics.median(walls)
        busy = busy or busy_timing({(b, branches.get(name, 1)): x for (b, name), x in loads.items()}, other)
    return other, summed, "", busy
