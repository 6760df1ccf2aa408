"""Training step time with the graph rewrite, side by side with float32 and Keras's mixed_bfloat16 policy.

For each model every variant gets its own model, optimizer and traced `tf.function` step (the issue's tf_keras-style
step: get_scaled_loss, get_unscaled_gradients, apply_gradients). The variants are timed interleaved, `--runs` rounds
of `--steps` steps each, and the median of the per-round step times is reported, so machine load drifts hit every
variant alike. Variants:

- float32: the plain Keras optimizer, no rewrite (the baseline)
- float32 + LSO fixed / dynamic: our LossScaleOptimizer without the rewrite (fixed 2**15 / dynamic from 2**15)
- keras mixed_bfloat16: Keras's dtype policy (layers cast themselves), plain optimizer
- rewrite bfloat16 (fixed 1, the default) / + dynamic LSO
- rewrite float16 + fixed 2**15 / + dynamic LSO (the default); rewritten for CPU (device="cpu")

Also: the one-off cost of the rewrite (the hook's work when the step is traced), and the overhead of dynamic
against fixed loss scaling. Prints a markdown page, and writes it to `--out` if given (docs/bench_training.md is
curated by hand from such pages in docs/bench_raw/, so the default writes nothing there).

Usage::

    python3 tools/bench_training.py                               # ResNet-50 (128x128, batch 8) + small CNN
    python3 tools/bench_training.py --models small_cnn --runs 3   # quick
    python3 tools/bench_training.py --models transformer --skip-float16   # opt-in: a Transformer encoder

Models: resnet50 (default), small_cnn (default), transformer (opt-in: 4 encoder layers, d=256, 8 heads, FFN 1024 with
GELU, sequence 128, vocabulary 8000, mean-pooled into 10 classes, the encoder of tools/bench_saved_model.py; batch
`--transformer-batch`).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

from mp_rewrite.training import api as training  # noqa: E402
from mp_rewrite.core.functions import function_to_graph, graph_to_function  # noqa: E402
from mp_rewrite.training.api import wrap_optimizer  # noqa: E402
from mp_rewrite.core.op_support import Signatures  # noqa: E402
from mp_rewrite.core.body import rewrite_body  # noqa: E402
from mp_rewrite.core.options import make_options  # noqa: E402
from mp_rewrite.testing.example_models import TOKENS, VOCABULARY, token_transformer  # noqa: E402

# name -> (rewrite precision or None, loss_scale for the LSO or "none" for the plain optimizer, keras policy)
VARIANTS = {
    "float32": (None, "none", None),
    "float32 + LSO fixed": (None, 2.0**15, None),
    "float32 + LSO dynamic": (None, "dynamic", None),
    "keras mixed_bfloat16": (None, "none", "mixed_bfloat16"),
    "rewrite bfloat16": ("bfloat16", None, None),
    "rewrite bfloat16 + LSO dynamic": ("bfloat16", "dynamic", None),
    "rewrite bfloat16, assign cost": ("bfloat16", None, None),
    "rewrite float16 + LSO fixed": ("float16", 2.0**15, None),
    "rewrite float16 + LSO dynamic": ("float16", "dynamic", None),
}
COST_VARIANTS = frozenset({"rewrite bfloat16, assign cost"})  # assign="cost": op costs measured here, cached
# Matched on the variant's precision, not its label ("bfloat16" contains "float16").
FLOAT16_VARIANTS = frozenset(label for label, (precision, _, _) in VARIANTS.items() if precision == "float16")
OVERHEAD_PAIRS = (("float32 + LSO dynamic", "float32 + LSO fixed"),
                  ("rewrite bfloat16 + LSO dynamic", "rewrite bfloat16"),
                  ("rewrite float16 + LSO dynamic", "rewrite float16 + LSO fixed"))
ONEDNN_SET = "TF_ENABLE_ONEDNN_OPTS=1 " if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1" else ""  # for the page
PEER = "keras mixed_bfloat16"  # what the rewrite variants are compared with, round by round


def build_model(name, size):
    if name == "transformer":
        return token_transformer()
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=10,
                                           classifier_activation=None)
    layers = [keras.Input((32, 32, 3))]
    for filters in (32, 32, 64, 64):
        layers += [keras.layers.Conv2D(filters, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D()]
    return keras.Sequential(layers + [keras.layers.Flatten(), keras.layers.Dense(10)])


class Variant:
    """One model + optimizer + traced step, set up under its own precision settings."""

    def __init__(self, label, model_name, size, batch):
        precision, loss_scale, policy = VARIANTS[label]
        self.label = label
        keras.utils.set_random_seed(0)
        keras.mixed_precision.set_global_policy(policy or "float32")
        self.model = build_model(model_name, size)
        keras.mixed_precision.set_global_policy("float32")
        opt = keras.optimizers.SGD(0.01)
        if precision is not None:
            kwargs = {"device": "cpu"} if precision == "float16" else {}
            kwargs.update({"assign": "cost"} if label in COST_VARIANTS else {})
            opt = training.enable_mixed_precision_graph_rewrite(opt, loss_scale, precision=precision, **kwargs)
        elif loss_scale != "none":
            opt = wrap_optimizer(opt, loss_scale)
        self.opt = opt
        self.step = make_step(self.model, opt, scaled=loss_scale != "none")
        if model_name == "transformer":
            self.x = tf.random.stateless_uniform((batch, TOKENS), seed=(1, 2),
                                                 maxval=VOCABULARY, dtype=tf.int32)
        else:
            shape = (batch, size, size, 3) if model_name == "resnet50" else (batch, 32, 32, 3)
            self.x = tf.random.stateless_normal(shape, seed=(1, 2))
        self.y = tf.random.stateless_uniform((batch,), seed=(3, 4), maxval=10, dtype=tf.int32)
        earlier = set(training.rewritten_functions())
        start = time.perf_counter()
        self.step(self.x, self.y).numpy()  # trace (+ rewrite) + first run
        self.first_call = time.perf_counter() - start
        self.results = {name: result for name, result in training.rewritten_functions().items()
                        if name not in earlier} if precision else {}  # this variant's (one process runs them all)
        if precision is not None:
            training.disable_mixed_precision_graph_rewrite(restore=False)  # keep this step rewritten
        self.times, self.cpu_times = [], []

    def run(self, steps):
        """Time `steps` steps: wall seconds per step and this process's CPU seconds per step (all threads)."""
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = self.step(self.x, self.y)
        loss.numpy()
        self.times.append((time.perf_counter() - wall) / steps)
        self.cpu_times.append((time.process_time() - cpu) / steps)

    @property
    def median(self):
        return statistics.median(self.times)

    @property
    def cpu_median(self):
        return statistics.median(self.cpu_times)


def make_step(model, opt, scaled):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            target = opt.get_scaled_loss(loss) if scaled else loss
        grads = tape.gradient(target, model.trainable_variables)
        if scaled:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def rewrite_cost(variant, repeats=3):
    """Seconds the pass takes on the float32 step's FunctionDef (what the hook does at trace time), per precision."""
    name = variant.step.get_concrete_function(variant.x, variant.y).name
    fdef = context.context().get_function_def(name.decode() if isinstance(name, bytes) else name)
    signatures = Signatures(None)
    out = {"nodes": len(fdef.node_def)}
    for precision in ("bfloat16", "float16"):
        options = make_options(precision, device="cpu")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            body = function_to_graph(fdef, signatures)
            result = rewrite_body(body.graph_def, options, body.retvals, (), signatures, preserve_stateful=True)
            graph_to_function(result.graph_def, fdef, signatures)
            times.append(time.perf_counter() - start)
        out[precision] = (statistics.median(times), len(result.converted_nodes))
    return out


def steps_for(model_name, args) -> int:
    """Steps per round: the small CNN's 5 ms steps get ten times as many, so a round outlasts the cache misses of
    switching variants."""
    return args.steps * (10 if model_name == "small_cnn" else 1)


def bench_model(model_name, args):
    chosen = {"float32", *args.variants.split(";")} if args.variants else set(VARIANTS)  # float32: the baseline
    labels = [v for v in VARIANTS if v in chosen and not (args.skip_float16 and v in FLOAT16_VARIANTS)]
    variants = []
    for label in labels:
        print(f"[{model_name}] setting up {label} ...", file=sys.stderr, flush=True)
        batch = {"resnet50": args.batch, "transformer": args.transformer_batch}.get(model_name, 32)
        variants.append(Variant(label, model_name, args.size, batch))
    for v in variants:  # a warm-up round (oneDNN primitive caches, allocator), not timed
        v.run(1)
        v.times.clear()
        v.cpu_times.clear()
    for r in range(args.runs):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:  # rotate: no variant always first
            slow = v.label in FLOAT16_VARIANTS and model_name == "resnet50"
            v.run(1 if slow else steps_for(model_name, args))
        print(f"[{model_name}] round {r + 1}/{args.runs}: " + ", ".join(f"{v.label} {v.times[-1] * 1e3:.0f} ms"
                                                                       for v in variants), file=sys.stderr, flush=True)
    return variants, rewrite_cost(variants[0])


def machine_facts():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if f in flags]
    except (OSError, StopIteration):
        isa = []
    return (f"{cpu}, {os.cpu_count()} cores ({', '.join(isa) or 'no AVX-512 flags visible'}); TensorFlow "
            f"{tf.__version__} (oneDNN {'off' if os.environ.get('TF_ENABLE_ONEDNN_OPTS') == '0' else 'on'}), "
            f"Keras {keras.__version__}, Python {platform.python_version()}")


def predicted_lines(variants) -> list:
    """What the cost assignment predicted for each cost variant's step, from the step's own measured node times:
    the candidate ops in float32, as Grappler's lists make them, as the cut chose, and the bound (each at its faster
    precision, casts free) -- what any choice of precisions could reach on those ops."""
    lines = []
    for v in variants:
        chosen = [r.assignment for r in v.results.values() if r.assignment is not None]
        if v.label not in COST_VARIANTS or not chosen:
            continue
        a = max(chosen, key=lambda a: a.fp32_cost)  # the step (other rewritten functions are small helpers)
        lines += ["", f"{v.label}, predicted: the {len(a.candidates)} candidate ops of the step cost "
                  f"{a.fp32_cost:.1f} ms in float32, {a.lists_cost:.1f} ms as Grappler's lists make them "
                  f"({a.fp32_cost / a.lists_cost:.2f}x), {a.cost:.1f} ms as the cut chose ({len(a.demoted)} kept "
                  f"float32, {a.fp32_cost / a.cost:.2f}x); bound {a.bound:.1f} ms ({a.fp32_cost / a.bound:.2f}x: "
                  "each at its faster precision, casts free). The times: "
                  f"{a.source or 'the op table (each op timed alone)'}."]
    return lines


def render(results, args, facts):
    lines = ["# Training step time: graph rewrite vs float32 vs Keras mixed_bfloat16", "",
             f"Command: `{ONEDNN_SET}{shlex.join(['python3', 'tools/bench_training.py', *sys.argv[1:]])}`", "",
             f"Machine: {facts}.", "",
             f"Medians of {args.runs} interleaved rounds (rotating order) after a warm-up round ({args.steps} steps "
             f"per round, the small CNN {steps_for('small_cnn', args)}; ResNet-50 float16 rounds: 1 step). Wall "
             "time is what a user waits; CPU time (this process, all threads) is less sensitive to other load on "
             f"the machine (load average {args.load_before:.1f} before, {os.getloadavg()[0]:.1f} at the end, on "
             f"{os.cpu_count()} cores). The step is forward + "
             "backward + SGD update in one `tf.function`; \"rewrite\" variants run the "
             "mp_rewrite graph rewrite of that function (float16 rewritten for CPU with `device=\"cpu\"`). LSO = "
             "mp_rewrite's LossScaleOptimizer.", ""]
    for model_name, (variants, cost) in results.items():
        title = {"resnet50": f"ResNet-50, {args.size}x{args.size}x3, batch {args.batch}",
                 "transformer": f"Transformer encoder (4 layers, d=256, 8 heads, FFN 1024, GELU), "
                                f"{TOKENS} tokens, batch {args.transformer_batch}"}.get(
                     model_name, "Small CNN (4 conv + dense), 32x32x3, batch 32")
        base = variants[0].median
        cpu_base = variants[0].cpu_median
        lines += [f"## {title}", "",
                  "| variant | wall ms/step | speed-up vs float32 (wall) | CPU ms/step | speed-up vs float32 (CPU) "
                  "| first call: trace + rewrite + run (s) |", "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {v.label} | {v.median * 1e3:.1f} | {base / v.median:.2f}x | {v.cpu_median * 1e3:.1f} | "
                  f"{cpu_base / v.cpu_median:.2f}x | {v.first_call:.1f} |" for v in variants]
        by_label = {v.label: v for v in variants}
        if PEER in by_label:
            peer = by_label[PEER]
            lines += ["", f"Against {PEER}, same rounds (median over rounds of the per-round speed-up):", ""]
            for v in variants:
                if v.label.startswith("rewrite"):
                    cpu = statistics.median(b / a for a, b in zip(v.cpu_times, peer.cpu_times))
                    wall = statistics.median(b / a for a, b in zip(v.times, peer.times))
                    lines.append(f"- {v.label}: CPU time {cpu:.2f}x, wall {wall:.2f}x")
        lines += predicted_lines(variants)
        lines += ["", "Dynamic against fixed loss scaling, same precision (median over rounds of the per-round ratio):",
                  ""]
        for dynamic, fixed in OVERHEAD_PAIRS:
            if dynamic in by_label and fixed in by_label:
                d, f = by_label[dynamic], by_label[fixed]
                over_cpu = statistics.median(a / b for a, b in zip(d.cpu_times, f.cpu_times)) - 1
                over_wall = statistics.median(a / b for a, b in zip(d.times, f.times)) - 1
                lines.append(f"- {dynamic} vs {fixed}: CPU time {over_cpu * 100:+.1f}%, wall {over_wall * 100:+.1f}%")
        lines += ["", f"Rewrite cost at trace time (the pass on the {cost['nodes']}-node step FunctionDef, median "
                  "of 3): "
                  + "; ".join(f"{p} {cost[p][0]:.2f} s ({cost[p][1]} nodes converted)"
                              for p in ("bfloat16", "float16")) + ".", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default="resnet50,small_cnn", help="comma-separated, of resnet50, small_cnn, "
                        "transformer (opt-in)")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="ResNet-50 batch size")
    parser.add_argument("--size", type=int, default=128, help="ResNet-50 image size")
    parser.add_argument("--transformer-batch", type=int, default=16, help="Transformer encoder batch size")
    parser.add_argument("--skip-float16", action="store_true", help="leave out the (slow on CPU) float16 variants")
    parser.add_argument("--variants", default="", help="';'-separated labels to run besides float32 (default: "
                        "all), e.g. 'keras mixed_bfloat16;rewrite bfloat16;rewrite bfloat16, assign cost'")
    parser.add_argument("--out", help="also write the page here (e.g. docs/bench_raw/DATE_training.md)")
    args = parser.parse_args(argv)
    args.load_before = os.getloadavg()[0]
    unknown = sorted(set(filter(None, args.variants.split(";"))) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; the variants are {list(VARIANTS)}")
    logging.getLogger("mp_rewrite").setLevel(logging.ERROR)  # the CPU float16 and existing-function warnings
    tf.get_logger().setLevel(logging.ERROR)  # "N out of the last N calls triggered retracing": one step per variant
    results = {name: bench_model(name, args) for name in args.models.split(",")}
    page = render(results, args, machine_facts())
    if args.out:
        with open(args.out, "w") as f:
            f.write(page)
    print(page)


if __name__ == "__main__":
    main()
