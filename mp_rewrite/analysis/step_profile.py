"""A training step's costs measured a piece at a time (a front end: this module runs TensorFlow).

`graph_profile.profile_body` measures a traced step in one go: float32 and the lists' variant run in sessions with
step stats, the cut is computed from the node times and raced against both in the eager runtime -- about 50 runs
of the step, 18 s for a Transformer encoder and 32 s for ResNet-50 on an AMX CPU. Done at the step's first call,
that is what training waits for before its first step. `StepMeasure` does the same work as a generator whose every
piece is at most about one run of the step (a race round: one run of each variant), so that the training hook
(training.deferred) can spread it over the step's first calls while the step runs Grappler's lists. Its outcome is
cached (analysis.profile_cache) under a key of the step's graph without its process-wide numbers, so the same
training script finds it in its next process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from .graph_costs import MAIN, measure_casts
from .graph_profile import RUNS, Profile, _lists, _saved, _table
from .variant_race import RACE_RUNS, verdict
from .graph_runs import WARMUP, FunctionRunner, Runner, VariantError, _run_variant, variant_name
from .profile_cache import graph_bytes, load, profile_key

GRADIENT_ATTR = "_gradient_op_type"  # "CustomGradient-103": a counter of the process, not part of the step

LOG = logging.getLogger("mp_rewrite")


class StepMeasure:
    """The measuring of one function body (a training step), resumable between runs of the step.

    Args:
        body: the core.functions.BodyGraph (its graph annotated with the FuncGraph's shapes); never modified.
        args: one analysis.graph_runs.BodyArg per argument (values not read yet), as for profile_body.
        readers: per argument, a callable returning its current value (a captured variable's), or None.
        options: the core.options.Options of the rewrite.
        signatures: the core.op_support.Signatures of the functions the body calls.
        machine: the analysis.op_costs.MachineCosts of this machine (its Cast times price the casts).
        function: the body's FunctionDef as traced (the race calls each variant as one).
        traced: the body as traced when `body` is a rewrite of it (Keras 3's BatchNorm fused): the cut of `body` is
            then raced against float32 and Grappler's lists of the traced body, so that the graph change is checked
            too, and the table's `keep` ("float32", "lists") names the traced body's variant that ran fastest.
    """

    def __init__(self, body, args, readers, options, signatures, machine, function, batch: int | None = None,
                 runs: int = RUNS, traced=None):
        self.body, self.args, self.readers, self.traced = body, args, readers, traced
        self.options, self.signatures, self.machine, self.function = options, signatures, machine, function
        self.batch, self.runs = batch, runs
        self.targets = sorted(name for name in body.control_outputs if not name.startswith("^"))
        self.lists = self._rewrite(_lists(options))
        specs = [(arg.dtype, list(arg.shape), arg.variable) for arg in args]
        self.key = profile_key("step, raced against the traced body", _key_bytes(body.graph_def),
                               _key_bytes(self.lists.graph_def), specs, body.retvals, self.targets, batch, runs,
                               machine.machine, machine.precision)

    @property
    def planned_runs(self) -> int:
        """Runs of the step the measuring takes when the cut differs from the lists (as a race then follows)."""
        return 2 * (WARMUP + self.runs) + 3 * (WARMUP + RACE_RUNS)

    def cached(self) -> Profile | None:
        """The Profile measured before on this machine (in this process or another), or None."""
        found = load(self.key)
        if found is None:
            return None
        table, fp32_ms, lists_ms, path = found
        return Profile(dataclasses.replace(table, note=f"{table.note}; cached in {path}"), fp32_ms, lists_ms)

    def pieces(self):
        """Measure, yielding after each piece of work (a phrase naming it); returns the Profile (StopIteration's
        value), cached under the key profile_body uses."""
        machine, body = self.machine, self.body
        if measure_casts(machine):
            machine.save_to_cache()
            yield "Cast times of this machine"
        args = [dataclasses.replace(arg, value=read()) if read else arg for arg, read in zip(self.args, self.readers)]
        samples, walls = [{}, {}], [[], []]
        runners = []
        try:
            for result in (None, self.lists):
                runners.append(Runner.of_body(result.graph_def if result else body.graph_def, args, body.retvals,
                                              self.targets, self.batch))
            for i, runner in enumerate(runners):
                for _ in range(WARMUP):
                    _run_variant(runner, i)
                    yield f"a warm-up run of {variant_name(i)}"
            for _ in range(self.runs):
                for i, runner in enumerate(runners):
                    _traced_run(runner, i, samples[i], walls[i])
                    yield f"a traced run of {variant_name(i)}"
        finally:
            for runner in runners:
                runner.close()
        table = _table(body.graph_def, self.lists, samples, walls, {MAIN: [""]}, machine, self.batch, self.runs,
                       body.retvals)
        cut = self._rewrite(dataclasses.replace(self.options, assign="cost", costs=table))
        yield "the cut"
        demoted = sum(len(r.assignment.demoted) for r in (cut, *cut.functions.values()) if r.assignment)
        if (demoted or self.traced is not None) and table.low_units:
            ms = yield from self._race(args, cut)
            table = verdict(table, ms, " as the function runs")
        return _saved(self.key, table, walls)

    def _rewrite(self, options, body=None):
        from ..core.body import rewrite_body
        body = body or self.body
        return rewrite_body(body.graph_def, options, body.retvals, body.preserved(), self.signatures,
                            preserve_stateful=True, label=MAIN)

    def _race(self, args, cut):
        """Median wall ms of float32 and Grappler's lists (of the traced body) and the cut, each called as a function
        (graph_runs.race, a round at a time); a variant that fails is out (infinite), as in race."""
        from ..core.functions import graph_to_function
        racers, out = [], {}
        walls = [[], [], []]
        traced = self.traced or self.body
        lists = self.lists if self.traced is None else self._rewrite(_lists(self.options), traced)
        try:
            for graph_def in (traced.graph_def, lists.graph_def, cut.graph_def):
                racers.append(FunctionRunner(graph_to_function(graph_def, self.function, self.signatures), args,
                                             self.batch))
            for i, racer in enumerate(racers):
                try:
                    for _ in range(WARMUP):
                        _run_variant(racer, i)
                        yield f"a warm-up call of {variant_name(i)}"
                except VariantError as e:
                    out[i] = e
                    LOG.warning("%s; it is out of the race, the step goes on with what runs", e)
            if len(out) == len(racers):
                raise out[0]
            for _ in range(RACE_RUNS):
                for i, racer in enumerate(racers):
                    if i not in out:
                        begin = time.perf_counter()
                        _run_variant(racer, i)
                        walls[i].append((time.perf_counter() - begin) * 1e3)
                yield "a race round"
        finally:
            for racer in racers:
                racer.close()
        return [math.inf if i in out else float(np.median(w)) for i, w in enumerate(walls)]


def _key_bytes(graph_def) -> bytes:
    """A step's bytes as the cache keys them: profile_cache.graph_bytes without the custom gradients' process-wide
    numbers (the same training script traces "CustomGradient-234" after other models, "CustomGradient-103" alone)."""
    if not any(GRADIENT_ATTR in node.attr for node in graph_def.node):
        return graph_bytes(graph_def)
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        if GRADIENT_ATTR in node.attr:
            del node.attr[GRADIENT_ATTR]
    return graph_bytes(copy)


def _traced_run(runner, index: int, samples: dict, walls: list) -> None:
    """One run with step stats (graph_runs.traced_times, one run): each node's ms into `samples`, the wall into
    `walls`."""
    from tensorflow.core.protobuf import config_pb2
    metadata = config_pb2.RunMetadata()
    begin = time.perf_counter()
    _run_variant(runner, index, metadata)
    walls.append((time.perf_counter() - begin) * 1e3)
    for device in metadata.step_stats.dev_stats:
        for stat in device.node_stats:
            ms = (stat.op_end_rel_micros - stat.op_start_rel_micros) / 1e3
            samples.setdefault(stat.node_name.split(":")[0], []).append(ms)
