"""Training step time with the graph rewrite, side by side with float32 and Keras's mixed_bfloat16 policy.

Every variant runs in a process of its own (its own model, optimizer and traced `tf.function` step: forward,
backward and SGD update), started once per model; the parent makes them take turns, `--runs` rounds of `--steps`
steps each in rotating order, so only one computes at a time and load drifts hit every variant alike. Reported: the
median over rounds of each variant's wall and CPU time per step (CPU time: that process's own, all threads), and the
median over rounds of the per-round CPU ratio against Keras mixed_bfloat16.

Variants (`--variants`, ';'-separated; float32 always runs):

- float32: the plain Keras optimizer, no rewrite (the baseline)
- keras mixed_bfloat16: Keras's dtype policy (layers cast themselves), plain optimizer
- rewrite bfloat16: `enable_mixed_precision_graph_rewrite(opt, precision="bfloat16")`, the default (on a CPU the cost
  assignment: BatchNorm fused in the step, precision by measured cost, raced as the step runs)
- rewrite bfloat16, lists: the same with `assign="lists"` (Grappler's lists)
- float32 + LSO dynamic, rewrite bfloat16 + LSO dynamic, rewrite float16 + LSO fixed / dynamic (opt-in)

First-step cost: the first call (trace + rewrite + run) of each variant. The default rewrite is first set up in a
process of its own with an empty cost cache (`--cold`, on by default): its first call, then the calls until its
measuring across the first calls is done (and the seconds they took); the timed default process then starts from
that cache, as the next run of a training script does. Beside the times, what runs: Casts and low-precision
matmuls/convolutions in the executed step's FunctionDef.

Usage::

    python3 tools/bench_training.py                                  # small_cnn, res_cnn, transformer
    python3 tools/bench_training.py --models resnet50 --runs 5
    python3 tools/bench_training.py --models small_cnn --runs 3 --no-cold   # quick

Accuracy (float32 against the default rewrite, several seeds) is tools/parity_training.py's.

Models: small_cnn (4 conv + dense, no BatchNorm, 32x32, batch 32), res_cnn (a residual CNN with BatchNorm: stem +
4 basic blocks, 64x64, batch 16), transformer (4 encoder layers, d=256, 8 heads, FFN 1024 with GELU, 128 tokens,
batch `--transformer-batch`), resnet50 (Keras's, 128x128, batch `--batch`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = "rewrite bfloat16"
PEER = "keras mixed_bfloat16"
# label -> (rewrite precision or None, loss scale for the LSO or "none" for the plain optimizer, keras policy, assign)
VARIANTS = {
    "float32": (None, "none", None, None),
    "keras mixed_bfloat16": (None, "none", "mixed_bfloat16", None),
    DEFAULT: ("bfloat16", None, None, None),
    "rewrite bfloat16, lists": ("bfloat16", None, None, "lists"),
    "float32 + LSO dynamic": (None, "dynamic", None, None),
    "rewrite bfloat16 + LSO dynamic": ("bfloat16", "dynamic", None, None),
    "rewrite float16 + LSO fixed": ("float16", 2.0**15, None, "lists"),
    "rewrite float16 + LSO dynamic": ("float16", "dynamic", None, "lists"),
}
MAIN_VARIANTS = ("float32", PEER, DEFAULT, "rewrite bfloat16, lists")
CONTRACTIONS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "BatchMatMulV2", "Einsum",
                "_FusedConv2D", "_FusedMatMul", "DepthwiseConv2dNative")


# -- the worker: one variant in its own process ------------------------------------------------------------------


def build_model(name, args):
    import keras
    from mp_rewrite.testing.example_models import token_transformer
    if name == "transformer":
        return token_transformer()
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3), classes=10,
                                           classifier_activation=None)
    if name == "res_cnn":
        return residual_cnn()
    layers = [keras.Input((32, 32, 3))]
    for filters in (32, 32, 64, 64):
        layers += [keras.layers.Conv2D(filters, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D()]
    return keras.Sequential(layers + [keras.layers.Flatten(), keras.layers.Dense(10)])


def residual_cnn():
    """A small ResNet: a 3x3 stem and four basic blocks (two 3x3 convolutions with BatchNorm, a projected shortcut
    where the shape changes), global average pooling, 10 logits."""
    import keras
    L = keras.layers

    def conv_bn(x, filters, kernel, stride=1, relu=True):
        x = L.BatchNormalization()(L.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(x))
        return L.ReLU()(x) if relu else x

    inputs = keras.Input((64, 64, 3))
    x = conv_bn(inputs, 32, 3)
    for filters, stride in ((32, 1), (64, 2), (64, 1), (128, 2)):
        shortcut = x if stride == 1 and x.shape[-1] == filters else conv_bn(x, filters, 1, stride, relu=False)
        y = conv_bn(conv_bn(x, filters, 3, stride), filters, 3, relu=False)
        x = L.ReLU()(L.Add()([shortcut, y]))
    return keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling2D()(x)))


def batch_of(name, args):
    import tensorflow as tf
    from mp_rewrite.testing.example_models import TOKENS, VOCABULARY
    size = {"resnet50": args.batch, "transformer": args.transformer_batch, "res_cnn": 16}.get(name, 32)
    if name == "transformer":
        x = tf.random.stateless_uniform((size, TOKENS), seed=(1, 2), maxval=VOCABULARY, dtype=tf.int32)
    else:
        side = {"resnet50": args.size, "res_cnn": 64}.get(name, 32)
        x = tf.random.stateless_normal((size, side, side, 3), seed=(1, 2))
    return x, tf.random.stateless_uniform((size,), seed=(3, 4), maxval=10, dtype=tf.int32)


def make_step(model, opt, scaled):
    import keras
    import tensorflow as tf
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


def executed_counts(step, x, y) -> dict:
    """Casts and low-precision contractions in the step's FunctionDef as the eager context runs it."""
    import tensorflow as tf
    from tensorflow.python.eager import context
    name = step.get_concrete_function(x, y).name
    fdef = context.context().get_function_def(name.decode() if isinstance(name, bytes) else name)
    low = {tf.bfloat16.as_datatype_enum, tf.float16.as_datatype_enum}
    contractions = [n for n in fdef.node_def if n.op in CONTRACTIONS]
    return {"nodes": len(fdef.node_def), "casts": sum(n.op == "Cast" for n in fdef.node_def),
            "contractions": len(contractions), "low_contractions": sum(n.attr["T"].type in low for n in contractions),
            "fused_batch_norms": sum(n.op == "FusedBatchNormV3" for n in fdef.node_def)}


def worker(args):
    """Set one variant up, say READY with its first call, then run rounds on request ("run N", "quit")."""
    import logging
    import keras
    from mp_rewrite.training import api as training
    from mp_rewrite.training import deferred
    from mp_rewrite.training.api import wrap_optimizer
    logging.getLogger("mp_rewrite").setLevel(logging.ERROR)
    precision, loss_scale, policy, assign = VARIANTS[args.worker]
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(policy or "float32")
    model = build_model(args.model, args)
    keras.mixed_precision.set_global_policy("float32")
    opt = keras.optimizers.SGD(0.01)
    if precision is not None:
        kwargs = {"device": "cpu"} if precision == "float16" else {}
        kwargs.update({"assign": assign} if assign else {})
        opt = training.enable_mixed_precision_graph_rewrite(opt, loss_scale, precision=precision, **kwargs)
    elif loss_scale != "none":
        opt = wrap_optimizer(opt, loss_scale)
    step = make_step(model, opt, scaled=loss_scale != "none")
    x, y = batch_of(args.model, args)
    begin = time.perf_counter()
    step(x, y).numpy()
    ready = {"first_call": time.perf_counter() - begin, "pending": bool(deferred.pending())}
    if args.measure_only:  # the cold default: the calls its measuring takes
        begin, calls = time.perf_counter(), 0
        while deferred.pending() and calls < 1000:
            step(x, y).numpy()
            calls += 1
        ready.update(measure_calls=calls, measure_s=time.perf_counter() - begin)
    ready.update(executed_counts(step, x, y), assignment=assignment_line(training))
    say("READY", ready)
    for line in sys.stdin:
        if not line.startswith("run"):
            break
        steps = int(line.split()[1])
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = step(x, y)
        loss.numpy()
        say("TIMES", {"wall": (time.perf_counter() - wall) / steps, "cpu": (time.process_time() - cpu) / steps})


def assignment_line(training) -> str:
    """What the cost assignment chose for the step and from what, or ""."""
    chosen = [r.assignment for r in training.rewritten_functions().values() if r.assignment is not None]
    if not chosen:
        return ""
    a = max(chosen, key=lambda a: a.fp32_cost)  # the step (other rewritten functions are small helpers)
    return (f"{len(a.demoted)} of {len(a.candidates)} candidates kept float32; predicted {a.fp32_cost:.1f} ms float32, "
            f"{a.lists_cost:.1f} ms the lists, {a.cost:.1f} ms the cut, bound {a.bound:.1f} ms. {a.source}")


def say(kind, data):
    print(f"{kind} {json.dumps(data)}", flush=True)


# -- the parent: processes, rounds, the page ------------------------------------------------------------------------


class Process:
    """One variant's worker process."""

    def __init__(self, label, model, passed, env):
        argv = [sys.executable, os.path.abspath(__file__), "--worker", label, "--model", model, *passed]
        self.label, self.walls, self.cpus = label, [], []
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self.read("READY")

    def read(self, kind):
        for line in self.proc.stdout:
            if line.startswith(kind + " "):
                return json.loads(line[len(kind) + 1:])
        raise RuntimeError(f"{self.label}: the worker ended (exit {self.proc.wait()}) before saying {kind}")

    def run(self, steps):
        self.proc.stdin.write(f"run {steps}\n")
        self.proc.stdin.flush()
        times = self.read("TIMES")
        self.walls.append(times["wall"])
        self.cpus.append(times["cpu"])

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def child_env(cache):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    if cache:
        env["XDG_CACHE_HOME"] = cache
    return env


def bench_model(model, labels, args):
    cache = tempfile.mkdtemp(prefix="bench_training_cache_") if args.cold else None
    cold = None
    if cache and DEFAULT in labels:
        log(f"[{model}] {DEFAULT}: first call and measuring with an empty cost cache ...")
        process = Process(DEFAULT, model, args.passed + ["--measure-only"], child_env(cache))
        process.close()
        cold = process.ready
    processes = []
    for label in labels:
        log(f"[{model}] setting up {label} ...")
        processes.append(Process(label, model, args.passed, child_env(cache if label == DEFAULT else None)))
    steps = args.steps * (10 if model == "small_cnn" else 1)
    for p in processes:  # a warm-up round, not timed
        p.run(1)
        p.walls.clear(), p.cpus.clear()
    for r in range(args.runs):
        for p in processes[r % len(processes):] + processes[:r % len(processes)]:
            p.run(steps)
        log(f"[{model}] round {r + 1}/{args.runs}: "
            + ", ".join(f"{p.label} {p.cpus[-1] * 1e3:.0f} ms CPU" for p in processes))
    for p in processes:
        p.close()
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    return {"variants": [{"label": p.label, "walls": p.walls, "cpus": p.cpus, **p.ready} for p in processes],
            "cold": cold, "steps": steps}


def log(text):
    print(text, file=sys.stderr, flush=True)


def machine_facts() -> str:
    import tensorflow as tf
    import keras
    cpu, isa = platform.processor() or "?", []
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile") if f in flags]
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores (flags: {', '.join(isa) or 'no AVX-512 flags visible'}); TensorFlow "
            f"{tf.__version__} (oneDNN {'off' if os.environ.get('TF_ENABLE_ONEDNN_OPTS') == '0' else 'on'}), "
            f"Keras {keras.__version__}, Python {platform.python_version()}")


TITLES = {"small_cnn": "Small CNN without BatchNorm (4 conv + dense), 32x32x3, batch 32",
          "res_cnn": "Residual CNN with BatchNorm (stem + 4 basic blocks), 64x64x3, batch 16"}


def render(results, args, facts, load_before):
    lines = ["# Training step time: graph rewrite vs float32 vs Keras mixed_bfloat16", "",
             f"Command: `{shlex.join(['python3', 'tools/bench_training.py', *sys.argv[1:]])}`", "",
             f"Machine: {facts}. Load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} at the end.", "",
             f"Each variant in its own process; {args.runs} interleaved rounds (rotating order) after a warm-up "
             "round; medians over rounds. CPU time is the variant's process's own (all threads).", ""]
    for model, out in results.items():
        title = TITLES.get(model) or {
            "resnet50": f"ResNet-50, {args.size}x{args.size}x3, batch {args.batch}",
            "transformer": f"Transformer encoder (4 layers, d=256, 8 heads, FFN 1024, GELU), 128 tokens, batch "
                           f"{args.transformer_batch}"}[model]
        variants = out["variants"]
        base = variants[0]
        peer = next((v for v in variants if v["label"] == PEER), None)
        lines += [f"## {title}", "", f"{out['steps']} steps per round.", "",
                  "| variant | CPU ms/step | wall ms/step | vs float32 (CPU) | vs Keras mixed_bfloat16 (CPU / wall) | "
                  "first call (s) | Casts | low-precision matmul/conv | fused BatchNorms |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for v in variants:
            cpu, wall = statistics.median(v["cpus"]), statistics.median(v["walls"])
            against = "" if peer is None else (
                f"{statistics.median(b / a for a, b in zip(v['cpus'], peer['cpus'])):.2f}x / "
                f"{statistics.median(b / a for a, b in zip(v['walls'], peer['walls'])):.2f}x")
            lines.append(f"| {v['label']} | {cpu * 1e3:.1f} | {wall * 1e3:.1f} | "
                         f"{statistics.median(base['cpus']) / cpu:.2f}x | {against} | {v['first_call']:.2f} | "
                         f"{v['casts']} | {v['low_contractions']}/{v['contractions']} | {v['fused_batch_norms']} |")
        lines += first_step_lines(out)
        lines.append("")
    return "\n".join(lines)


def first_step_lines(out) -> list:
    by_label = {v["label"]: v for v in out["variants"]}
    lines = [""]
    default, lists, cold = by_label.get(DEFAULT), by_label.get("rewrite bfloat16, lists"), out["cold"]
    if default and lists:
        lines.append(f"First call, {DEFAULT} against the lists: warm cache {default['first_call']:.2f} s vs "
                     f"{lists['first_call']:.2f} s ({default['first_call'] - lists['first_call']:+.2f} s).")
    if cold and lists:
        lines.append(f"Empty cache: first call {cold['first_call']:.2f} s ({cold['first_call'] - lists['first_call']:+.2f}"
                     f" s against the lists); the measuring then took {cold['measure_calls']} calls, "
                     f"{cold['measure_s']:.1f} s including the steps themselves.")
    if default and default.get("assignment"):
        lines.append(f"{DEFAULT} chose: {default['assignment']}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default="small_cnn,res_cnn,transformer",
                        help="comma-separated, of small_cnn, res_cnn, transformer, resnet50")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per round (the small CNN ten times as many)")
    parser.add_argument("--batch", type=int, default=8, help="ResNet-50 batch size")
    parser.add_argument("--size", type=int, default=128, help="ResNet-50 image size")
    parser.add_argument("--transformer-batch", type=int, default=16, help="Transformer encoder batch size")
    parser.add_argument("--variants", default=";".join(MAIN_VARIANTS[1:]),
                        help="';'-separated labels to run besides float32, of: " + "; ".join(VARIANTS))
    parser.add_argument("--no-cold", dest="cold", action="store_false",
                        help="use this machine's cost cache, without the empty-cache first call")
    parser.add_argument("--out", help="also write the page here (e.g. docs/bench_raw/DATE_training.md)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    unknown = sorted(set(filter(None, args.variants.split(";"))) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; the variants are {list(VARIANTS)}")
    args.passed = [f"--batch={args.batch}", f"--size={args.size}", f"--transformer-batch={args.transformer_batch}"]
    labels = ["float32"] + [v for v in VARIANTS if v in set(args.variants.split(";")) - {"float32"}]
    load_before = os.getloadavg()[0]
    results = {model: bench_model(model, labels, args) for model in args.models.split(",")}
    page = render(results, args, machine_facts(), load_before)
    if args.out:
        with open(args.out, "w") as f:
            f.write(page)
    print(page)


if __name__ == "__main__":
    main()
