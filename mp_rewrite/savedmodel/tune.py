"""`convert --tune`: convert a few candidate colorings, time them on this machine, keep the fastest that verifies.

The candidates (each converted exactly as `convert` would, with --freeze when asked):

- ``cost``: the cost assignment (`--assign cost`: a minimum cut over op times measured in the model on this
  machine, or the given `--costs` table), when the machine computes the precision natively;
- ``grappler``: TF's lists for the precision;
- ``matmul-conv``: only the allow list (matmuls, convolutions) in low precision, every elementwise op float32 —
  on CPUs whose low-precision elementwise kernels are slower than float32 ones this is often faster;
- ``no-depthwise`` (for models with depthwise convolutions): as ``matmul-conv``, with depthwise convolutions in
  float32 too — memory-bound, they are slower in bfloat16 than in float32 on CPUs without bfloat16 units (a
  [8,56,56,144] depthwise conv: 3.5 ms bfloat16, 2.0 ms float32 on an AVX2 CPU);
- ``float32``: nothing in low precision (with --freeze: the frozen, folded float32 graph);
- with --freeze, also ``float32-unfrozen``: the model as it is — the floor, so a tuned conversion is never slower
  than the original on the machine (and at the batch size, `--batch-size`) that tuned it.

Every candidate runs every signature on the same inputs, interleaved over several rounds (median CPU time per
call, so other processes on the machine disturb every candidate alike), and is checked against the original with
`verify`'s tolerances. The fastest candidate that passes is written to the output, with the timings in
``assets/mp_rewrite_tuning.json`` -- or, where one earlier in the list above (more in the precision asked for)
ties with it inside the noise (`choose`: faster in some round), that one, and the line says "a tie". Tune on the
machine the model will be served on: the result is a property of that machine's kernels.

With `split` ("auto" or N), the chosen candidate's split into N concurrent branches is raced beside it, in wall time,
and written only where it is faster beyond the noise (tune_split.py); the record's "split" entry says what it
measured and chose.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

from ..analysis.race_times import RaceTimes
from ..core.options import given_or_made
from ..model.tags import load_tags, parse_tag_set, single_meta_graph
from ..errors import ModelError
from ..model.files import read_saved_model
from .convert import check_conversion, convert_saved_model
from .inputs import DEFAULT_BATCH, check_input_options, input_recipe
from .model_dir import absolute_output, check_output, write_model_dir
from .output_lock import output_lock
from .run_check import RunFailure
from .verify import keeping_runs, loaded_original, verify_saved_models

CANDIDATES = ("cost", "grappler", "matmul-conv", "no-depthwise", "float32")
DEPTHWISE = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")
ORIGINAL = "float32-unfrozen"  # with --freeze: the model as it is, in case freezing makes it slower here
TUNING_FILE = "mp_rewrite_tuning.json"


@dataclasses.dataclass
class TuneResult:
    """What `tune_saved_model` measured and chose.

    Attributes:
        chosen: the candidate written to the output.
        milliseconds: candidate -> median CPU milliseconds of one call of every signature, over the rounds.
        passed: candidate -> whether it met the verification tolerance.
        conversion: the ConversionResult of the chosen candidate.
        unvarying: verify's note where outputs do not depend on the inputs fed (the check of every candidate
            then proves nothing there), else "".
        tie: where the fastest candidate was not chosen, why ("a tie with 'float32' (...)"), else "".
        split: with --split, the number of branches the chosen candidate was written with (1: whole), else 0.
        tolerance: the tolerance the candidates were verified at (VerifyReport.tolerance).
    """

    chosen: str
    milliseconds: dict
    passed: dict
    conversion: object
    unvarying: str = ""
    tie: str = ""
    split: int = 0
    tolerance: str = ""

    def summary(self) -> str:
        """One line per candidate, then the choice."""
        base = self.milliseconds.get(ORIGINAL) or self.milliseconds.get("float32")
        against = "the model as given" if self.milliseconds.get(ORIGINAL) else "float32"
        width = max(map(len, self.milliseconds), default=12)
        lines = []
        for name, ms in self.milliseconds.items():
            speed = f", {base / ms:.2f}x {against}'s speed" if base else ""
            verdict = "" if self.passed[name] else ", fails verification"
            lines.append(f"  {name:<{width}} {ms:8.2f} ms per call{speed}{verdict}")
        # What was written and why comes first (issue 39); the table it was read from follows.
        chose = f"chose '{self.chosen}' " + (f"({self.tie})" if self.tie else "(the fastest candidate that verifies)")
        chose += f", split in {self.split} branches (see the split line)" if self.split > 1 else \
            ", not split (see the split line)" if self.split == 1 else ""
        verified = f"; verified at {self.tolerance}" if self.tolerance else ""
        return chose + f"\ntuning on this machine (median CPU time per call{verified}):\n" + "\n".join(lines) + \
            (f"\n  verifying the candidates:{self.unvarying.removeprefix(' ')}" if self.unvarying else "")


def _candidate_lists(name: str, base):
    if name == "grappler":
        return base
    if name == "matmul-conv":
        return base.with_changes(None, {"infer": base.infer, "clear": base.clear}, source="tune: matmul-conv")
    if name == "no-depthwise":
        removed = {"infer": base.infer, "clear": base.clear, "allow": base.allow & set(DEPTHWISE)}
        return base.with_changes(None, removed, source="tune: no-depthwise")
    return base.with_changes(None, {"allow": base.allow}, source="tune: float32")


def tune_saved_model(source, output, precision: str = "bfloat16", *, options=None, freeze: bool = False,
                     overwrite: bool = False, lists=None, rounds: int = 5, calls: int = 3, inputs=None, seed: int = 0,
                     batch_size: int = DEFAULT_BATCH, tag_set=None, signatures=None, weights: str = "keep",
                     progress=None, allow_opaque_xla: bool = False, split="off", rtol: float | None = None,
                     atol: float | None = None, **rewrite_options):
    """Convert each candidate, time and verify it here, and write the fastest that verifies to `output`.

    Args:
        source, output, precision, lists, freeze, overwrite, tag_set, signatures, weights, allow_opaque_xla: as for
            convert_saved_model; or
        options: an Options made with make_options (each candidate changes only its lists).
        rounds, calls: interleaved timing rounds, and calls of each signature per round.
        inputs, seed, batch_size: the inputs every candidate runs on (as for verify_saved_models).
        rtol, atol: the tolerance every candidate is verified at (None: the precision's default, as verify's).
        progress: optional callable (done, total, step), as each step begins: converting, verifying and loading
            each candidate ("verifying 'grappler' (candidate 2 of 5), about 40 s left"), each timing round, then
            writing the chosen one (done == total).
        split: "off", "auto" or N: the chosen candidate's split raced beside it, in wall time, a tie keeping it
            whole (tune_split.py); what was chosen is in the tuning record, the result's `split` and its notes.
        **rewrite_options: the other make_options arguments (device, keep_fp32, force_low, ...).

    Returns:
        A TuneResult.

    Raises:
        ModelError: no candidate met the tolerance (nothing is written), or a conversion error.
    """
    options = given_or_made(options, precision, lists=lists, **rewrite_options)
    precision = options.precision
    recipe = input_recipe(inputs, batch_size=batch_size, seed=seed)  # checked before anything is converted
    check_input_options(rtol=rtol, atol=atol)
    saved_model = check_conversion(source, output, parse_tag_set(tag_set), signatures, freeze, overwrite, options,
                                   allow_opaque_xla=allow_opaque_xla)[2]
    tags = load_tags(single_meta_graph(saved_model, parse_tag_set(tag_set), "--tune")[1])
    depthwise = _has_ops(source, DEPTHWISE)
    costs = _costs(options, batch_size)
    candidates = {name: freeze for name in CANDIDATES if (name != "no-depthwise" or depthwise)
                  and (name != "cost" or costs.low_units)}
    candidates |= {ORIGINAL: False} if freeze else {}
    steps = TuneSteps(progress, len(candidates), rounds)
    with tempfile.TemporaryDirectory(prefix="mp_rewrite-tune-") as work, loaded_original(source, tag_set) as loaded:
        converted, out, runs = {}, {}, {}
        for name in steps.each("converting", candidates):
            chosen = (dataclasses.replace(options, assign="cost", costs=costs) if name == "cost" else
                      dataclasses.replace(options, assign="lists", costs=None, lists=_candidate_lists(
                          name if name != ORIGINAL else "float32", options.lists)))
            runs[name] = {}
            try:  # its run check calls it on the inputs it is verified on: verify compares those calls
                converted[name] = convert_saved_model(
                    source, Path(work) / name, options=chosen, freeze=candidates[name], tag_set=tag_set,
                    signatures=signatures, weights=weights if candidates[name] else "keep",
                    allow_opaque_xla=allow_opaque_xla, run_inputs=recipe,
                    on_run=keeping_runs(runs[name]))
            except RunFailure as e:  # a kernel this CPU cannot run in the precision: out of the race
                if name in ("float32", ORIGINAL):
                    raise
                out[name] = str(e).split("; ")[0]
        candidates = {name: frozen for name, frozen in candidates.items() if name not in out}

        def verification(name, path):
            """verify's VerifyReport of a candidate (its run check's calls, where it made them) against the
            original."""
            return verify_saved_models(source, path, inputs=recipe.given, precision=precision, seed=seed,
                                       batch_size=batch_size, rtol=rtol, atol=atol, tag_set=tag_set,
                                       converted_runs=runs.get(name), loaded=loaded)
        reports = {name: verification(name, Path(work) / name) for name in steps.each("verifying", candidates)}
        passed = {name: report.passed for name, report in reports.items()}
        times = _time_candidates(loaded, {n: Path(work) / n for n in candidates}, recipe, precision, rounds, calls,
                                 steps)
        milliseconds = dict(zip(candidates, times.medians))
        fine = [name for name in candidates if passed[name]]
        if not fine:
            raise ModelError("no candidate of --tune meets the verification tolerance, not even float32; check the "
                             "model and the inputs (--inputs), or loosen --rtol/--atol")
        chosen, tie = choose(fine, list(candidates), times)
        steps.finish(f"writing '{chosen}', " + ("a tie with the fastest" if tie else "the fastest candidate that "
                                                                                     "verifies"))
        unvarying = reports[chosen].unvarying_note() if reports[chosen].unvarying else ""
        result = TuneResult(chosen, milliseconds, passed, converted[chosen], unvarying, tie,
                            tolerance=reports[chosen].tolerance)
        winner, raced = Path(work) / chosen, None
        if split != "off":
            from .tune_split import race_split

            def race(paths, clock):
                checked = {n: passed[chosen] if n == chosen else verification(n, p).passed for n, p in paths.items()}
                return _time_candidates(loaded, paths, recipe, precision, rounds, calls,
                                        TuneSteps(progress, len(paths), rounds), clock=clock), checked
            exact = not any(r.retyped or r.emulated for r in converted[chosen].results())
            raced = race_split(chosen, Path(work), split, race, tags, batch_size, exact)
            winner, result.split = raced.directory, raced.branches
        (winner / "assets").mkdir(exist_ok=True)
        (winner / "assets" / TUNING_FILE).write_text(json.dumps(
            {"chosen": chosen, "tie": tie, "precision": precision, "freeze": freeze,
             "median_cpu_ms_per_call": milliseconds,
             "verified": passed, "machine": _machine(), **({"split": raced.record} if raced else {})},
            indent=1) + "\n")
        target = absolute_output(output)
        with output_lock(target):
            check_output(source, output, overwrite)
            write_model_dir(winner, target, read_saved_model(winner), overwrite)
    result.conversion.output = str(output)
    # The chosen candidate was converted into a temporary directory; its notes name the output instead.
    result.conversion.notes = [n.replace(str(Path(work) / chosen), str(output)) for n in result.conversion.notes]
    result.conversion.notes += [f"--tune: candidate '{name}' is out of the race: {why}" for name, why in out.items()]
    if raced is not None:
        result.conversion.notes.append(raced.line)
        result.conversion.split = (raced.line,)
    return result


def choose(fine: list, order: list, times) -> tuple:
    """The candidate to write, of those that verify (`fine`), given every candidate's timed rounds (a RaceTimes in
    `order`, which runs from the most low precision to float32: what the user asked for first): the first in
    `order` that ties with the fastest -- within core.assignment.RESOLUTION of it, or faster in some round (the
    sign test's interval of its time over the fastest's holds 1) -- else the fastest.

    Returns:
        (candidate, why it is not the fastest, or "").
    """
    from ..analysis.race_times import ties
    medians = dict(zip(order, times.medians))
    fastest = min(fine, key=medians.get)
    for name in (n for n in order if n in fine):
        ratio = times.ratio(order.index(name), order.index(fastest))
        if name == fastest:
            return name, ""
        if ties(ratio):
            return name, (f"a tie with the fastest, '{fastest}': {ratio.text()} its time over {ratio.rounds} "
                          "interleaved rounds, inside the noise, so the candidate most in the precision asked for")
    return fastest, ""


def _costs(options, batch_size: int):
    """The cost candidate's table: the options' own (--costs FILE, or this machine's), else this machine's, at the
    batch size the candidates are timed at."""
    from ..analysis.op_costs import this_machine
    costs = options.costs if options.assign == "cost" else this_machine(options.precision)
    if getattr(costs, "measure", False) and costs.batch is None:
        costs.batch = batch_size
    return costs


def _has_ops(source, ops) -> bool:
    """Whether any graph or function of the SavedModel runs one of `ops`."""
    saved_model = read_saved_model(Path(source))
    for meta in saved_model.meta_graphs:
        nodes = list(meta.graph_def.node) + [n for f in meta.graph_def.library.function for n in f.node_def]
        if any(n.op in ops for n in nodes):
            return True
    return False


def _time_candidates(original, paths: dict, recipe, precision: str, rounds: int, calls: int, steps: TuneSteps,
                     clock=time.process_time):
    """A RaceTimes (in `paths`' order) of CPU ms (or of `clock`'s: time.perf_counter for wall time) of one call of
    every signature, per candidate, per round, timed in rotated interleaved rounds, on the inputs verify makes by
    `recipe` (ids inside the tables they index, learned on `original`, verify's LoadedOriginal). Each load and round
    is a step told to `steps`."""
    import tensorflow as tf

    from ..model.runtime import load_saved_model
    from .verify import signature_feeds
    feeds = {key: {k: tf.constant(v) for k, v in signature_feeds(
        function, key, recipe.given, recipe.batch_size, recipe.seed, precision).items()}
        for key, function in original.model.signatures.items()}
    runs = {}
    for name in steps.each("loading", paths):
        loaded = load_saved_model(paths[name], f"candidate '{name}'", original.tags)
        for key, function in loaded.signatures.items():
            function(**feeds[key])  # the first call builds and optimizes the graph
            runs.setdefault(name, []).append((function, feeds[key]))
    samples = {name: [] for name in paths}
    names = list(paths)
    for r in range(rounds):
        steps.begin("timing", f"timing round {r + 1} of {rounds} (every candidate, interleaved)")
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = clock()
            for _ in range(calls):
                for function, arrays in runs[name]:
                    for value in function(**arrays).values():
                        value.numpy()
            samples[name].append((clock() - start) * 1000 / calls)
    return RaceTimes(tuple(tuple(samples[name]) for name in paths))


class TuneSteps:
    """The steps of a tuning run told to a progress callback (done, total, step) as each begins -- the callback
    convert and verify drive their progress bars with -- with roughly how long is left: each phase's remaining
    steps at the mean time its finished steps took (converting the cost candidate, which measures, takes longest;
    the timing rounds are alike), a phase not yet begun at the mean of all finished steps."""

    def __init__(self, progress, candidates: int, rounds: int):
        self._progress = progress
        self._todo = {"converting": candidates, "verifying": candidates, "loading": candidates, "timing": rounds}
        self._took = {phase: [] for phase in self._todo}
        self._current = None  # (phase, monotonic time it began)

    def each(self, phase: str, names):
        """Yield each of `names` (candidates), first telling that `phase` of it begins."""
        names = list(names)
        for i, name in enumerate(names, 1):
            self.begin(phase, f"{phase} '{name}' (candidate {i} of {len(names)})")
            yield name

    def begin(self, phase: str, step: str) -> None:
        """A step of `phase` begins (the one before it has ended); tell the callback, with the time left."""
        self._end_current()
        self._current = (phase, time.monotonic())
        if self._progress is not None:
            done = sum(len(took) for took in self._took.values())
            self._progress(done, sum(self._todo.values()), step + self._left())

    def finish(self, step: str) -> None:
        """Every counted step has ended; `step` (writing the output) is what remains."""
        self._end_current()
        if self._progress is not None:
            total = sum(self._todo.values())
            self._progress(total, total, step)

    def _end_current(self) -> None:
        if self._current is not None:
            phase, began = self._current
            self._took[phase].append(time.monotonic() - began)
            self._current = None

    def _left(self) -> str:
        finished = [seconds for took in self._took.values() for seconds in took]
        if not finished:
            return ""  # nothing measured yet: any figure would be a guess
        overall = statistics.mean(finished)
        seconds = sum((self._todo[phase] - len(took)) * (statistics.mean(took) if took else overall)
                      for phase, took in self._took.items())
        return f", about {_duration(seconds)} left"


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"


def _machine() -> dict:
    import os
    import platform
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "load_average": os.getloadavg()[0], "cpu_flags": sorted(cpu_low_precision_flags())}


def cpu_low_precision_flags() -> set:
    """The CPU's instruction set extensions that compute bfloat16 or float16 natively (Linux /proc/cpuinfo)."""
    wanted = {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return wanted & set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
