"""Our pass against TensorFlow's Grappler auto mixed precision pass, side by side on the same graphs.

For each graph, one untimed warm-up call of each, then `--repeats` rounds (5x as many for graphs under 5,000 nodes,
`--big-repeats` for 500k+ nodes); each round times one call of ours and one of Grappler's (the order alternates
between rounds), so machine load drifts hit both alike. Reported: medians. A cold first call (imports done) of ours
on the 1M-node graph is timed too, in the memory subprocess below.

- ours: `mp_rewrite.rewrite_graph_def(graph_def, precision, fetches, device="cpu")`, the whole call: reading the
  GraphDef, the stages, and building the new GraphDef.
- Grappler call: `tf_optimizer.OptimizeGraph` with only the mixed precision optimizer on (mp_rewrite.testing.oracle's
  recipe), as a Python caller sees it: MetaGraphDef copy and serialization, C++ GrapplerItem import, the pass,
  export and parsing of the result.
- Grappler C++ pass, two ways: (1) "log": the meta-optimizer's own timing of the pass ("auto_mixed_precision_cpu:
  Graph size after: ... time = X ms", logged at VLOG 1 of meta_optimizer.cc; this script sets TF_CPP_VMODULE
  before TensorFlow loads and reads the log from file descriptor 2); (2) "call - AMP-off": the Grappler call minus
  the same call with every optimizer off (import, export and Python overhead only). (2) also counts the work the
  meta-optimizer does because a pass changed the graph, so it is usually the larger of the two; it is noise, even
  below zero, when import and export dwarf the pass (ResNet-50 inference carries ~100 MB of frozen weights).
- CPU: process CPU time (time.process_time) of the same calls, shown because the machine may be shared (the load
  average is in the facts): it is what the growth verdict uses, wall time is shown next to it.
- Growth: our time on the synthetic graphs, time(100k) / time(10k) and time(1M) / time(100k) (linear: 10x).
- Peak memory: our rewrite of the 1M-node graph in a fresh subprocess, which parses the serialized graph, resets
  the kernel's peak-RSS mark (VmHWM, via /proc/self/clear_refs), records the RSS (imports + the parsed graph),
  runs the rewrite, and reports VmHWM minus that baseline: everything the rewrite adds at its peak, protobuf's C
  allocations and the output GraphDef included (tracemalloc would only see Python objects and slows the run
  several fold). Not ru_maxrss: Linux carries it across exec, so a child of this big process would start with
  this process's peak.

Usage::

    python3 tools/bench_pass.py                    # everything (about 15 minutes on 2 cores)
    python3 tools/bench_pass.py --quick            # no 1M-node graph, no DenseNet-121
    python3 tools/bench_pass.py --graphs resnet50/train,synthetic/10000 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

# Before TensorFlow loads: INFO logs on, and the meta-optimizer's per-pass timing (VLOG 1) for the log method.
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
os.environ["TF_CPP_VMODULE"] = "meta_optimizer=1"

GRAPHS = ("resnet50/train", "resnet50/inference", "densenet121/train", "transformer/train", "transformer/inference",
          "synthetic/10000", "synthetic/100000", "synthetic/1000000")
QUICK_SKIPS = ("densenet121/train", "synthetic/1000000")
REAL_TARGET, GROWTH_TARGET, BIG_SECONDS, BIG_GIB = 1.5, 12.0, 60.0, 4.0
SMALL_NODES, SMALL_FACTOR = 5_000, 5  # graphs this small take milliseconds: more rounds for a steady median
PASS_LOG = re.compile(r"auto_mixed_precision\w*: Graph size after: .*time = ([\d.]+)ms")


@contextlib.contextmanager
def fd2_captured(sink: list):
    """Send file descriptor 2 (where TF's C++ logs go) to a temp file; append its text to `sink` on exit."""
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode(errors="replace"))


def machine_facts() -> dict:
    """CPU model, cores, load, Python, TensorFlow and protobuf versions and protobuf's backend."""
    import google.protobuf
    import tensorflow as tf
    from google.protobuf.internal import api_implementation
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    return {"CPU": cpu, "cores": f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)",
            "load average (1 min) at start": f"{os.getloadavg()[0]:.2f}",
            "Python": platform.python_version(), "TensorFlow": tf.__version__,
            "protobuf": f"{google.protobuf.__version__} (backend: {api_implementation.Type()})"}


def build_graph(name: str):
    """Return the ExampleGraph for a benchmark name (Keras models are traced; synthetic graphs built)."""
    from mp_rewrite.testing import examples
    if name.startswith("synthetic/"):
        return examples.synthetic_graph(int(name.split("/")[1]))
    builders = {**examples.EXAMPLES, **examples.BENCHMARKS}
    if name not in builders:
        raise SystemExit(f"unknown graph {name!r}; choose from {', '.join(GRAPHS)} or synthetic/<nodes>")
    return builders[name]()


def amp_off_config(precision: str):
    """The oracle's ConfigProto with every Grappler optimizer off (model pruning included): import/export only."""
    from tensorflow.core.protobuf import rewriter_config_pb2
    from mp_rewrite.testing import oracle
    config = oracle.oracle_config(precision)
    rewrite = config.graph_options.rewrite_options
    del rewrite.optimizers[:]
    toggle = rewriter_config_pb2.RewriterConfig.Toggle.DESCRIPTOR
    for field in rewrite.DESCRIPTOR.fields:
        if field.enum_type is toggle and field.name not in ("use_plugin_optimizers",):
            setattr(rewrite, field.name, rewriter_config_pb2.RewriterConfig.OFF)
    rewrite.disable_model_pruning = True
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    return config


class Timer:
    """The three timed calls on one graph, sharing one Grappler cluster."""

    def __init__(self, graph, precision: str, cluster):
        self.graph, self.precision, self.cluster = graph, precision, cluster
        self.off_config = amp_off_config(precision)

    def ours(self) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one call of our pass."""
        import mp_rewrite
        start, cpu = time.perf_counter(), time.process_time()
        mp_rewrite.rewrite_graph_def(self.graph.graph_def, self.precision, self.graph.fetches, device="cpu")
        return time.perf_counter() - start, time.process_time() - cpu

    def grappler(self) -> tuple[float, float, float | None]:
        """(wall seconds, process CPU seconds, the pass's own time in seconds from TF's log or None)."""
        from mp_rewrite.testing import oracle
        logs = []
        with fd2_captured(logs):
            start, cpu = time.perf_counter(), time.process_time()
            oracle.grappler_rewrite(self.graph.graph_def, self.graph.fetches, self.precision, cluster=self.cluster)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        logged = [float(m) for m in PASS_LOG.findall(logs[0])]
        return wall, cpu, (sum(logged) / 1000 if logged else None)

    def amp_off(self) -> float:
        from tensorflow.python.grappler import tf_optimizer
        from mp_rewrite.testing import oracle
        with fd2_captured([]):
            start = time.perf_counter()
            meta = oracle.oracle_meta_graph(self.graph.graph_def, self.graph.fetches)
            tf_optimizer.OptimizeGraph(self.off_config, meta, verbose=False, cluster=self.cluster)
            return time.perf_counter() - start


def measure(name: str, graph, precision: str, repeats: int, cluster) -> dict:
    """Median times of ours, the Grappler call, its C++ pass (log) and the AMP-off call on one graph."""
    timer = Timer(graph, precision, cluster)
    timer.ours(), timer.grappler(), timer.amp_off()  # warm-up: first-call costs (op lists, kernel lookups) excluded
    ours, calls, off = [], [], []
    for i in range(repeats):
        if i % 2 == 0:
            ours.append(timer.ours())
            calls.append(timer.grappler())
        else:
            calls.append(timer.grappler())
            ours.append(timer.ours())
        off.append(timer.amp_off())
    median = statistics.median
    logged = [c[2] for c in calls if c[2] is not None]
    return {"graph": name, "nodes": len(graph.graph_def.node), "runs": repeats,
            "ours": median(t[0] for t in ours), "ours_cpu": median(t[1] for t in ours),
            "grappler": median(c[0] for c in calls), "grappler_cpu": median(c[1] for c in calls),
            "pass_log": median(logged) if logged else None, "amp_off": median(off)}


def _status_kib(field: str) -> int:
    """A "VmRSS:"/"VmHWM:"-style field of /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def memory_child(path: str, precision: str) -> None:
    """(Subprocess) parse a serialized graph, then print the rewrite's wall time and peak RSS added, in bytes.

    The peak is this process image's VmHWM, reset after parsing through /proc/self/clear_refs when the kernel lets
    us (else it may include the parse's transient buffer, which only overstates). ru_maxrss is not used: Linux
    carries it across exec from the parent, so a child of a big parent starts with the parent's peak.
    """
    from tensorflow.core.framework import graph_pb2
    import mp_rewrite
    graph_def = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        graph_def.ParseFromString(f.read())
    fetches = open(path + ".fetches").read().split("\n")
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    baseline = _status_kib("VmRSS")
    start = time.perf_counter()
    mp_rewrite.rewrite_graph_def(graph_def, precision, fetches, device="cpu")
    wall = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    print(f"MEMORY {wall} {(peak - baseline) * 1024} {baseline * 1024}")


def measure_memory(graph, precision: str) -> dict:
    """Run memory_child on `graph` in a fresh interpreter; return its wall time and peak memory added."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.pb")
        with open(path, "wb") as f:
            f.write(graph.graph_def.SerializeToString())
        with open(path + ".fetches", "w") as f:
            f.write("\n".join(graph.fetches))
        out = subprocess.run([sys.executable, __file__, "--memory-child", path, "--precision", precision],
                             capture_output=True, text=True, check=True).stdout
    wall, added, baseline = next(line.split()[1:] for line in out.splitlines() if line.startswith("MEMORY "))
    return {"wall": float(wall), "added": int(added), "baseline": int(baseline)}


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


COLUMNS = ("graph", "nodes", "runs", "ours (ms)", "Grappler call (ms)", "ours / Grappler call",
           "ours CPU (ms)", "Grappler call CPU (ms)",
           "Grappler C++ pass, log (ms)", "ours / C++ pass (log)", "AMP-off call (ms)", "C++ pass, call - AMP-off (ms)",
           "ours / (call - AMP-off)")


def table_rows(results: list) -> list:
    """One row of strings per measured graph, in COLUMNS order."""
    rows = []
    for r in results:
        diff = r["grappler"] - r["amp_off"]
        rows.append([r["graph"], f"{r['nodes']:,}", str(r["runs"]), fmt_ms(r["ours"]), fmt_ms(r["grappler"]),
                     fmt_ratio(r["ours"], r["grappler"]), fmt_ms(r["ours_cpu"]), fmt_ms(r["grappler_cpu"]),
                     fmt_ms(r["pass_log"]), fmt_ratio(r["ours"], r["pass_log"]),
                     fmt_ms(r["amp_off"]), fmt_ms(diff), fmt_ratio(r["ours"], diff if diff > 0 else None)])
    return rows


def verdicts(results: list, memory: dict | None) -> list:
    """(target, measured, met) lines for the speed, growth, 1M time and memory targets."""
    by_name = {r["graph"]: r for r in results}
    lines = []
    for r in results:
        if not r["graph"].startswith("synthetic/"):
            ratio = r["ours"] / r["grappler"]
            lines.append((f"{r['graph']}: ours <= {REAL_TARGET}x the Grappler call", f"{ratio:.2f}x",
                          ratio <= REAL_TARGET))
    sizes = sorted((r["nodes"], r) for name, r in by_name.items() if name.startswith("synthetic/"))
    for (n_small, small), (n_big, big) in zip(sizes, sizes[1:]):
        growth, growth_cpu = big["ours"] / small["ours"], big["ours_cpu"] / small["ours_cpu"]
        lines.append((f"growth {n_big:,} / {n_small:,} nodes ({n_big / n_small:.1f}x nodes) <= {GROWTH_TARGET}x "
                      "(CPU time; the machine is shared)",
                      f"{growth_cpu:.2f}x CPU, {growth:.2f}x wall "
                      f"(Grappler call {big['grappler'] / small['grappler']:.2f}x)",
                      growth_cpu <= GROWTH_TARGET))
    big = next((r for n, r in sizes if n >= 900_000), None)
    if big is not None:
        cold = memory["wall"] if memory is not None else big["ours"]
        lines.append((f"{big['nodes']:,} nodes in < {BIG_SECONDS:.0f} s (median, and the cold first call)",
                      f"{big['ours']:.1f} s median, {cold:.1f} s cold", max(big["ours"], cold) < BIG_SECONDS))
    if memory is not None:
        gib = memory["added"] / 2**30
        lines.append((f"peak memory of our rewrite of the 1M-node graph < {BIG_GIB:.0f} GiB",
                      f"{gib:.2f} GiB (subprocess, cold first call: {memory['wall']:.1f} s; baseline RSS "
                      f"{memory['baseline'] / 2**30:.2f} GiB)", gib < BIG_GIB))
    return lines


def markdown(facts: dict, results: list, checks: list, command: str, precision: str) -> str:
    """The page written to docs/bench_pass.md."""
    lines = ["# mp_rewrite's pass against Grappler's", "",
             f"Made with `{command}` (precision {precision}, device cpu; medians; ours and Grappler interleaved).",
             "", "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts.items()]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in checks]
    lines += ["", "How it is measured:", ""]
    lines += ["- " + " ".join(part.split()) for part in __doc__.split("Usage::")[0].split("\n- ")[1:]]
    return "\n".join(lines) + "\n"


def print_rich(facts: dict, results: list, checks: list) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console(width=200)
    console.print(" | ".join(f"{k}: {v}" for k, v in facts.items()))
    table = Table(title="ours vs Grappler's auto mixed precision pass (medians)")
    for i, column in enumerate(COLUMNS):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console.print(table)
    for target, measured, ok in checks:
        console.print(f"[{'green' if ok else 'red'}]{'met' if ok else 'NOT met'}[/]  {target}: {measured}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", help=f"comma-separated names (default: {','.join(GRAPHS)})")
    parser.add_argument("--quick", action="store_true", help="skip the 1M-node graph and DenseNet-121")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per graph (default 5)")
    parser.add_argument("--big-repeats", type=int, default=2, help="timed rounds for graphs of 500k+ nodes")
    parser.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--output", default="docs/bench_pass.md", help="markdown page to write ('' for none)")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_child:
        memory_child(args.memory_child, args.precision)
        return 0
    names = args.graphs.split(",") if args.graphs else list(GRAPHS)
    if args.quick:
        names = [n for n in names if n not in QUICK_SKIPS]
    from tensorflow.python.grappler import cluster as gcluster
    facts = machine_facts()
    results, memory = [], None
    for name in names:
        print(f"building {name} ...", flush=True)
        with fd2_captured([]):
            graph = build_graph(name)  # before the cluster: TF provisions one Grappler cluster at a time
        nodes = len(graph.graph_def.node)
        big = nodes >= 500_000
        rounds = args.big_repeats if big else args.repeats * (SMALL_FACTOR if nodes < SMALL_NODES else 1)
        cluster = gcluster.Cluster()
        try:
            results.append(measure(name, graph, args.precision, rounds, cluster=cluster))
        finally:
            cluster.Shutdown()
        print(f"  {name}: ours {fmt_ms(results[-1]['ours'])} ms, Grappler {fmt_ms(results[-1]['grappler'])} ms",
              flush=True)
        if big and memory is None:
            memory = measure_memory(graph, args.precision)
        del graph
    facts["load average (1 min) at end"] = f"{os.getloadavg()[0]:.2f}"
    checks = verdicts(results, memory)
    print_rich(facts, results, checks)
    if args.output:
        command = "python3 tools/bench_pass.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.output, "w") as f:
            f.write(markdown(facts, results, checks, command.strip(), args.precision))
        print(f"wrote {args.output}")
    return 0 if all(ok for _, _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
