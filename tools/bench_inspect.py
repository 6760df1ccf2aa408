"""Benchmark: inspecting a ResNet-50 training step (keras.applications.ResNet50(weights=None), Adam, one step traced
in a tf.function, ~14,500 nodes) — the rewrite, then each report format, medians of several runs.

    python3 tools/bench_inspect.py [--runs 3] [--write docs/bench_inspect.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

AROUND = "resnet50_1/conv3_block2_2_conv_1/convolution"


def train_step_graph(batch: int = 2):
    """The ResNet-50 training step as a GraphDef with shapes recorded (as_graph_def(add_shapes=True))."""
    import keras
    import tensorflow as tf
    from mp_rewrite.testing.examples import resnet50
    model = resnet50()
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    specs = [tf.TensorSpec([batch, 224, 224, 3], tf.float32, name="images"), tf.TensorSpec([batch], tf.int32)]
    cf = tf.function(step).get_concrete_function(*specs)
    return cf.graph.as_graph_def(add_shapes=True), [t.op.name for t in cf.outputs]


def timed(fn, runs: int):
    """(median seconds, last result) of `runs` calls."""
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def cases(graph_def, fetches, workdir):
    """name -> (what it measures, zero-argument callable)."""
    from mp_rewrite import rewrite_graph_def
    from mp_rewrite.report import dot, explain_all, html, json_report, tensorboard, text
    from mp_rewrite.report.node_table import build_tables
    state = {}

    def rewrite():
        state["result"] = rewrite_graph_def(graph_def, fetches=fetches)
        return state["result"]

    def tables():
        state["tables"] = build_tables(state["result"])
        return state["tables"]
    r, t = lambda: state["result"], lambda: state["tables"]
    return {
        "rewrite": ("rewrite_graph_def (for reference)", rewrite),
        "tables": ("node tables + FLOPs (shape inference), shared by the formats below", tables),
        "text": ("text report from the tables", lambda: text.to_text(r(), tables=t())),
        "json": ("JSON report (every node, reason and cast)", lambda: json_report.to_json(r(), tables=t())),
        "svg_around": (f"SVG, 3 edges around {AROUND}",
                       lambda: dot.to_svg(r(), around=AROUND, depth=3, tables=t())),
        "svg_whole": ("SVG, whole graph collapsed by name scope (150-box budget)", lambda: dot.to_svg(r(), tables=t())),
        "html": ("HTML (summary, table, explanations of every node, collapsed SVG)",
                 lambda: html.to_html(r(), tables=t())),
        "explain": ("explain one node (tables without FLOPs + explanation)",
                    lambda: explain_all(r(), AROUND)),
        "tensorboard": ("TensorBoard log (annotated GraphDef event)",
                        lambda: tensorboard.write_tensorboard(r(), os.path.join(workdir, "tb"), tables=t())),
    }


def _size(text: str) -> str:
    return f"{len(text) / 1e6:.1f} MB" if len(text) >= 1e6 else f"{len(text) / 1e3:.0f} kB"


def machine() -> str:
    import tensorflow as tf
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, TensorFlow {tf.__version__}; "
            f"load average at the end {load}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", metavar="FILE", help="also write the markdown table to FILE")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    graph_def, fetches = train_step_graph()
    build = time.perf_counter() - start
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, (what, fn) in cases(graph_def, fetches, workdir).items():
            seconds, out = timed(fn, args.runs)
            size = _size(out) if isinstance(out, str) and not out.startswith(workdir) else ""
            rows.append((name, what, seconds, size))
            print(f"{name:12s} {seconds:7.2f} s  {size:>8s}  {what}", flush=True)
    lines = [f"ResNet-50 training step (Adam, batch 2): {len(graph_def.node)} nodes, traced in {build:.0f} s.",
             f"Medians of {args.runs} runs. {machine()}.", "",
             "| step | median | output | what |", "|---|---:|---:|---|"]
    lines += [f"| {n} | {s:.2f} s | {size} | {w} |" for n, w, s, size in rows]
    report = "\n".join(lines)
    print("\n" + report)
    if args.write:
        with open(args.write, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
