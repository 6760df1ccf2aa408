"""Benchmark: inference latency of SavedModels converted by `mp-rewrite convert --precision bfloat16`, side by side
with the float32 original, TensorFlow's own `auto_mixed_precision_onednn_bfloat16` Grappler rewrite, and the Keras
`mixed_bfloat16` policy, on Keras ResNet-50, MobileNetV2 and a Transformer encoder (random weights).

    python3 tools/bench_saved_model.py [--models resnet50,mobilenetv2,transformer] [--batches 8,32]
                                       [--rounds 10] [--block-seconds 1.5] [--out docs/bench_saved_model.png]

Method: every variant runs in its own subprocess (TF's optimizer options are process-global), all four stay loaded
at once and are timed in interleaved blocks (round r runs the variants in rotated order), so a change in the
machine's load hits every variant alike; each block runs the signature several times and the table shows medians
over all calls. Each worker also records, once, which matmul/conv kernels TF really executed in bfloat16 (eager run
metadata), and its outputs, so that the table can show that TF's rewrite took effect. The conversion time of
ResNet-50 is the median of 3 in-process `convert_saved_model` calls, plus one end-to-end CLI run.
Writes the table to docs/bench_saved_model.md and a bar chart to --out (if matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the `tensorflow` wheel leaves oneDNN off (see tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("fp32", "ours", "ours_freeze", "ours_tuned", "tf_amp", "keras_mixed", "ours_mm")
LABELS = {"fp32": "float32", "ours": "mp-rewrite bf16", "ours_freeze": "mp-rewrite bf16 --freeze",
          "ours_tuned": "mp-rewrite --freeze --tune",
          "tf_amp": "TF AMP (oneDNN bf16)", "keras_mixed": "Keras mixed_bfloat16",
          "ours_mm": "mp-rewrite bf16, matmul/conv only"}
# An extra variant, not Grappler's lists: only the allow ops (matmul/conv) in bf16, every elementwise op float32.
MATMUL_CONV_ONLY = "[infer]\nops = []\n[clear]\nops = []\n"
MODELS = {"resnet50": "Keras ResNet-50 (224x224)", "mobilenetv2": "Keras MobileNetV2 (224x224)",
          "efficientnetb0": "Keras EfficientNetB0 (224x224)",
          "transformer": "Transformer encoder (4 layers, d=256, 8 heads, seq 128)"}


# --------------------------------------------------------------------------------------------- models


def build_model(name: str):
    """The Keras model `name` with random weights, in the current dtype policy."""
    import keras
    keras.utils.set_random_seed(0)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None)
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None)
    if name == "efficientnetb0":
        return keras.applications.EfficientNetB0(weights=None)
    tokens = keras.Input((128,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(8000, 256)(tokens)
    for _ in range(4):
        attention = keras.layers.MultiHeadAttention(num_heads=8, key_dim=32)(x, x)
        x = keras.layers.LayerNormalization()(x + attention)
        ffn = keras.layers.Dense(256)(keras.layers.Dense(1024, activation="gelu")(x))
        x = keras.layers.LayerNormalization()(x + ffn)
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(10)(pooled))


def prepare(name: str, workdir: Path) -> tuple[dict, dict]:
    """Export the float32 and the Keras mixed_bfloat16 SavedModels (same weights) and convert the float32 one.

    Returns:
        ({variant: SavedModel path}, conversion facts for this model).
    """
    import keras

    from mp_rewrite.savedmodel.convert import convert_saved_model
    paths = {"fp32": workdir / name / "fp32", "ours": workdir / name / "ours_bf16",
             "keras_mixed": workdir / name / "keras_mixed_bf16", "ours_mm": workdir / name / "ours_mm_bf16",
             "ours_freeze": workdir / name / "ours_freeze_bf16", "ours_tuned": workdir / name / "ours_tuned"}
    paths["tf_amp"] = paths["fp32"]
    if not (paths["fp32"] / "saved_model.pb").exists() or not (paths["keras_mixed"] / "saved_model.pb").exists():
        model = build_model(name)
        model.export(str(paths["fp32"]), verbose=False)
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            mixed = build_model(name)
            mixed.set_weights(model.get_weights())
            mixed.export(str(paths["keras_mixed"]), verbose=False)
        finally:
            keras.mixed_precision.set_global_policy("float32")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        result = convert_saved_model(paths["fp32"], paths["ours"], "bfloat16", overwrite=True)
        times.append(time.perf_counter() - start)
    freeze_times = []
    for _ in range(3):
        start = time.perf_counter()
        convert_saved_model(paths["fp32"], paths["ours_freeze"], "bfloat16", freeze=True, overwrite=True)
        freeze_times.append(time.perf_counter() - start)
    from mp_rewrite.savedmodel.tune import tune_saved_model
    tuned = tune_saved_model(paths["fp32"], paths["ours_tuned"], "bfloat16", freeze=True, overwrite=True, rounds=3)
    lists = workdir / "matmul_conv_only.toml"
    lists.write_text(MATMUL_CONV_ONLY)
    convert_saved_model(paths["fp32"], paths["ours_mm"], "bfloat16", lists_file=str(lists), overwrite=True)
    facts = {"convert_s": statistics.median(times), "freeze_s": statistics.median(freeze_times),
             "tuned": tuned.chosen,
             "freeze_mb": sum(f.stat().st_size for f in paths["ours_freeze"].rglob("*") if f.is_file()) / 1e6,
             "flop_share": result.flops.share,
             "converted": result.converted_nodes, "casts": result.casts,
             "size_mb": sum(f.stat().st_size for f in paths["fp32"].rglob("*") if f.is_file()) / 1e6}
    return paths, facts


def cli_convert_seconds(source: Path, output: Path, *options: str) -> float:
    """Wall time of `mp-rewrite convert SOURCE OUTPUT --precision bfloat16 --overwrite [OPTIONS]` (TF start-up
    included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mp_rewrite", "convert", str(source), str(output), "--precision",
                    "bfloat16", "--overwrite", *options], check=True, capture_output=True)
    return time.perf_counter() - start


# --------------------------------------------------------------------------------------------- worker


def _executed_kernels(function, inputs) -> tuple[int, int, dict]:
    """(bf16 matmul/conv kernels, all matmul/conv kernels, {"op dtype": count} of every node) in the graphs TF
    executed for one call (eager run metadata)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.eager import context
    context.enable_run_metadata()
    function(**inputs)
    metadata = context.export_run_metadata()
    context.disable_run_metadata()
    low = total = 0
    census = {}
    for graph in metadata.function_graphs:
        for partition in graph.partition_graphs:
            for node in partition.node:
                dtype = types_pb2.DataType.Name(node.attr["T"].type) if "T" in node.attr else ""
                census[f"{node.op} {dtype}"] = census.get(f"{node.op} {dtype}", 0) + 1
                if any(k in node.op for k in ("Conv", "MatMul", "Einsum")):
                    total += 1
                    low += dtype == "DT_BFLOAT16"
    return low, total, census


def worker(variant: str, path: str, batch: int, outputs_file: str) -> None:
    """Load one variant, warm it up, report, then answer "run N" lines with N call times (JSON) until EOF."""
    import numpy as np
    import tensorflow as tf

    from mp_rewrite.savedmodel.inputs import signature_inputs
    if variant == "tf_amp":
        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    function = tf.saved_model.load(path).signatures["serving_default"]
    arrays, _ = signature_inputs("serving_default", function.structured_input_signature[1], {}, batch, seed=0)
    inputs = {k: tf.constant(v) for k, v in arrays.items()}
    low, total, census = _executed_kernels(function, inputs)  # the first call: TF records graphs as it builds them
    start = time.perf_counter()
    for _ in range(3):
        outputs = function(**inputs)
    warm = (time.perf_counter() - start) / 3
    np.savez(outputs_file, **{k: tf.cast(v, tf.float32).numpy() for k, v in outputs.items()})
    print(json.dumps({"ready": True, "warm_s": warm, "bf16_kernels": low, "kernels": total, "census": census}),
          flush=True)
    for line in sys.stdin:
        times, cpu = [], []
        for _ in range(int(line.split()[1])):
            start, start_cpu = time.perf_counter(), time.process_time()
            for value in function(**inputs).values():
                value.numpy()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(json.dumps({"times": times, "cpu": cpu}), flush=True)


class Worker:
    """A variant loaded in its own subprocess."""

    def __init__(self, variant: str, path: Path, batch: int, outputs_file: Path, log: Path):
        self.variant, self.outputs_file = variant, outputs_file
        self.log = open(log, "a")
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", variant, str(path), str(batch),
                                      str(outputs_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, cwd=ROOT)
        self.info = None

    def ready(self) -> dict:
        """Wait until the model is loaded and warm; return its report."""
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.variant} died; see {self.log.name}")
        self.info = json.loads(line)
        return self.info

    def run(self, calls: int) -> dict:
        """Time `calls` calls: {"times": wall seconds, "cpu": CPU seconds of the process (all threads)}."""
        self.proc.stdin.write(f"run {calls}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        self.log.close()


# --------------------------------------------------------------------------------------------- measuring


def measure(name: str, batch: int, paths: dict, workdir: Path, rounds: int, block_seconds: float) -> dict:
    """Median latency (ms) of every variant for one model and batch size, timed in interleaved blocks."""
    import numpy as np
    workers = {v: Worker(v, paths[v], batch, workdir / f"{name}_b{batch}_{v}.npz", workdir / "workers.log")
               for v in VARIANTS}
    try:
        infos = {v: w.ready() for v, w in workers.items()}
        calls = max(1, round(block_seconds / max(i["warm_s"] for i in infos.values())))
        times, cpu = {v: [] for v in VARIANTS}, {v: [] for v in VARIANTS}
        for r in range(rounds):
            for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
                block = workers[v].run(calls)
                times[v] += block["times"]
                cpu[v] += block["cpu"]
    finally:
        for w in workers.values():
            w.close()
    outputs = {v: np.load(workdir / f"{name}_b{batch}_{v}.npz") for v in VARIANTS}
    diff = {v: max(float(np.abs(outputs[v][k] - outputs["fp32"][k]).max()) for k in outputs["fp32"].files)
            for v in VARIANTS}
    return {"model": name, "batch": batch, "ms": {v: 1000 * statistics.median(t) for v, t in times.items()},
            "cpu_ms": {v: 1000 * statistics.median(t) for v, t in cpu.items()},
            "calls": {v: len(t) for v, t in times.items()}, "diff_vs_fp32": diff,
            "kernels": {v: (infos[v]["bf16_kernels"], infos[v]["kernels"]) for v in VARIANTS},
            "same_graph_as_tf_amp": infos["ours"]["census"] == infos["tf_amp"]["census"],
            "casts": {v: sum(n for op, n in infos[v]["census"].items() if op.startswith("Cast ")) for v in VARIANTS}}


# --------------------------------------------------------------------------------------------- reporting

NOTES = """Notes:

- "TF executes the same nodes" compares the census (op, dtype -> count) of the graphs TensorFlow ran for the
  mp-rewrite model and for TF's own rewrite of the float32 model (eager run metadata). Where it says yes, the two
  run the same kernels and any difference between their columns is measurement noise.
- Keras 3 lowers BatchNormalization to Mul/AddV2 (not FusedBatchNormV3, which oneDNN would fuse into the
  convolution). Grappler's bfloat16 lists put those ops (infer list) and Relu6 (clear list) in bfloat16 between
  convolutions, and TensorFlow runs bfloat16 elementwise ops through Eigen, which on this CPU is slower than
  float32 (a [8,56,56,144] Mul+Add: 2.9 ms float32, 4.4 ms bfloat16; Relu6 1.8 vs 3.5 ms; a depthwise conv 3.5 vs
  2.0 ms). Models dominated by BatchNorm + activation (MobileNetV2) are therefore slower in bfloat16 with every
  variant that follows Grappler's lists.
- "matmul/conv only" is not Grappler's lists: the same conversion with a `--lists` file that empties the infer and
  clear lists (`[infer] ops = []`, `[clear] ops = []`), so only MatMul/Conv/Einsum run in bfloat16 with casts
  around them.
- With random weights MobileNetV2's softmax output is uniform, so its output differences say little."""


def machine() -> dict:
    """Facts about this machine and the software."""
    import keras
    import tensorflow as tf
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    flags = open("/proc/cpuinfo").read()
    features = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f in flags]
    return {"cpu": cpu, "cores": os.cpu_count(), "features": features, "tensorflow": tf.__version__,
            "keras": keras.__version__, "python": platform.python_version()}


def table(rows: list[dict], key: str = "ms") -> list[str]:
    """Markdown table: median ms per variant (wall latency, or CPU time with key="cpu_ms"), then every variant's
    speed-up over float32 (float32 ms / its ms; > 1 is faster than float32)."""
    others = [v for v in VARIANTS if v != "fp32"]
    head = ("| model | batch | " + " | ".join(f"{LABELS[v]} ms" for v in VARIANTS) + " | " +
            " | ".join(f"{LABELS[v]} vs float32" for v in others) + " | TF runs the same nodes for ours and TF AMP |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        ms = row[key]
        lines.append(f"| {row['model']} | {row['batch']} | " + " | ".join(f"{ms[v]:.1f}" for v in VARIANTS) + " | " +
                     " | ".join(f"{ms['fp32'] / ms[v]:.2f}x" for v in others) +
                     f" | {'yes' if row['same_graph_as_tf_amp'] else 'no'} |")
    return lines


def chart(rows: list[dict], path: Path) -> str:
    """A grouped bar chart of speed-up over float32 per model and batch; returns a note for the report."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    width = 0.8 / len(VARIANTS)
    for ax, key, what in zip(axes, ("ms", "cpu_ms"), ("wall-clock latency", "CPU time per call")):
        for i, v in enumerate(VARIANTS):
            speedups = [row[key]["fp32"] / row[key][v] for row in rows]
            offset = (i - (len(VARIANTS) - 1) / 2) * width
            bars = ax.bar([x + offset for x in range(len(rows))], speedups, width, label=LABELS[v])
            ax.bar_label(bars, fmt="%.2f", fontsize=6)
        ax.set_ylabel("speed-up over float32")
        ax.set_ylim(0, 1.3 * max(row[key]["fp32"] / row[key][v] for row in rows for v in VARIANTS))
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_title(f"SavedModel inference, bfloat16 variants vs float32: {what} (median; higher is better)",
                     fontsize=10)
    axes[0].legend(fontsize=8, ncol=3)
    axes[1].set_xticks(range(len(rows)), [f"{r['model']}\nbatch {r['batch']}" for r in rows])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return f"chart: {path}"


def report(rows, facts, cli_seconds, info, load, command, note) -> str:
    """The markdown page."""
    lines = ["# SavedModel conversion benchmark", "", f"Command: `{command}`", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, {', '.join(info['features']) or 'no bf16 ISA'}; "
             f"TensorFlow {info['tensorflow']}, Keras {info['keras']}, Python {info['python']}. "
             f"Load average before/after: {load[0]:.2f} / {load[1]:.2f} (a shared machine: the interleaved "
             "blocks keep the comparison fair, absolute numbers vary).", "",
             "Median wall-clock latency of one `serving_default` call (ms), and each variant's speed-up over float32 "
             "(> 1 is faster than float32):", ""] + table(rows)
    lines += ["", "Median CPU time of one call (ms, all threads of the worker process; less sensitive to other "
              "processes on a shared machine):", ""] + table(rows, "cpu_ms")
    lines += ["", "Conversion (`convert_saved_model`, bfloat16, in-process median of 3; CLI wall time includes "
              "starting TensorFlow):", "", "| model | SavedModel MB | --freeze MB | convert s | --freeze s | CLI s "
              "(--freeze) | --tune chose | nodes converted | casts | matmul/conv FLOPs in bf16 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in facts.items():
        cli = "{:.1f} ({:.1f})".format(*cli_seconds[name]) if name in cli_seconds else "-"
        lines.append(f"| {name} | {f['size_mb']:.0f} | {f['freeze_mb']:.0f} | {f['convert_s']:.2f} | "
                     f"{f['freeze_s']:.2f} | {cli} | {f['tuned']} | {f['converted']} | {f['casts']} | "
                     f"{f['flop_share']:.1%} |")
    lines += ["", "Cast nodes TensorFlow executed per call (from run metadata; a frozen conversion has folded the weight "
              "casts):", ""]
    for row in rows:
        lines.append(f"- {row['model']} batch {row['batch']}: " +
                     ", ".join(f"{LABELS[v]} {row['casts'][v]}" for v in VARIANTS))
    lines += ["", "Max |output - float32 output| per variant (TF AMP must differ from float32, or its rewrite did "
              "not take effect):", ""]
    for row in rows:
        lines.append(f"- {row['model']} batch {row['batch']}: " +
                     ", ".join(f"{LABELS[v]} {row['diff_vs_fp32'][v]:.2e}" for v in VARIANTS[1:]))
    return "\n".join(lines + ["", NOTES, "", note, ""])


def main(argv=None) -> int:
    """Prepare the models, time every variant, print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block-seconds", type=float, default=1.5)
    parser.add_argument("--workdir", default="/tmp/mp_rewrite_bench")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench_saved_model.png"))
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "bench_saved_model.md"))
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    names, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    prepared = {name: prepare(name, workdir) for name in names}
    facts = {name: f for name, (_, f) in prepared.items()}
    cli_seconds = {}
    if "resnet50" in prepared:
        source = prepared["resnet50"][0]["fp32"]
        cli_seconds = {"resnet50": (cli_convert_seconds(source, workdir / "resnet50" / "cli"),
                                    cli_convert_seconds(source, workdir / "resnet50" / "cli", "--freeze"))}
    rows = []
    for name in names:
        for batch in batches:
            rows.append(measure(name, batch, prepared[name][0], workdir, args.rounds, args.block_seconds))
            print("\n".join(table(rows[-1:])[2:]), flush=True)
    note = chart(rows, Path(args.out))
    command = "python3 tools/bench_saved_model.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(rows, facts, cli_seconds, machine(), (load_before, os.getloadavg()[0]), command.strip(), note)
    Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, str(ROOT))
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(main())
