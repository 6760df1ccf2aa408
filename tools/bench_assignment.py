"""Frozen graphs in float32, with Grappler's bfloat16 lists, and with the cost assignment (`assign="cost"`) over
the op table (ops timed alone) and over the costs measured in the graph (what `convert` uses), timed side by side
(interleaved rounds, wall and CPU time per call), beside what each table predicts and its bound (each candidate op
at its faster precision, casts not counted).

    TF_ENABLE_ONEDNN_OPTS=1 python3 tools/bench_assignment.py [--models cnn,transformer,resnet50] [--batch 8]
        [--rounds 5]

Prints the CPU's flags first: on a CPU without AVX512-BF16/AMX the cost assignment keeps everything float32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mp_rewrite  # noqa: E402
from mp_rewrite.analysis.graph_profile import profile_costs  # noqa: E402
from mp_rewrite.analysis.op_costs import machine_facts, measure_costs  # noqa: E402
from mp_rewrite.testing import example_models, examples  # noqa: E402


def small_cnn(image_size: int = 64):
    """Conv2D(+bias)+ReLU blocks with pooling, global pooling and a Dense head (what --freeze leaves of a CNN once
    batch norms are folded)."""
    import keras
    keras.utils.set_random_seed(0)
    x = inp = keras.Input((image_size, image_size, 3), name="image")
    for filters in (32, 64, 128, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(10)(x)
    return keras.Model(inp, out, name="small_cnn")


MODELS = {"cnn": small_cnn,
          "transformer": lambda: example_models.transformer_encoder(seq_len=128, d_model=256, heads=8, ff=1024),
          "resnet50": example_models.resnet50}


def runnable(graph_def, inputs, fetches):
    """A pruned tf.function running the GraphDef (Grappler's default optimizations, remapper fusions included)."""
    wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
    g = wrapped.graph
    return wrapped.prune([g.get_tensor_by_name(f"{n}:0") for n in inputs],
                         [g.get_tensor_by_name(f"{n}:0") for n in fetches])


def time_block(function, args, seconds: float) -> tuple[float, float]:
    """(wall ms, CPU ms) per call over a block of calls lasting about `seconds`."""
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while calls < 3 or time.perf_counter() - start < seconds:
        function(*args)
        calls += 1
    return (time.perf_counter() - start) / calls * 1e3, (time.process_time() - cpu) / calls * 1e3


def bench(name: str, batch: int, rounds: int, seconds: float) -> None:
    graph = examples.inference_graph(MODELS[name](), batch=batch)
    start = time.perf_counter()
    costs = measure_costs(graph.graph_def, "bfloat16", graph.fetches, batch=batch)
    measured = time.perf_counter() - start
    start = time.perf_counter()
    cost = mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches, assign="cost", costs=costs)
    assigned = time.perf_counter() - start
    lists = mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches)
    start = time.perf_counter()
    specs = [(tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)), f"{n}:0") for n, v in graph.inputs.items()]
    options = mp_rewrite.make_options("bfloat16")
    profile = profile_costs(graph.graph_def, specs, graph.fetches, options, list(graph.inputs), costs, batch,
                            refresh=True)
    profiled = mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches,
                                            assign="cost", costs=profile.table)
    in_graph = time.perf_counter() - start
    start = time.perf_counter()  # again: the costs now come from the cache, as when a model is converted again
    again = profile_costs(graph.graph_def, specs, graph.fetches, options, list(graph.inputs), costs, batch)
    mp_rewrite.rewrite_graph_def(graph.graph_def, "bfloat16", graph.fetches, assign="cost", costs=again.table)
    cached = time.perf_counter() - start
    results = {"lists bf16": lists, "op table bf16": cost, "in graph bf16": profiled}
    variants = {"fp32": graph.graph_def, **{k: r.graph_def for k, r in results.items()}}
    casts = {"fp32": 0, **{k: len(r.casts) for k, r in results.items()}}
    converted = {"fp32": 0, **{k: len(r.converted_nodes) for k, r in results.items()}}
    args = [tf.constant(v) for v in graph.inputs.values()]
    functions = {k: runnable(g, list(graph.inputs), graph.fetches) for k, g in variants.items()}
    want = functions["fp32"](*args)[0].numpy()
    diff = {k: float(np.max(np.abs(np.asarray(f(*args)[0], np.float32) - want))) for k, f in functions.items()}
    wall, cpu = {k: [] for k in functions}, {k: [] for k in functions}
    for _ in range(rounds):
        for k, f in functions.items():
            w, c = time_block(f, args, seconds)
            wall[k].append(w)
            cpu[k].append(c)
    print(f"\n## {name}, batch {batch} ({len(graph.graph_def.node)} nodes; op table from {costs.source}: "
          f"measure {measured:.2f} s, assignment {assigned:.2f} s; measured in the graph and assigned: {in_graph:.2f} s, "
          f"{cached:.2f} s cached)")
    print(f"{'variant':<12}{'wall ms':>9}{'x fp32':>8}{'CPU ms':>9}{'x fp32':>8}{'converted':>11}{'casts':>7}"
          f"{'max |diff|':>12}")
    base_w, base_c = statistics.median(wall["fp32"]), statistics.median(cpu["fp32"])
    for k in functions:
        w, c = statistics.median(wall[k]), statistics.median(cpu[k])
        print(f"{k:<12}{w:>9.2f}{base_w / w:>7.2f}x{c:>9.2f}{base_c / c:>7.2f}x{converted[k]:>11}{casts[k]:>7}"
              f"{diff[k]:>12.2e}")
    for what, a in (("the op table (ops timed alone)", cost.assignment),
                    ("the costs measured in the graph", profiled.assignment)):
        print(f"predicted by {what} for the {len(a.candidates)} candidates (ms): fp32 {a.fp32_cost:.2f}, lists "
              f"{a.lists_cost:.2f} ({a.fp32_cost / a.lists_cost:.2f}x), cut {a.cost:.2f} ({a.fp32_cost / a.cost:.2f}x; "
              f"{len(a.demoted)} kept fp32), bound {a.bound:.2f} ({a.fp32_cost / a.bound:.2f}x)" if a.cost else
              "nothing to convert")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cnn,transformer")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.5, help="length of one timed block")
    args = p.parse_args(argv)
    facts = machine_facts()
    print(f"CPU: {facts['cpu']}; flags: {', '.join(facts['cpu_flags'])}; TensorFlow {facts['tensorflow']}, "
          f"TF_ENABLE_ONEDNN_OPTS={facts['onednn']}, {facts['threads']} threads, load average "
          f"{os.getloadavg()[0]:.2f}")
    for name in args.models.split(","):
        bench(name, args.batch, args.rounds, args.seconds)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
