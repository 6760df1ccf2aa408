"""How `--split auto` times its candidates: interleaved in this process, and in the other serving setting in a
child process.

TensorFlow fixes its intra-op threads when it starts, so one process cannot time a call both with one intra-op
thread and with TF's default threads, and the converting process cannot know which one the model will be served
with. A split that wins with one thread can lose with the default ones (keras-hub BERT at batch 8: 1.64x faster
with one, 1.20x slower with the default ones; docs/batch_split.md). So `auto` times the candidates here and again
in a child process started with the other setting -- TF_NUM_INTRAOP_THREADS=1 where this process has more threads,
TF's default where it has one -- and the verdicts (split_verdict.split_verdict, row_verdict) read both.

The child loads the candidates from SavedModel directories, one signature per candidate: in place, the staged
copies the check already loaded; frozen, the candidate functions saved to a temporary directory (saved_functions).
It reads its races as JSON on stdin and writes the times as JSON on stdout. Nothing else is written, and a child
that fails or runs past CHILD_TIMEOUT leaves the other setting untimed, said in the line.

A split buys wall time with cores that are free, and a timing on cores something else used says nothing about
the split: a verdict that read it would write a different model each time the machine is busy. Two readings catch
that (busy_timing): the cores the rest of the machine used while each candidate was timed (analysis.machine_load:
/proc/stat's busy time, steal included, less this process's), in either setting, above OTHERS; and, with one
intra-op thread, where a split's branches are its only parallelism, this process's CPU time over the wall time of
a split's calls (its overlap) below OVERLAP. The split is then not judged, and the graph stays whole with that
reason.

Each candidate's times are kept round by round, so that a split's time over the whole call's is read as
analysis.race_times reads a precision race's: paired by round, with an interval (split_ratio). A race goes on past
ROUNDS, up to MOST_ROUNDS, while some split's interval straddles FASTER, 1 or 1 / FASTER -- where a verdict would
turn on the noise -- so a noisy timing takes longer rather than deciding differently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ..analysis.race_times import RaceTimes, Ratio
from .frozen_function import remove_tree
from .inputs import DEFAULT_DIM, DEFAULT_ID_LIMIT, made_tensors, run_learning_id_limit

ROUNDS, MOST_ROUNDS, CALLS = 5, 10, 4
# Each timed block lasts this long at least (more calls than asked where one call is short): in blocks of 4 calls
# (60 ms) keras-hub GPT-2's split read 1.05x the whole call at batch 8 with TF's default threads, in blocks of
# 0.25 s 1.08-1.09x, in the benchmark's 1 s blocks 1.10-1.11x -- short blocks under-read what serving costs.
BLOCK_SECONDS = 0.25
FASTER = 0.97  # a split within 3% of the whole call is a tie: the graph stays whole
ONE_THREAD = "one intra-op thread"  # the setting a split model is served in (split_option.SERVE)
DEFAULT_THREADS = "TF's default intra-op threads"
SETTINGS = "here and in a child process in the other serving setting"  # what a progress bar says of the timing
CHILD_TIMEOUT = 600  # seconds: ResNet-50's races at batch 8 and 32 with one thread take about 30 s here
THREADS_VARIABLE = "TF_NUM_INTRAOP_THREADS"
OVERLAP = 1.25  # cores a split's branches must get, with one intra-op thread, for its timing to judge it
OTHERS = 0.25  # cores the rest of the machine may use while a candidate is timed (median of its rounds)


@dataclasses.dataclass(frozen=True)
class Load:
    """How a candidate's timed calls ran, each the median of its rounds: overlap, this process's CPU time over the
    wall time; others, the cores the rest of the machine used meanwhile (None where unknown)."""

    overlap: float
    others: float | None = None


class InputSpecs(list):
    """A signature's input TensorSpecs, in order, and the ids its integer inputs stay below (`id_limit`: the rows of
    the smallest table they index, as learned_specs finds it)."""

    def __init__(self, specs, id_limit: int = DEFAULT_ID_LIMIT):
        super().__init__(specs)
        self.id_limit = id_limit


def learned_specs(whole, specs, dim: int = DEFAULT_DIM, tries: int = 4) -> InputSpecs:
    """`specs` with the ids the `whole` call accepts: made-up ids that index past a table (TF's "... is not in [0,
    N)") are drawn below N, as --verify learns them (a vocabulary of 100: the split's check failed on ids < 1000).
    A call that fails otherwise leaves the limit as it is, for the checks to say."""
    import tensorflow as tf
    limit, _, _ = run_learning_id_limit(
        lambda limit: whole(*made_tensors(specs, 2, dim=dim, label="split", id_limit=limit)), tf.errors.OpError, tries)
    return InputSpecs(specs, limit)


def feeds(specs, batch: int, seed: int = 0, dim: int = DEFAULT_DIM) -> list:
    """The made-up inputs a split is checked and timed on (inputs.made_tensors, labelled "split"), every unknown
    dimension after the first of size `dim`, ids below the limit InputSpecs carry."""
    return made_tensors(specs, batch, seed, dim=dim, label="split",
                        id_limit=getattr(specs, "id_limit", DEFAULT_ID_LIMIT))


def interleaved_times(runners: dict, tensors, calls: int = CALLS, block: float = BLOCK_SECONDS) -> tuple[dict, dict]:
    """({key: [wall ms per call, round by round]}, {key: its Load}) of the functions `runners` ({key: function},
    the first the whole call the others are read against) called on `tensors`, after one warming call each: a race
    (analysis.graph_runs.race) whose every run is a block of `calls` calls or more, as many as the first function
    takes `block` seconds to run, ROUNDS rounds and more, up to MOST_ROUNDS, while some ratio to the first is not
    `decided`."""
    from ..analysis.graph_runs import Calls, race
    for function in runners.values():
        function(*tensors)  # warm: oneDNN's primitives and TF's kernels are made at the first call
    start = time.perf_counter()
    next(iter(runners.values()))(*tensors)
    calls = max(calls, math.ceil(block / max(time.perf_counter() - start, 1e-6)))
    timed = [Calls(function, tensors, calls) for function in runners.values()]
    times = race(timed, ROUNDS, warmup=0, names=[str(key) for key in runners], most=MOST_ROUNDS, settled=decided)
    return ({key: [ms / calls for ms in times.walls[i]] for i, key in enumerate(runners)},
            {key: Load(statistics.median(t.overlaps), statistics.median(t.others) if t.others else None)
             for key, t in zip(runners, timed)})


def split_ratio(whole, split) -> Ratio:
    """A split's time over the whole call's (analysis.race_times.Ratio), from each one's ms per call round by
    round, as timed together."""
    return RaceTimes((tuple(whole), tuple(split))).ratio(1, 0)


def decided(times: RaceTimes) -> bool:
    """Whether every later candidate's time over the first's (the whole call's) lies clear of FASTER, 1 and
    1 / FASTER, where the verdicts (split_verdict.split_verdict, row_verdict) turn."""
    return all(not r.low < edge < r.high for r in (times.ratio(i, 0) for i in range(1, len(times.walls)))
               for edge in (FASTER, 1, 1 / FASTER))


def busy_timing(loads: dict, setting: str, cores: int | None = None) -> str:
    """Why the timing in `setting` cannot judge a split -- the rest of the machine used more than OTHERS cores
    while a candidate was timed, or, with one intra-op thread, a split's branches got fewer than OVERLAP cores --,
    or "".

    Args:
        loads: {(batch, branches): Load}, branches 1 for the whole call.
        cores: the CPUs this process may run on (os.sched_getaffinity's count where there is one).
    """
    used = [(x.others, b, n) for (b, n), x in sorted(loads.items()) if x.others is not None and x.others > OTHERS]
    if used:
        others, batch, branches = max(used)
        what = "the whole call" if branches == 1 else f"the {branches} branches"
        return f"other processes used {others:.2f} cores while {what} ran with {setting} at batch {batch}, so the " \
               f"timing cannot judge the split"
    cores = cores or len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0))
    if setting != ONE_THREAD or cores < 2:
        return ""  # with TF's threads the whole call overlaps too; on one core nothing can
    short = [(b, n, x.overlap) for (b, n), x in sorted(loads.items()) if n > 1 and x.overlap < OVERLAP]
    if not short:
        return ""
    batch, branches, overlap = min(short, key=lambda item: item[2])
    return f"with {ONE_THREAD} the {branches} branches ran on {overlap:.2f} cores at batch {batch} (another " \
           f"process held the CPU while they were timed), so the timing cannot judge the split"


def this_setting() -> str:
    """This process's intra-op threads, as the lines say them."""
    import tensorflow as tf
    # TF reads TF_NUM_INTRAOP_THREADS at start without reporting it through tf.config.
    threads = tf.config.threading.get_intra_op_parallelism_threads() or int(
        os.environ.get(THREADS_VARIABLE, "0") or 0)
    return ONE_THREAD if threads == 1 else (DEFAULT_THREADS if not threads else f"{threads} intra-op threads")


def other_setting(setting: str) -> tuple[str, dict]:
    """(the other serving setting's name, the environment a child process runs in it): TF's default threads where
    `setting` is one thread, else one thread."""
    env = {key: value for key, value in os.environ.items() if key != THREADS_VARIABLE}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if setting == ONE_THREAD:
        return DEFAULT_THREADS, env
    return ONE_THREAD, {**env, THREADS_VARIABLE: "1"}


@contextlib.contextmanager
def saved_functions(functions: dict, captured=()):
    """Yield {key: (directory, signature key, tags)} of the tf.functions `functions` ({key: function with an input
    signature}, reading the resources `captured` [(placeholder, owner)] as frozen_function.as_function takes them)
    saved as the signatures of one temporary SavedModel (removed after), or a str saying why they were not: weights
    kept as variables (a model past protobuf's limit) are not copied only to be timed; tables are saved with them."""
    import tensorflow as tf
    if any(isinstance(owner, tf.Variable) for _, owner in captured):
        yield "its weights are variables (over protobuf's limit), not copied to another process only to be timed"
        return
    directory = tempfile.mkdtemp(prefix="mp_rewrite-timing-")
    try:
        names = {key: f"candidate_{key}" for key in functions}
        module = tf.Module()
        module.functions, module.resources = list(functions.values()), [owner for _, owner in captured]
        try:
            tf.saved_model.save(module, directory, signatures={names[k]: f.get_concrete_function()
                                                               for k, f in functions.items()},
                                options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))
        except (ValueError, TypeError, OSError, tf.errors.OpError) as e:
            yield f"the candidates could not be saved to be timed ({str(e).splitlines()[0]})"
            return
        yield {key: (directory, name, ["serve"]) for key, name in names.items()}
    finally:
        remove_tree(directory)


@dataclasses.dataclass(frozen=True)
class Timed:
    """What times_in_both measured.

    Attributes:
        times: {setting: {(batch, key): [ms per call, round by round]}}, this process's setting first.
        untimed: why a setting went untimed, or "".
        busy: why the timing cannot judge a split (busy_timing's), or "".
        cached: the cache file the times were read from (timing_cache: timed by an earlier conversion), or "".
    """

    times: dict
    untimed: str = ""
    busy: str = ""
    cached: str = ""

    def note(self) -> str:
        """The line's note on times read from the cache."""
        from .timing_cache import read_note
        return read_note(self.cached) if self.cached else ""


def times_in_both(runners: dict, specs, races: list, places, graph: bytes, dim: int = DEFAULT_DIM) -> Timed:
    """The `races` [(batch, calls, [keys])] of the functions `runners` ({key: function}, called on inputs made from
    the TensorSpecs `specs` with an unknown length of `dim`, key 1 the whole call, others a number of branches) run
    here, interleaved, and then in the other serving setting on the same candidates saved where `places()` says (a
    context yielding times_elsewhere's `places`: entered only to time, as saving a frozen model's candidates takes a
    while). Times an earlier conversion kept on this machine for `graph` (the bytes the candidates are made from)
    are read instead (timing_cache), and times that can judge the split are kept."""
    from . import timing_cache
    here = this_setting()
    key = timing_cache.timing_key("splits", graph, [[b, c, [str(k) for k in keys]] for b, c, keys in races], here,
                                  [BLOCK_SECONDS, ROUNDS, MOST_ROUNDS, dim])  # how it was timed: else time again
    kept = _kept_times(timing_cache.load("splits", key))
    if kept and here in kept:
        return Timed({here: kept.pop(here), **kept}, cached=timing_cache.path("splits", key))
    times, loads = {here: {}}, {}
    for batch, calls, keys in races:
        raced, load = interleaved_times({key: runners[key] for key in keys}, feeds(specs, batch, dim=dim), calls)
        times[here].update({(batch, key): walls for key, walls in raced.items()})
        loads.update({(batch, key): x for key, x in load.items()})
    busy = busy_timing(loads, here)
    other, env = other_setting(here)
    with places() as where:
        elsewhere, elsewhere_loads, why = times_elsewhere(where, [spec.name for spec in specs], races, env, dim)
    if elsewhere:
        times[other] = elsewhere
        busy = busy or busy_timing(elsewhere_loads, other)
    if not why and not busy:
        timing_cache.save("splits", key, [[setting, batch, name, walls] for setting, timed in times.items()
                                          for (batch, name), walls in timed.items()])
    return Timed(times, f"{other} not timed: {why}" if why else "", busy)


def _kept_times(rows) -> dict | None:
    """{setting: {(batch, key): [ms per call, round by round]}} of the rows times_in_both kept (keys as the races
    gave them: ints stay ints), or None."""
    times = {}
    for row in rows if isinstance(rows, list) else ():
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[3], list) and row[3]):
            return None
        setting, batch, name, walls = row
        times.setdefault(setting, {})[batch, name] = walls
    return times or None


def times_elsewhere(places, names: list, races: list, env: dict, dim: int = DEFAULT_DIM) -> tuple[dict, dict, str]:
    """({(batch, key): [ms per call, round by round]}, {(batch, key): its Load}, "") timed in a child process with
    the environment `env`, or ({}, {}, why not).

    Args:
        places: {key: (SavedModel directory, signature key, its MetaGraph's tags)} of each candidate, or a str
            (why there are none).
        names: the signatures' input names, in the order the candidates take them.
        races: [(batch, calls, [keys])]: each an interleaved race of those candidates at that batch, the first
            the whole call.
        dim: the size of every unknown input dimension after the first (--seq-len); the ids of integer inputs are
            learned there from the whole call (learned_specs), for `convert --split` and `--tune --split` alike.
    """
    if isinstance(places, str):
        return {}, {}, places
    request = {"places": {str(k): list(v) for k, v in places.items()}, "names": names, "dim": dim,
               "races": [[batch, calls, [str(k) for k in keys]] for batch, calls, keys in races]}
    keys = {str(k): k for k in places}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(request), capture_output=True,
                              text=True, env=env, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {}, {}, f"its timing process ran past {CHILD_TIMEOUT} s"
    except OSError as e:
        return {}, {}, f"its timing process did not start ({e})"
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
        return {}, {}, f"its timing process failed ({last.strip()[:200]})"
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return ({(batch, keys[key]): walls for batch, key, walls, _, _ in rows},
            {(batch, keys[key]): Load(overlap, others) for batch, key, _, overlap, others in rows}, "")


def _child() -> None:
    """The child's side: read the request (times_elsewhere's) on stdin, time, print [[batch, key, [ms per round],
    overlap, others], ...] (Load's)."""
    import tensorflow as tf

    from ..model.runtime import load_saved_model
    request = json.loads(sys.stdin.read())
    names = request["names"]
    loaded, functions, specs = {}, {}, None
    for key, (directory, signature, tags) in request["places"].items():
        if directory not in loaded:
            loaded[directory] = load_saved_model(directory, "a candidate", tags)
        function = loaded[directory].signatures[signature]
        given = function.structured_input_signature[1]
        specs = [tf.TensorSpec(given[name].shape, given[name].dtype, name=name) for name in names]
        functions[key] = (lambda f: lambda *tensors: f(**dict(zip(names, tensors))))(function)
    specs = learned_specs(functions[request["races"][0][2][0]], specs, request["dim"])  # on the whole call
    out = []
    for batch, calls, keys in request["races"]:
        times, loads = interleaved_times({key: functions[key] for key in keys},
                                         feeds(specs, batch, dim=request["dim"]), calls)
        out += [[batch, key, walls, loads[key].overlap, loads[key].others] for key, walls in times.items()]
    print(json.dumps(out))


if __name__ == "__main__":
    _child()
