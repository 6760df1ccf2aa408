"""What running a model measured, as data for reports: every executed node's time, the whole runs, the kernels.

analysis.graph_profile times the model in float32 and as Grappler's lists rewrite it, traced (TF's step stats in
a session; TF's profiler where a TF2 SavedModel is called as TF2 serves it, analysis.served_trace), each run
recorded by `Recorded`. The cost table it makes for the assignment holds only the candidates' times; `RunTimes`
keeps the rest of what those runs showed, so that the time view (report.layer_times) can account for the whole run:

- each executed node's time **counted once**: every instant of a run goes to the kernel that has been running
  longest at that instant. On a machine whose kernels each use every core (oneDNN's primitives do), a kernel TF
  starts beside another mostly waits: step stats give a batch-norm add started beside a convolution 4 ms, the
  time of the convolution. Counted once, the nodes' times add up to the time some kernel ran -- measured on this
  2-core machine at 0.89-1.02 of the untraced whole run (MobileNetV2, ResNet-50, BERT), where the kernels' own
  intervals, overlapping, add up to 1.16 of it;
- the time between the first kernel and the last when none runs: TF's executor at work (`between`);
- the time of executed nodes no graph node names (TF's own: the nodes inlining a function call makes, the
  executor's source node, Grappler's additions): `elsewhere`;
- the whole runs, traced and untraced (`traced`, `untraced`);
- the kernels TF ran where they fuse ops or are another op than the graph's (`kernels`: "_MklNativeFusedConv2D:
  BiasAdd+Relu6"), from the partition graphs TF reports (RunMetadata), as it ran them;
- where the cut's coloring is a graph of its own, the same of the cut's own traced runs (`cut`).
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

MKL_PREFIXES = ("_MklNative", "_Mkl")  # TF's oneDNN kernels of the same op: "_MklNativeConv2D" runs "Conv2D"


@dataclasses.dataclass(frozen=True)
class RunTimes:
    """The runs analysis.graph_profile measured (ms per run).

    Attributes:
        traced: (float32 ms, lists ms) of whole traced runs (step stats on: slower than untraced).
        untraced: (float32 ms, lists ms) of the fastest whole untraced run, each run right after a traced one (so
            that both see the machine alike; the fastest, as `nodes` add up to the fastest traced run's kernels).
        raced: (float32, lists, cut ms) of the untraced runs that checked the cut, or () when it was not raced.
        nodes: graph label -> node name -> (float32 ms, lists ms), each executed node's time counted once (see the
            module doc); a node only one variant runs (an inserted Cast) has 0.0 for the other.
        elsewhere: (float32 ms, lists ms) of executed nodes no graph node names.
        kernels: graph label -> node name -> (float32 kernel, lists kernel) where TF ran a fused kernel or another
            op than the graph says ("" when that variant ran the graph's op).
        calls: graph label -> how many times a run ran the graph (a function body the signatures reach through two
            call sites: Keras exports "serve" and "serving_default", and a profile runs every signature).
        between: (float32 ms, lists ms) per run while no kernel ran, between the first kernel's start and the last
            one's end (between_kernels; the median over the traced runs): TF's executor scheduling the next kernel,
            which a model of many small ops pays for each (a keras-hub BERT of 2 x d128 at batch 8: ~0.6 of 3.6 ms).
        cut: where the cut's coloring is a graph of its own and was traced (graph_profile: not in a training step's
            profile, nor a TF1 export's), the RunTimes of float32 and the cut's own traced runs (its second column
            the cut's, in place of the lists'), else None.
    """

    traced: tuple
    untraced: tuple
    raced: tuple
    nodes: dict
    elsewhere: tuple = (0.0, 0.0)
    kernels: dict = dataclasses.field(default_factory=dict)
    calls: dict = dataclasses.field(default_factory=dict)
    between: tuple = (0.0, 0.0)
    cut: "RunTimes | None" = None

    def as_data(self) -> dict:
        """Plain JSON data (from_data reads it back)."""
        return {"traced": list(self.traced), "untraced": list(self.untraced), "raced": list(self.raced),
                "elsewhere": list(self.elsewhere),
                "nodes": {label: {name: list(ms) for name, ms in nodes.items()} for label, nodes in self.nodes.items()},
                "kernels": {label: {name: list(k) for name, k in ks.items()} for label, ks in self.kernels.items()},
                "calls": dict(self.calls), "between": list(self.between),
                "cut": None if self.cut is None else self.cut.as_data()}

    @classmethod
    def from_data(cls, data: dict) -> "RunTimes":
        """The RunTimes of as_data's output.

        Raises:
            KeyError, TypeError, ValueError: not what as_data writes.
        """
        return cls(tuple(float(x) for x in data["traced"]), tuple(float(x) for x in data["untraced"]),
                   tuple(float(x) for x in data["raced"]),
                   {label: {name: (float(ms[0]), float(ms[1])) for name, ms in nodes.items()}
                    for label, nodes in data["nodes"].items()},
                   tuple(float(x) for x in data["elsewhere"]),
                   {label: {name: (str(k[0]), str(k[1])) for name, k in ks.items()}
                    for label, ks in data["kernels"].items()},
                   {label: int(n) for label, n in data["calls"].items()},
                   tuple(float(x) for x in data["between"]),
                   None if data["cut"] is None else cls.from_data(data["cut"]))

    def kernel(self, label: str, name: str, low: bool) -> str:
        """The fused kernel TF ran under a node's name in the lists' run (`low`) or float32's; "" when it ran the
        graph's op there, or nothing (its op ran inside another node's kernel: the two runs may fuse differently,
        float32 a convolution with its BatchNorm and Relu, bfloat16 the BatchNorm with the Relu)."""
        pair = self.kernels.get(label, {}).get(name)
        return pair[1 if low else 0] if pair else ""


def op_interval(stat) -> tuple:
    """(begin ns, end ns) of one NodeExecStats' kernel: in nanoseconds where the stats have them (TF's profiler,
    analysis.served_trace, gives kernels shorter than a microsecond), else in microseconds."""
    start = stat.all_start_nanos or stat.all_start_micros * 1000
    begin = start + (stat.op_start_rel_nanos or stat.op_start_rel_micros * 1000)
    end = start + (stat.op_end_rel_nanos or stat.op_end_rel_micros * 1000)
    return begin, max(end, begin)


def _spans(step_stats) -> list:
    """[(begin ns, end ns, node name)] of each kernel of one traced run."""
    return [(*op_interval(stat), stat.node_name.split(":")[0])
            for device in step_stats.dev_stats for stat in device.node_stats]


def between_kernels(step_stats, counted: dict) -> float:
    """ms of one traced run, from its first kernel's start to its last one's end, when no kernel ran: TF's executor
    at work between them (`counted`: counted_once of the same run). The call's own dispatch before the first kernel
    and after the last is not counted: under TF's profiler the call runs 1.5-4 ms slower on MobileNetV2, most of it
    there, so it cannot be told from the tracing's own cost."""
    spans = _spans(step_stats)
    if not spans:
        return 0.0
    return max(0.0, (max(e for _, e, _ in spans) - min(b for b, _, _ in spans)) / 1e6 - sum(counted.values()))


def counted_once(step_stats) -> dict:
    """{executed node name: ms} of one traced run: every instant while some kernel runs goes to the one that has
    been running longest (ties: the first in the step stats); instants when none runs go to none (between_kernels
    has them)."""
    spans = _spans(step_stats)
    events = sorted([(b, 1, i) for i, (b, _, _) in enumerate(spans)] + [(e, 0, i) for i, (_, e, _) in enumerate(spans)])
    own = dict.fromkeys((name for *_, name in spans), 0.0)
    running, ended, last = [], set(), None
    for t, starts, i in events:
        while running and running[0][1] in ended:
            heapq.heappop(running)
        if running and t > last:
            own[spans[running[0][1]][2]] += (t - last) / 1e6
        last = t
        if starts:
            heapq.heappush(running, (spans[i][0], i))
        else:
            ended.add(i)
    return own


def typical(samples: list) -> dict:
    """{name: ms} over runs' {name: ms}: each node's mean time, scaled so that they add up to the least disturbed
    run's total (the fastest: on a shared machine another process's burst only ever slows a run down). Not each
    node's median: which of two kernels started together takes the time they overlap varies from run to run, and
    medians of such pairs add up to less than any run (BERT's query, key and value einsums: 25% less)."""
    names = set().union(*samples) if samples else set()
    totals = [sum(s.values()) for s in samples]
    mean = float(np.mean(totals)) if totals else 0.0
    scale = min(totals) / mean if mean > 0 else 1.0
    return {name: scale * float(np.mean([s.get(name, 0.0) for s in samples])) for name in names}


def kernel_label(node) -> str:
    """An executed node's kernel as TF ran it: its op, and the ops fused into it ("_MklNativeFusedConv2D:
    BiasAdd+Relu6")."""
    fused = [s.decode() for s in node.attr["fused_ops"].list.s] if "fused_ops" in node.attr else []
    return f"{node.op}: {'+'.join(fused)}" if fused else node.op


def same_op(kernel: str, op: str) -> bool:
    """Whether a kernel label is only the graph's op as TF's oneDNN build runs it (no fusion)."""
    if ":" in kernel:
        return False
    return kernel == op or any(kernel == prefix + op for prefix in MKL_PREFIXES)


def by_graph(times: dict, names: dict) -> tuple:
    """({label: {node: ms}}, ms of names no graph node has) of one variant's {executed name: ms} (`names`:
    call_names.executed_names); a function body
    called from several places gets the mean of its call sites (the time of one call, as the picture counts it)."""
    out, elsewhere, sites = {}, 0.0, {}
    for executed, ms in times.items():
        where = names.get(executed)
        if where is None:
            elsewhere += ms
            continue
        label, name, _ = where
        out.setdefault(label, {})[name] = out.get(label, {}).get(name, 0.0) + ms
        sites.setdefault(label, {}).setdefault(name, 0)
        sites[label][name] += 1
    calls = {label: max(counts.values()) for label, counts in sites.items()}
    return ({label: {n: ms / sites[label][n] for n, ms in nodes.items()} for label, nodes in out.items()}, elsewhere,
            calls)


class Recorded:
    """An analysis.graph_runs.Runner or served_trace.SignatureRunner whose traced runs are kept (what `run_times`
    reads): each node's time counted once (counted_once), the time between its kernels (between_kernels) and the
    run's wall ms, each traced run followed by an untraced one whose wall ms is kept too: the whole run the nodes'
    times add up to, measured while the machine is as busy as it was for them."""

    def __init__(self, runner):
        self.runner, self.samples, self.gaps, self.traced, self.walls = runner, [], [], [], []

    def run(self, metadata=None) -> None:
        ms = self.runner.run(metadata)
        if metadata is not None:
            self.traced.append(ms)
            self.samples.append(counted_once(metadata.step_stats))
            self.gaps.append(between_kernels(metadata.step_stats, self.samples[-1]))
            self.walls.append(self.runner.run())

    def feed(self, feeds) -> None:
        self.runner.feed(feeds)

    def close(self) -> None:
        self.runner.close()


def run_times(recorded: list, names: list, kernels: list, raced: tuple) -> RunTimes:
    """The RunTimes of the float32 and the lists' variants (or float32 and the cut: RunTimes.cut).

    Args:
        recorded: per variant, its Recorded runs: the nodes' times, the time between kernels, the whole runs
            (traced: the median; untraced: the least).
        names: per variant, call_names.executed_names of the graph it ran.
        kernels: per variant, the kernels of one run (graph_runs.Runner.kernels).
        raced: the raced whole runs (RunTimes).
    """
    per, elsewhere, ran, calls = [], [], {}, {}
    for i, (record, named, executed) in enumerate(zip(recorded, names, kernels)):
        nodes, other, called = by_graph(typical(record.samples), named)
        calls = calls or called
        per.append(nodes)
        elsewhere.append(other)
        for executed_name, kernel in executed.items():
            where = named.get(executed_name)
            if where is not None and not same_op(kernel, where[2]):
                pair = ran.setdefault(where[0], {}).setdefault(where[1], ["", ""])
                pair[i] = kernel
    labels = set(per[0]) | set(per[1])
    nodes = {label: {name: (per[0].get(label, {}).get(name, 0.0), per[1].get(label, {}).get(name, 0.0))
                     for name in set(per[0].get(label, {})) | set(per[1].get(label, {}))} for label in labels}
    kernels_out = {label: {name: tuple(pair) for name, pair in ks.items()} for label, ks in ran.items()}
    return RunTimes(tuple(float(np.median(r.traced)) for r in recorded), tuple(min(r.walls) for r in recorded),
                    tuple(raced), nodes, tuple(elsewhere), kernels_out, calls,
                    tuple(float(np.median(r.gaps)) if r.gaps else 0.0 for r in recorded))
