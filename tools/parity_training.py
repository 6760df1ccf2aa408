"""Accuracy parity of training: float32 against the default graph rewrite, several seeds each (issue 29).

    opt = enable_mixed_precision_graph_rewrite(opt, precision="bfloat16")   # on a CPU: the cost assignment

The data set is "synthetic digits", made here and deterministic (scikit-learn, whose digits would be the real
thing, is not a dependency; nothing is downloaded): ten 5x7 glyphs of the digits 0-9, each sample one glyph under a
random affine map (rotation, scale, shear, shift), stroke intensity and Gaussian pixel noise, 16x16 gray pixels in
[0, 1]. The noise is set so that a small CNN ends near, not at, 100% test accuracy, where the seeds spread.

The model is a small CNN with Keras 3's BatchNormalization (which the default fuses in the step), trained with
`model.fit` (Adam, its rate from 1e-3 down to 0 along a cosine, batch 64) for `--epochs` epochs; each run is a
process of its own (seed = Keras's seed: initial weights, shuffling, dropout); the runs go one after the other. The
default rewrite's runs share one cost cache, empty at the start (`--cache` to use another): the first measures the
step across its first calls, the others start from what it decided, as a user's next run does. Each run reports
its final test accuracy and loss, its time, and what its train step executed (bfloat16 matmuls/convolutions, fused
BatchNorms, Casts) and what the cost assignment chose. `model.evaluate` runs rewritten too (its step is traced
under the rewrite); beside its accuracy, the same weights evaluated eagerly (not a tf.function, so float32) say how
much of a gap is the evaluation's.

The check: the rewrite's mean test accuracy is within float32's seed-to-seed spread of float32's mean
(|mean rewrite - mean float32| <= max - min of float32's seeds, with a floor of `--floor` for when the float32
seeds happen to agree), and every run learned (>= `--learned`).

Usage::

    python3 tools/parity_training.py                        # 3 seeds each, 10 epochs
    python3 tools/parity_training.py --seeds 1 --epochs 3   # quick
    python3 tools/parity_training.py --assign lists         # Grappler's lists: every conv and matmul bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("float32", "rewrite bfloat16")
SIDE = 16
CONTRACTIONS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "_FusedConv2D", "_FusedMatMul")

# 5x7 glyphs of 0-9 ('#' ink).
GLYPHS = [
    [" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "],
    ["  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "],
    [" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"],
    ["#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "],
    ["   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "],
    ["#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "],
    ["  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "],
    ["#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "],
    [" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "],
    [" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "],
]


def synthetic_digits(n: int, seed: int, noise: float = 0.3):
    """(x [n, 16, 16, 1] float32 in [0, 1], y [n] int32): `n` samples of the ten glyphs, each under its own random
    affine map (bilinear sampling), intensity and Gaussian noise; the same `n` and `seed` give the same arrays."""
    rng = np.random.default_rng(seed)
    glyphs = np.pad(np.array([[[c == "#" for c in row] for row in g] for g in GLYPHS], np.float32),
                    ((0, 0), (1, 1), (1, 1)))  # [10, 9, 7]: a blank border, so sampling outside reads 0
    y = rng.integers(0, 10, n).astype(np.int32)
    angle = rng.uniform(-0.3, 0.3, n)
    scale = rng.uniform(1.6, 2.2, n)  # output pixels per glyph cell
    shear = rng.uniform(-0.3, 0.3, n)
    shift = rng.uniform(-2.0, 2.0, (n, 2))
    rows, cols = np.meshgrid(np.arange(SIDE) - (SIDE - 1) / 2, np.arange(SIDE) - (SIDE - 1) / 2, indexing="ij")
    r = (rows[None] - shift[:, :1, None]) / scale[:, None, None]
    c = (cols[None] - shift[:, 1:, None]) / scale[:, None, None]
    cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    src_r = cos * r - sin * c + 4.0  # glyph centre (row 4, col 3 of the padded 9x7)
    src_c = sin * r + cos * c + shear[:, None, None] * r + 3.0
    x = _bilinear(glyphs[y], src_r, src_c)
    x = x * rng.uniform(0.6, 1.0, (n, 1, 1)) + rng.normal(0.0, noise, x.shape)
    return np.clip(x, 0.0, 1.0).astype(np.float32)[..., None], y


def _bilinear(images, rows, cols):
    n, h, w = images.shape
    r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
    fr, fc = rows - r0, cols - c0
    index = np.arange(n)[:, None, None]

    def at(r, c):
        inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        return np.where(inside, images[index, np.clip(r, 0, h - 1), np.clip(c, 0, w - 1)], 0.0)

    return ((1 - fr) * (1 - fc) * at(r0, c0) + (1 - fr) * fc * at(r0, c0 + 1) + fr * (1 - fc) * at(r0 + 1, c0)
            + fr * fc * at(r0 + 1, c0 + 1))


def build_model():
    """Two blocks of two 3x3 convolutions with BatchNorm and ReLU, max pooling after each, a dense head."""
    import keras
    L = keras.layers
    x = inputs = keras.Input((SIDE, SIDE, 1))
    for filters in (32, 64):
        for _ in range(2):
            x = L.Conv2D(filters, 3, padding="same", use_bias=False)(x)
            x = L.ReLU()(L.BatchNormalization(momentum=0.9)(x))  # moving statistics settled within a short run
        x = L.MaxPooling2D()(x)
    x = L.Dense(128, activation="relu")(L.Flatten()(x))
    return keras.Model(inputs, L.Dense(10)(L.Dropout(0.3)(x)))


# -- one run, in its own process ------------------------------------------------------------------------------------


def train_once(variant: str, seed: int, epochs: int, train: int, test: int, batch: int = 64, rate: float = 1e-3,
               noise: float = 0.3, **enable) -> dict:
    """Train one model and return what `worker` prints: test accuracy and loss, time, what the step executed.

    Adam's rate starts at `rate`; `noise` is the data's (synthetic_digits). `enable` goes to
    enable_mixed_precision_graph_rewrite (the default: nothing). Runs in this process: the rewrite is enabled for
    the run and disabled after it.
    """
    import keras
    from mp_rewrite.training import api as training
    from mp_rewrite.training import deferred
    keras.utils.set_random_seed(seed)
    model = build_model()
    steps = epochs * -(-train // batch)
    opt = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(rate, steps))  # ends at rest, not mid-noise
    if variant != "float32":
        opt = training.enable_mixed_precision_graph_rewrite(opt, precision="bfloat16", **enable)
    try:
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        x, y = synthetic_digits(train, seed=0, noise=noise)
        x_test, y_test = synthetic_digits(test, seed=1, noise=noise)
        begin, cpu = time.perf_counter(), time.process_time()
        history = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
        took = {"train_s": time.perf_counter() - begin, "train_cpu_s": time.process_time() - cpu}
        loss, acc = model.evaluate(x_test, y_test, batch_size=256, verbose=0)  # rewritten like the step
        eager = np.concatenate([model(x_test[i:i + 500], training=False).numpy() for i in range(0, test, 500)])
        executed = executed_step(training) if variant != "float32" else {}
        return {"variant": variant, "seed": seed, "test_accuracy": float(acc), "test_loss": float(loss),
                "test_accuracy_float32_eval": float(np.mean(eager.argmax(axis=1) == y_test)),
                "train_loss": float(history.history["loss"][-1]), "pending": deferred.pending(), **took, **executed}
    finally:
        if variant != "float32":
            training.disable_mixed_precision_graph_rewrite(restore=False)


def executed_step(training) -> dict:
    """What Keras's train step ran at the end, read back from the eager context: bfloat16 matmuls/convolutions,
    Casts, fused BatchNorms; and what the cost assignment chose (or that the step runs float32 or the lists). The
    train step is the last traced `one_step_on_data` with convolution gradients (Keras traces it more than once;
    evaluate's has the same name and no gradients)."""
    import tensorflow as tf
    from tensorflow.python.eager import context
    ctx = context.context()
    found = []
    for name in ctx.list_function_names():
        if "one_step_on_data" in name and ctx.has_function(name):
            fdef = ctx.get_function_def(name)
            if any(n.op in ("Conv2DBackpropFilter", "Conv2DBackpropInput") for n in fdef.node_def):
                found.append((int(re.search(r"(\d+)$", name).group(1)), fdef))
    if not found:
        return {"step": "not found"}
    fdef = max(found, key=lambda f: f[0])[1]
    low = tf.bfloat16.as_datatype_enum
    contractions = [n for n in fdef.node_def if n.op in CONTRACTIONS]
    rewritten = training.rewritten_functions().get(fdef.signature.name)
    a = getattr(rewritten, "assignment", None)
    chose = ("float32 as traced" if rewritten is None else "Grappler's lists" if a is None else
             f"the cut ({len(a.demoted)} of {len(a.candidates)} kept float32)")
    return {"step": fdef.signature.name, "chose": chose, "casts": sum(n.op == "Cast" for n in fdef.node_def),
            "low_contractions": sum(n.attr["T"].type == low for n in contractions), "contractions": len(contractions),
            "fused_batch_norms": sum(n.op == "FusedBatchNormV3" for n in fdef.node_def)}


def worker(args):
    import logging
    logging.getLogger("mp_rewrite").setLevel(logging.ERROR)
    enable = {"assign": args.assign} if args.assign and args.worker != "float32" else {}
    result = train_once(args.worker, args.seed, args.epochs, args.train, args.test, **enable)
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent -----------------------------------------------------------------------------------------------------


def run(variant, seed, args, cache) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2", XDG_CACHE_HOME=cache)
    env.pop("MP_REWRITE_ASSIGN", None)  # the default, whatever the shell says
    argv = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--seed", str(seed),
            f"--epochs={args.epochs}", f"--train={args.train}", f"--test={args.test}",
            *([f"--assign={args.assign}"] if args.assign else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{variant}, seed {seed}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def verdict(runs, floor: float, learned: float) -> tuple[bool, str]:
    """(passed, one line): the rewrite's mean test accuracy within float32's seed spread of float32's mean."""
    acc = {v: [r["test_accuracy"] for r in runs if r["variant"] == v] for v in VARIANTS}
    spread = max(max(acc["float32"]) - min(acc["float32"]), floor)
    gap = statistics.mean(acc[VARIANTS[1]]) - statistics.mean(acc["float32"])
    low = min(min(a) for a in acc.values())
    ok = abs(gap) <= spread and low >= learned
    return ok, (f"{'PASS' if ok else 'FAIL'}: mean test accuracy, rewrite - float32 = {gap * 100:+.2f} points; "
                f"float32's seed spread (max - min, at least {floor * 100:.1f}) = {spread * 100:.2f} points; "
                f"lowest run {low * 100:.2f}% (must be >= {learned * 100:.0f}%)")


def render(runs, args, ok_line, load) -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_training import machine_facts
    assign = f', assign="{args.assign}")`' if args.assign else ")`, the default"
    lines = ["# Accuracy parity: float32 against the default graph rewrite", "",
             f"Command: `{shlex.join(['python3', 'tools/parity_training.py', *sys.argv[1:]])}`", "",
             f"Machine: {machine_facts()}. Load average {load[0]:.1f} before, {load[1]:.1f} at the end.", "",
             f"Synthetic digits, 16x16 ({args.train} train / {args.test} test samples, the same for every run); small "
             f"CNN with BatchNorm; `model.fit`, Adam (1e-3, cosine decay to 0), batch 64, {args.epochs} epochs. The "
             f'rewrite: `enable_mixed_precision_graph_rewrite(opt, precision="bfloat16"{assign}.', "",
             "| variant | seed | test accuracy | same weights, float32 eval | test loss | train loss | train s (CPU s) "
             "| step ran | bfloat16 matmul/conv | fused BatchNorms | Casts |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in runs:
        lines.append(f"| {r['variant']} | {r['seed']} | {r['test_accuracy'] * 100:.2f}% | "
                     f"{r['test_accuracy_float32_eval'] * 100:.2f}% | {r['test_loss']:.4f} | "
                     f"{r['train_loss']:.4f} | {r['train_s']:.1f} ({r['train_cpu_s']:.1f}) | {r.get('chose', '')} | "
                     + (f"{r['low_contractions']}/{r['contractions']} | {r['fused_batch_norms']} | {r['casts']} |"
                        if "contractions" in r else "| | |"))
    for v in VARIANTS:
        acc = [r["test_accuracy"] * 100 for r in runs if r["variant"] == v]
        lines.append(f"\n{v}: mean {statistics.mean(acc):.2f}%, min {min(acc):.2f}%, max {max(acc):.2f}%.")
    return "\n".join(lines + ["", ok_line, ""])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (1, 2, ...)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--train", type=int, default=8000, help="training samples")
    parser.add_argument("--test", type=int, default=4000, help="test samples")
    parser.add_argument("--floor", type=float, default=0.005, help="the least spread the check allows")
    parser.add_argument("--learned", type=float, default=0.8, help="the least test accuracy of any run")
    parser.add_argument("--assign", choices=("lists", "cost"),
                        help="the rewrite's assignment (default: the default's, the cost assignment on such a CPU)")
    parser.add_argument("--cache", help="XDG_CACHE_HOME of the rewrite's runs (default: a new empty folder)")
    parser.add_argument("--out", help="also write the page here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    load_before = os.getloadavg()[0]
    cache = args.cache or tempfile.mkdtemp(prefix="parity_training_cache_")
    runs = []
    try:
        for seed in range(1, args.seeds + 1):
            for variant in VARIANTS:
                runs.append(run(variant, seed, args, cache))
                r = runs[-1]
                print(f"{variant}, seed {seed}: test accuracy {r['test_accuracy'] * 100:.2f}%, "
                      f"{r['train_s']:.1f} s; {r.get('chose', '')}", file=sys.stderr, flush=True)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
    ok, line = verdict(runs, args.floor, args.learned)
    page = render(runs, args, line, (load_before, os.getloadavg()[0]))
    if args.out:
        with open(args.out, "w") as f:
            f.write(page)
    print(page)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
