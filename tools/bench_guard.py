"""Benchmark the accuracy guard on a Transformer encoder with deliberately fragile layers.

The model: `--blocks` post-norm encoder blocks built from keras layers (MultiHeadAttention, LayerNormalization,
Dense), a pooled classifier and a softmax. Two places fail float16, as real models do:

- block 1's second feed-forward Dense has weights x3e4: its activations exceed 65504 (the LayerNormalization after
  it would bring them back in float32, but in float16 they are inf and the outputs NaN);
- the logits sit on a +1000 offset (a scaled logit): float16 resolves only 0.5 there, so the softmax drifts.

Side by side in one process, on the same graph, inputs and tolerance:
- the guard (screen, attribution, ranked search), `--repeats` times (medians reported);
- a blind bisection baseline: the same candidate units, no screen and no attribution, halved until the tolerance is
  met (what onnxconverter-common's auto_mixed_precision does, though it halves node lists, not units).

Usage:
    python tools/bench_guard.py                 # float16 and bfloat16; prints a table, writes docs/bench_guard.md
    python tools/bench_guard.py --precision float16 --repeats 1 --output -   # table only
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.testing import examples  # noqa: E402
from mp_rewrite.guard.accuracy_guard import guard, keep_set_rewriter  # noqa: E402
from mp_rewrite.guard.attribution import UnitError, seeds_of  # noqa: E402
from mp_rewrite.guard.screen import GraphInfo, converted_units, output_tensors  # noqa: E402
from mp_rewrite.guard.search import Checker, Runner, search_blind  # noqa: E402
from mp_rewrite.analysis.compare import default_tolerance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def fragile_transformer(blocks: int = 4, seq_len: int = 32, d_model: int = 64, heads: int = 4, ff: int = 128,
                        classes: int = 10, batch: int = 8, hot_block: int = 1, hot_scale: float = 3e4,
                        logit_offset: float = 1000.0) -> examples.ExampleGraph:
    """The benchmark model (see the module docstring) as a frozen inference graph with a sample batch."""
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(1234)
    x = inp = keras.Input((seq_len, d_model), name="tokens")
    hot = None
    for b in range(blocks):
        att = keras.layers.MultiHeadAttention(heads, d_model // heads, name=f"block{b}_attention")(x, x)
        x = keras.layers.LayerNormalization(name=f"block{b}_norm1")(x + att)
        h = keras.layers.Dense(ff, activation="relu", name=f"block{b}_ff1")(x)
        ff2 = keras.layers.Dense(d_model, name=f"block{b}_ff2")
        hot = ff2 if b == hot_block else hot
        x = keras.layers.LayerNormalization(name=f"block{b}_norm2")(x + ff2(h))
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    logits = keras.layers.Dense(classes, name="logits")
    model = keras.Model(inp, keras.layers.Softmax(name="probs")(logits(x)), name="fragile_transformer")
    kernel, bias = hot.get_weights()
    hot.set_weights([kernel * hot_scale, bias])
    kernel, bias = logits.get_weights()
    logits.set_weights([kernel * 3, bias + logit_offset])
    return examples.inference_graph(model, batch=batch)


def blind_bisection(g, precision: str, budget: int = 500) -> dict:
    """The baseline: halve the candidate units (no screen, no attribution) until the tolerance is met."""
    start = time.perf_counter()
    rewrite = keep_set_rewriter(g.graph_def, precision, g.fetches)
    outputs, runner = output_tensors(g.fetches), Runner(g.inputs)
    refs = runner(g.graph_def, outputs, "float32 reference")
    rtol, atol = default_tolerance(precision)
    checker = Checker(rewrite, runner, outputs, refs, rtol, atol, budget)
    plain = checker.result(frozenset())
    units = converted_units(GraphInfo(plain.graph_def), set(plain.converted_nodes), seeds_of(plain))
    candidates = [UnitError(u, None, float("nan"), "") for u in units]
    chosen = candidates
    if not checker.passes(frozenset()):
        chosen = search_blind(candidates, frozenset(), checker)
    keep = frozenset(n for c in chosen for n in c.unit.nodes)
    error = checker.error(keep, force=True)
    from mp_rewrite.analysis.flops import low_precision_flop_share
    return {"seconds": time.perf_counter() - start, "executions": runner.executions, "kept": len(keep),
            "met": error.passed, "after": error.short(), "share": low_precision_flop_share(checker.result(keep)).share}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, TensorFlow {tf.__version__}, "
            f"Keras {keras.__version__}")


def bench(g, precision: str, repeats: int) -> tuple[list, str]:
    """Run the guard and the baseline `repeats` times each on one graph; (table rows, the guard's summary)."""
    runs = [guard(g.graph_def, g.fetches, g.inputs, precision) for _ in range(repeats)]
    last = runs[-1]
    assert all(r.kept == last.kept and r.executions == last.executions for r in runs), "the guard is not deterministic"
    baselines = [blind_bisection(g, precision) for _ in range(repeats)]
    base = baselines[-1]
    share = last.flop_share().share
    rows = [
        (precision, "accuracy guard", f"{statistics.median(r.seconds for r in runs):.1f}", last.executions,
         len(last.kept), "yes" if last.met else "NO", last.before.short(), last.after.short(), f"{share:.1%}"),
        (precision, "blind bisection (baseline)", f"{statistics.median(b['seconds'] for b in baselines):.1f}",
         base["executions"], base["kept"], "yes" if base["met"] else "NO", last.before.short(), base["after"],
         f"{base['share']:.1%}"),
    ]
    return rows, last.summary()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, action="append", help="encoder blocks (repeatable; default: 4 and 8)")
    parser.add_argument("--precision", action="append", choices=("float16", "bfloat16"),
                        help="repeatable; default: float16 and bfloat16")
    parser.add_argument("--output", default=str(ROOT / "docs" / "bench_guard.md"), help="markdown file, or -")
    args = parser.parse_args(argv)
    precisions = args.precision or ["float16", "bfloat16"]
    sizes = args.blocks or [4, 8]

    head = ("blocks (nodes)", "precision", "search", "seconds (median)", "graph executions", "nodes kept float32",
            "tolerance met", "plain conversion", "final error", "matmul FLOPs in low precision")
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summaries = []
    for blocks in sizes:
        g = fragile_transformer(blocks=blocks)
        for precision in precisions:
            rows, summary = bench(g, precision, args.repeats)
            table += [f"| {blocks} ({len(g.graph_def.node)}) | " + " | ".join(str(c) for c in row) + " |"
                      for row in rows]
            summaries += [f"### {blocks} blocks, {precision}", "", "```", summary, "```", ""]
    command = " ".join(["python tools/bench_guard.py", f"--repeats {args.repeats}"]
                       + [f"--blocks {b}" for b in sizes] + [f"--precision {p}" for p in precisions])
    text = "\n".join([
        "# Accuracy guard benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}. float16 kernels are emulated on this CPU (bfloat16 ones are native).",
        "",
        "Model: a Transformer encoder of 4 or 8 blocks built from keras layers (MultiHeadAttention, "
        "LayerNormalization, Dense), sequence 32, width 64, a batch of 8 calibration inputs, as a frozen GraphDef. "
        "Fragile on purpose: block 1's second feed-forward Dense has weights x3e4, so "
        "its activations exceed float16's 65504 (the LayerNormalization after it would bring them back), and the "
        "logits sit on a +1000 offset, where float16 resolves 0.5 and bfloat16 4, so the softmax drifts.",
        "",
        "Side by side in one process, on the same graph, inputs and tolerance (the precision's defaults, as "
        "`mp-rewrite verify` uses): the guard, and a blind bisection baseline that halves the same candidate units "
        "(an allow-list node and the nodes that follow it) with no range screen and no attribution, which is "
        "kinder than onnxconverter-common's auto_mixed_precision, which halves lists of single nodes. Seconds are "
        f"medians of {args.repeats} runs (every guard run gave the same result); they include rewriting and "
        "importing graphs, not building the model. The 2 cores are shared with other jobs, so seconds can move by "
        "a third from run to run; executions and results do not.",
        "",
        *table,
        "",
        "What the guard kept and why (the Reason details of the result's coloring), and its graph executions:",
        "",
        *summaries,
    ])
    print("\n".join(table))
    if args.output != "-":
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
