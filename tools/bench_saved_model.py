"""Benchmark: inference latency of SavedModels converted by `mp-rewrite convert --precision bfloat16`, side by side
with the float32 original, TensorFlow's own `auto_mixed_precision_onednn_bfloat16` Grappler rewrite, and the Keras
`mixed_bfloat16` policy, on Keras ResNet-50, MobileNetV2, EfficientNetB0 and a Transformer encoder (random weights);
opt-in: keras-hub BERT and GPT-2 backbones (`--models ...,bert,gpt2`), and the peers Intel Neural Compressor
(`--inc-python`, tools/inc_convert.py) and OpenVINO (`--openvino-python`, tools/openvino_run.py).

    python3 tools/bench_saved_model.py [--models resnet50,mobilenetv2,efficientnetb0,transformer,bert,gpt2]
                                       [--batches 8,32] [--rounds 10] [--block-seconds 1.5]
                                       [--inc-python PY] [--openvino-python PY] [--json rows.json]
                                       [--out docs/bench_saved_model.png] [--markdown docs/bench_saved_model.md]

Method: the TF variants are loaded together in one subprocess, TF AMP in a second (its optimizer option is
process-global), and all stay loaded at once and are timed in interleaved blocks (round r runs the variants in
rotated order), so a change in the machine's load hits every variant alike; each block runs the signature several
times and the table shows medians over all calls. (One process per variant, as before, measured each process's
luck on the AMX machine: the same ResNet-50 graph ran 62 ms per call in one process and 100-117 ms in seven
others.) Each worker also records, once for each variant, which matmul/conv kernels TF really executed in bfloat16
(eager run metadata), and its outputs, so that the table can show that TF's rewrite took effect. OpenVINO is one
more worker in the same rotation (in its own Python, see tools/openvino_run.py): it converts the float32 SavedModel
itself and is fed the arrays the float32 worker was fed. The conversion time of ResNet-50 is the median of 3
in-process `convert_saved_model` calls, plus one end-to-end CLI run.
Writes the table to docs/bench_saved_model.md and a bar chart to --out (if matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_saved_model_report import chart, machine, report, table

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the `tensorflow` wheel leaves oneDNN off (see tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("fp32", "ours", "ours_any", "ours_lists", "ours_freeze", "ours_split", "ours_cost", "ours_tuned",
            "tf_amp", "keras_mixed", "ours_mm")
# Serving settings a TF process chooses at start (issue 40): each but "default" runs the TF variants again in a worker
# of its own, their names suffixed "@setting" (OpenVINO keeps its own threads).
SERVING = {"default": {}, "intra1": {"TF_NUM_INTRAOP_THREADS": "1"}}
PEERS = ("inc", "openvino")  # each only if its Python is given
TUNE_BATCH = 8
# An extra variant, not Grappler's lists: only the allow ops (matmul/conv) in bf16, every elementwise op float32.
MATMUL_CONV_ONLY = "[infer]\nops = []\n[clear]\nops = []\n"
MODELS = {"resnet50": "Keras ResNet-50 (224x224)", "mobilenetv2": "Keras MobileNetV2 (224x224)",
          "efficientnetb0": "Keras EfficientNetB0 (224x224)",
          "transformer": "Transformer encoder (4 layers, d=256, 8 heads, seq 128)",
          "bert": "keras-hub BertBackbone, BERT-mini shape (4 layers, d=256, 4 heads, ffn 1024, vocab 30522, seq 128)",
          "gpt2": "keras-hub GPT2Backbone (4 layers, d=256, 4 heads, ffn 1024, vocab 50257, seq 128)"}
DEFAULT_MODELS = ("resnet50", "mobilenetv2", "efficientnetb0", "transformer")
KERAS_HUB = ("bert", "gpt2")
SEQUENCE = 128  # keras-hub backbones take (batch, any length): exported with this length


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
    if name in KERAS_HUB:
        import keras_hub
        size = dict(num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=SEQUENCE)
        if name == "bert":
            return keras_hub.models.BertBackbone(vocabulary_size=30522, **size)
        return keras_hub.models.GPT2Backbone(vocabulary_size=50257, **size)
    from mp_rewrite.testing.example_models import token_transformer
    return token_transformer()


def with_random_biases(model):
    """Every bias (and LayerNormalization beta) of a nested model, e.g. a keras-hub backbone, set to small random
    values: they are zeros when freshly built, which Grappler would fold away."""
    import numpy as np
    rng = np.random.default_rng(1)
    for weight in model.weights:
        if weight.path.rsplit("/", 1)[-1] in ("bias", "beta"):
            weight.assign(rng.normal(0, 0.05, tuple(weight.shape)).astype("float32"))
    return model


def export(name: str, model, path: Path) -> None:
    """`model.export` (the serving signature); keras-hub backbones with a fixed sequence length."""
    signature = None
    if name in KERAS_HUB:
        import tensorflow as tf
        signature = [{i.name: tf.TensorSpec((None, SEQUENCE), i.dtype, name=i.name) for i in model.inputs}]
    model.export(str(path), verbose=False, input_signature=signature)


def with_statistics(model):
    """Give every BatchNormalization and bias the values a trained model has: a freshly initialised one has zero
    biases and identity normalizations, which Grappler folds away and which would flatter every frozen variant."""
    import keras
    import numpy as np
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 2, variance.shape)])
        elif getattr(layer, "use_bias", False) and len(layer.get_weights()) == 2:
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, rng.normal(0, 0.05, bias.shape)])
    return model


def prepare(name: str, workdir: Path, inc_python: str | None, openvino_python: str | None = None,
            wanted=VARIANTS) -> tuple[dict, dict]:
    """Export the float32 and the Keras mixed_bfloat16 SavedModels (same weights) and convert the float32 one into
    the `wanted` variants (the in-place lists and --freeze conversions always: their facts head the page).

    Returns:
        ({variant: SavedModel path}, conversion facts for this model).
    """
    import keras

    from mp_rewrite.savedmodel.convert import convert_saved_model
    paths = {"fp32": workdir / name / "fp32", "ours_lists": workdir / name / "ours_bf16",
             "keras_mixed": workdir / name / "keras_mixed_bf16", "ours_mm": workdir / name / "ours_mm_bf16",
             "ours_freeze": workdir / name / "ours_freeze_bf16", "ours_tuned": workdir / name / "ours_tuned",
             "ours_split": workdir / name / "ours_freeze_split2_bf16"}
    paths["tf_amp"] = paths["fp32"]
    if openvino_python:
        paths["openvino"] = paths["fp32"]  # OpenVINO converts the float32 SavedModel itself, in its worker
    mixed_wanted = "keras_mixed" in wanted and not (paths["keras_mixed"] / "saved_model.pb").exists()
    if not (paths["fp32"] / "saved_model.pb").exists() or mixed_wanted:
        model = with_statistics(build_model(name))
        if name in KERAS_HUB:
            model = with_random_biases(model)
        export(name, model, paths["fp32"])
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            mixed = build_model(name)
            mixed.set_weights(model.get_weights())
            export(name, mixed, paths["keras_mixed"])
        finally:
            keras.mixed_precision.set_global_policy("float32")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        result = convert_saved_model(paths["fp32"], paths["ours_lists"], "bfloat16", overwrite=True)
        times.append(time.perf_counter() - start)
    freeze_times = []
    for _ in range(3):
        start = time.perf_counter()
        convert_saved_model(paths["fp32"], paths["ours_freeze"], "bfloat16", freeze=True, overwrite=True)
        freeze_times.append(time.perf_counter() - start)
    if "ours_split" in wanted:  # --freeze --split 2: the batch in two concurrent branches (serve with 1 thread)
        convert_saved_model(paths["fp32"], paths["ours_split"], "bfloat16", freeze=True, split=2, overwrite=True)
    predictions, default_seconds, cost_seconds, tune_seconds, chosen = {}, None, None, None, "-"
    if {"ours", "ours_cost"} & set(wanted):
        cost_paths, predictions, default_seconds, cost_seconds = convert_by_cost(paths["fp32"], workdir / name,
                                                                                 TUNE_BATCH)
        paths.update(cost_paths)
    any_seconds = None
    if "ours_any" in wanted:  # `convert` without --batch-size: converted once, the best across batch 1, 8 and 32
        paths["ours_any"] = workdir / name / "ours_default_any"
        predictions_any, any_seconds = convert_default(paths["fp32"], paths["ours_any"])
    if "ours_tuned" in wanted:
        from mp_rewrite.savedmodel.tune import tune_saved_model
        # Tuned at the first serving batch size measured (the tuner times on this machine, at this batch).
        start = time.perf_counter()
        chosen = tune_saved_model(paths["fp32"], paths["ours_tuned"], "bfloat16", freeze=True, overwrite=True,
                                  rounds=3, batch_size=TUNE_BATCH).chosen
        tune_seconds = time.perf_counter() - start
    if "ours_mm" in wanted:
        lists = workdir / "matmul_conv_only.toml"
        lists.write_text(MATMUL_CONV_ONLY)
        convert_saved_model(paths["fp32"], paths["ours_mm"], "bfloat16", lists_file=str(lists), overwrite=True)
    inc = {}
    if inc_python:
        paths["inc"] = workdir / name / "inc_bf16"
        inc = inc_convert(inc_python, paths["fp32"], paths["inc"], workdir)
    facts = {"convert_s": statistics.median(times), "freeze_s": statistics.median(freeze_times),
             "cost_s": cost_seconds, "tune_s": tune_seconds, "default_s": default_seconds, "any_s": any_seconds,
             "predicted": {TUNE_BATCH: predictions, **({"any": predictions_any} if any_seconds else {})},
             "inc_s": inc.get("seconds"),
             "tuned": chosen,
             "freeze_mb": sum(f.stat().st_size for f in paths["ours_freeze"].rglob("*") if f.is_file()) / 1e6,
             "flop_share": result.flops.share,
             "converted": result.converted_nodes, "casts": result.casts,
             "size_mb": sum(f.stat().st_size for f in paths["fp32"].rglob("*") if f.is_file()) / 1e6}
    return {v: path for v, path in paths.items() if v in wanted or v in PEERS}, facts


def convert_default(source: Path, output: Path) -> tuple[dict, float]:
    """The default conversion for a CPU as `convert SRC OUT --precision bfloat16` makes it, no --batch-size (the
    variants raced at batch 1, 8 and 32). Returns ({"ours_any": what it predicted}, its seconds)."""
    from mp_rewrite.analysis.op_costs import this_machine
    from mp_rewrite.commands.list_options import predicted
    from mp_rewrite.savedmodel.convert import convert_saved_model
    start = time.perf_counter()
    result = convert_saved_model(source, output, "bfloat16", assign="cost", costs=this_machine("bfloat16"),
                                 overwrite=True)
    return {"ours_any": predicted(next(iter(result.graphs.values())))}, time.perf_counter() - start


def convert_by_cost(source: Path, workdir: Path, batch: int) -> tuple[dict, dict, float, float]:
    """The two cost-assignment variants measured at `batch`, as `convert --batch-size` measures them: the default
    conversion for a CPU (in place) and --freeze. Returns (their paths, what each predicted, and their seconds)."""
    from mp_rewrite.analysis.op_costs import this_machine
    from mp_rewrite.commands.list_options import predicted
    from mp_rewrite.savedmodel.convert import convert_saved_model
    paths = {"ours": workdir / f"ours_default_b{batch}", "ours_cost": workdir / f"ours_cost_b{batch}"}
    predictions, seconds = {}, {}
    for variant, freeze in (("ours", False), ("ours_cost", True)):
        costs = this_machine("bfloat16")
        costs.batch = batch
        start = time.perf_counter()
        result = convert_saved_model(source, paths[variant], "bfloat16", assign="cost", costs=costs, freeze=freeze,
                                     overwrite=True)
        seconds[variant] = time.perf_counter() - start
        predictions[variant] = predicted(next(iter(result.graphs.values())))
    return paths, predictions, seconds["ours"], seconds["ours_cost"]


def inc_convert(python: str, source: Path, output: Path, workdir: Path) -> dict:
    """Intel Neural Compressor's bfloat16 conversion, run in its own environment (tools/inc_convert.py)."""
    import shutil
    shutil.rmtree(output, ignore_errors=True)
    done = subprocess.run([python, str(ROOT / "tools" / "inc_convert.py"), str(source), str(output)], cwd=workdir,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"Intel Neural Compressor failed on {source}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_convert_seconds(source: Path, output: Path, *options: str) -> float:
    """Wall time of `mp-rewrite convert SOURCE OUTPUT --precision bfloat16 --overwrite [OPTIONS]` (TF start-up
    included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mp_rewrite", "convert", str(source), str(output), "--precision",
                    "bfloat16", "--overwrite", *options], check=True, capture_output=True)
    return time.perf_counter() - start


# --------------------------------------------------------------------------------------------- worker


def _executed_kernels(function, inputs) -> tuple[int, int, dict]:
    """(bf16 matmul/conv kernels, all matmul/conv kernels, {"op dtype": count} of every computing node) in the
    graphs TF executed for one call (analysis.execution.executed_nodes)."""
    from tensorflow.core.framework import types_pb2

    from mp_rewrite.analysis.execution import executed_nodes
    low = total = 0
    census = {}
    for node in executed_nodes(function, **inputs):
        dtype = types_pb2.DataType.Name(node.attr["T"].type) if "T" in node.attr else ""
        census[f"{node.op} {dtype}"] = census.get(f"{node.op} {dtype}", 0) + 1
        if any(k in node.op for k in ("Conv", "MatMul", "Einsum")):
            total += 1
            low += dtype == "DT_BFLOAT16"
    return low, total, census


CONTAINERS = ("PartitionedCall", "StatefulPartitionedCall", "_Arg", "_Retval", "Const", "NoOp", "Identity",
              "_Send", "_Recv", "_HostSend", "_HostRecv")  # a call's time is its body's; the rest is bookkeeping
PROFILED = ("fp32", "ours", "ours_freeze", "ours_cost", "openvino")  # the variants whose kernels the page tabulates
PROFILE_CALLS = 5


def kernel_times(path, arrays: dict, calls: int = PROFILE_CALLS) -> dict:
    """{kernel: ms per call}: the time of every kernel TF ran for the SavedModel's `serving_default`, summed per
    kind ("_MklNativeFusedConv2D: BiasAdd+Relu6" with the ops fused into it), from a Session's full trace (step
    stats) of `calls` calls after one warm call. Kernels running side by side on different cores both count, so
    the sum can exceed the call's wall time."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    from mp_rewrite.analysis.run_times import kernel_label
    totals = {}
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        signature = tf.compat.v1.saved_model.load(session, ["serve"], str(path)).signature_def["serving_default"]
        feeds = {signature.inputs[key].name: value for key, value in arrays.items()}
        fetches = [info.name for info in signature.outputs.values()]
        session.run(fetches, feeds)
        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE, output_partition_graphs=True)
        for _ in range(calls):
            metadata = config_pb2.RunMetadata()
            session.run(fetches, feeds, options=options, run_metadata=metadata)
            partitions = list(metadata.partition_graphs) + [p for f in metadata.function_graphs
                                                            for p in f.partition_graphs]
            labels = {node.name: kernel_label(node) for graph in partitions for node in graph.node}
            for device in metadata.step_stats.dev_stats:
                for stats in device.node_stats:
                    op = stats.timeline_label.split(" = ")[-1].split("(")[0] if " = " in stats.timeline_label else ""
                    label = labels.get(stats.node_name, op)
                    if label and label.split(":")[0] not in CONTAINERS:
                        totals[label] = totals.get(label, 0.0) + stats.all_end_rel_micros / 1000 / calls
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def worker(batch: int, specs: list) -> None:
    """Load the variants `specs` ([(variant, path, outputs file)]) in this one process, warm each up and report it
    (one line each), then answer "run N VARIANT" lines with N call times of that variant (JSON) until EOF."""
    import numpy as np
    import tensorflow as tf

    from mp_rewrite.savedmodel.inputs import signature_inputs
    if any(variant.split("@")[0] == "tf_amp" for variant, _, _ in specs):  # process-global: its worker holds it alone
        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    loaded = {}
    for variant, path, outputs_file in specs:
        function = tf.saved_model.load(path).signatures["serving_default"]
        arrays, _ = signature_inputs("serving_default", function.structured_input_signature[1], {}, batch, seed=0)
        inputs = {k: tf.constant(v) for k, v in arrays.items()}
        low, total, census = _executed_kernels(function, inputs)  # the first call: TF records graphs it builds
        start = time.perf_counter()
        for _ in range(3):
            outputs = function(**inputs)
        warm = (time.perf_counter() - start) / 3
        np.savez(outputs_file, **{k: tf.cast(v, tf.float32).numpy() for k, v in outputs.items()})
        np.savez(inputs_file(outputs_file), **arrays)  # what OpenVINO's worker is fed
        loaded[variant] = (function, inputs)
        print(json.dumps({"ready": True, "variant": variant, "warm_s": warm, "bf16_kernels": low, "kernels": total,
                          "census": census}), flush=True)
    for line in sys.stdin:
        command, calls, variant = line.split()
        if command == "profile":
            path = next(p for v, p, _ in specs if v == variant)
            print(json.dumps({"kernels": kernel_times(path, {k: v.numpy() for k, v in loaded[variant][1].items()},
                                                      int(calls))}), flush=True)
            continue
        function, inputs = loaded[variant]
        times, cpu = [], []
        for _ in range(int(calls)):
            start, start_cpu = time.perf_counter(), time.process_time()
            for value in function(**inputs).values():
                value.numpy()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(json.dumps({"times": times, "cpu": cpu}), flush=True)


def inputs_file(outputs_file) -> str:
    """Where a worker writes the input arrays it feeds."""
    return str(outputs_file).removesuffix(".npz") + "_inputs.npz"


class Worker:
    """A subprocess holding one or more variants (`command`: another program speaking the same protocol for one)."""

    def __init__(self, variants: list, paths: list, batch: int, outputs_files: list, log: Path, command=None,
                 env=None):
        self.variants = variants
        self.log = open(log, "a")
        self.named = command is None  # our worker takes "run N VARIANT"; another program, "run N"
        command = command or [sys.executable, __file__, "--worker", str(batch),
                              *(str(x) for spec in zip(variants, paths, outputs_files) for x in spec)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, cwd=ROOT, env={**os.environ, **(env or {})})

    def ready(self) -> dict:
        """Wait until every variant is loaded and warm; return {variant: its report}."""
        infos = {}
        for variant in self.variants:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {variant} died; see {self.log.name}")
            infos[variant] = json.loads(line)
        return infos

    def run(self, calls: int, variant: str) -> dict:
        """Time `calls` calls: {"times": wall seconds, "cpu": CPU seconds of the process (all threads)}."""
        self.proc.stdin.write(f"run {calls} {variant}\n" if self.named else f"run {calls}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def profile(self, calls: int, variant: str) -> dict:
        """{kernel: ms per call} of `calls` traced calls (kernel_times; OpenVINO's PERF_COUNT in its worker)."""
        self.proc.stdin.write(f"profile {calls} {variant}\n" if self.named else f"profile {calls}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["kernels"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        self.log.close()


# --------------------------------------------------------------------------------------------- measuring


def openvino_command(python: str, path: Path, fp32_outputs: Path, outputs: Path) -> list:
    """tools/openvino_run.py in OpenVINO's environment, fed the float32 worker's inputs."""
    return [python, str(ROOT / "tools" / "openvino_run.py"), str(path), inputs_file(fp32_outputs), str(outputs),
            "--threads", "2"]


def _matched_outputs(outputs, reference) -> list:
    """(array, float32 array) pairs: by name where the names agree, else by shape in sorted-name order (Intel Neural
    Compressor's output keys are its graph's tensor names)."""
    pairs, unused = [], sorted(outputs.files)
    for key in sorted(reference.files):
        match = key if key in unused else next((k for k in unused if outputs[k].shape == reference[key].shape),
                                               unused[0] if unused else None)
        if match is not None:
            unused.remove(match)
            pairs.append((outputs[match], reference[key]))
    return pairs


def measure(name: str, batch: int, paths: dict, workdir: Path, rounds: int, block_seconds: float,
            openvino_python: str | None = None, settings=("default",)) -> dict:
    """Median latency (ms) of every variant for one model and batch size, timed in interleaved blocks; each serving
    setting but "default" adds the TF variants again as "VARIANT@setting", in a worker of its own."""
    import numpy as np
    variants = [v for v in VARIANTS + PEERS if v in paths]
    served = {f"{v}@{s}": (v, s) for s in settings if s != "default" for v in variants if v not in PEERS}
    log = workdir / "workers.log"
    outputs_of = {v: workdir / f"{name}_b{batch}_{v}.npz" for v in variants}
    # Every TF variant but TF AMP in one process (see the module doc's Method).
    shared = [v for v in variants if v not in ("tf_amp", "openvino")]
    groups = [shared] + [[v] for v in variants if v == "tf_amp"]
    processes = [Worker(g, [paths[v] for v in g], batch, [outputs_of[v] for v in g], log) for g in groups]
    for setting in dict.fromkeys(s for _, s in served.values()):
        for group in groups:
            named = [f"{v}@{setting}" for v in group]
            outputs_of.update({n: workdir / f"{name}_b{batch}_{n}.npz" for n in named})
            processes.append(Worker(named, [paths[v] for v in group], batch, [outputs_of[n] for n in named], log,
                                    env=SERVING[setting]))
    variants += list(served)
    workers = {v: process for process in processes for v in process.variants}
    try:
        infos = {v: info for process in processes for v, info in process.ready().items()}
        if "openvino" in variants:  # started once the float32 worker has written its inputs
            processes.append(Worker(["openvino"], [paths["openvino"]], batch, [outputs_of["openvino"]], log,
                                    openvino_command(openvino_python, paths["openvino"], outputs_of["fp32"],
                                                     outputs_of["openvino"])))
            workers["openvino"] = processes[-1]
            infos.update(processes[-1].ready())
        calls = max(1, round(block_seconds / max(i["warm_s"] for i in infos.values())))
        times, cpu = {v: [] for v in variants}, {v: [] for v in variants}
        for r in range(rounds):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                block = workers[v].run(calls, v)
                times[v] += block["times"]
                cpu[v] += block["cpu"]
        kernels = {v: workers[v].profile(PROFILE_CALLS, v) for v in variants if v in PROFILED}
    finally:
        for process in processes:
            process.close()
    outputs = {v: np.load(outputs_of[v]) for v in variants}
    diff = {v: max(float(np.abs(a - r).max()) for a, r in _matched_outputs(outputs[v], outputs["fp32"]))
            for v in variants}
    return {"model": name, "batch": batch, "ms": {v: 1000 * statistics.median(t) for v, t in times.items()},
            "cpu_ms": {v: 1000 * statistics.median(t) for v, t in cpu.items()},
            "calls": {v: len(t) for v, t in times.items()}, "diff_vs_fp32": diff,
            "kernels": {v: (infos[v]["bf16_kernels"], infos[v]["kernels"]) for v in variants},
            "kernel_ms": kernels,
            "same_graph_as_tf_amp": infos["ours_lists"]["census"] == infos["tf_amp"]["census"]
            if {"ours_lists", "tf_amp"} <= set(infos) else None,
            "casts": {v: sum(n for op, n in infos[v]["census"].items() if op.startswith("Cast ")) for v in variants},
            "openvino": {k: infos["openvino"][k] for k in ("convert_s", "compile_s", "precision", "threads", "hint",
                                                           "openvino")} if "openvino" in infos else None}


def main(argv=None) -> int:
    """Prepare the models, time every variant, print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block-seconds", type=float, default=1.5)
    parser.add_argument("--workdir", default="/tmp/mp_rewrite_bench")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench_saved_model.png"))
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "bench_saved_model.md"))
    parser.add_argument("--inc-python", help="the Python of an environment with Intel Neural Compressor 3.7.1 "
                        "(see tools/inc_convert.py); without it INC is not compared")
    parser.add_argument("--openvino-python", help="the Python of an environment with `openvino` (see "
                        "tools/openvino_run.py); without it OpenVINO is not compared")
    parser.add_argument("--json", help="also write the measured rows and conversion facts to this JSON file")
    parser.add_argument("--serving", default="default", help=f"comma-separated serving settings, of "
                        f"{', '.join(SERVING)}: each but default times the TF variants again in a process of its own "
                        "(intra1: TF_NUM_INTRAOP_THREADS=1, as TF Serving's --tensorflow_intra_op_parallelism=1)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)} (float32 always; peers by their --*-python)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    names, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    wanted = ["fp32"] + [v for v in args.variants.split(",") if v != "fp32"]
    if set(wanted) - set(VARIANTS):
        parser.error(f"unknown variant(s) {', '.join(sorted(set(wanted) - set(VARIANTS)))}; choose from "
                     f"{', '.join(VARIANTS)}")
    settings = args.serving.split(",")
    if set(settings) - set(SERVING):
        parser.error(f"unknown serving setting(s) {', '.join(sorted(set(settings) - set(SERVING)))}; choose from "
                     f"{', '.join(SERVING)}")
    prepared = {name: prepare(name, workdir, args.inc_python, args.openvino_python, wanted) for name in names}
    facts = {name: f for name, (_, f) in prepared.items()}
    cli_seconds = {}
    if "resnet50" in prepared:
        source = prepared["resnet50"][0]["fp32"]
        cli_seconds = {"resnet50": (cli_convert_seconds(source, workdir / "resnet50" / "cli"),
                                    cli_convert_seconds(source, workdir / "resnet50" / "cli", "--freeze"))}
    rows = []
    for name in names:
        for batch in batches:
            paths = dict(prepared[name][0])
            if batch != TUNE_BATCH and {"ours", "ours_cost"} & set(wanted):  # measured at the batch they serve
                cost_paths, facts[name]["predicted"][batch] = convert_by_cost(paths["fp32"], workdir / name, batch)[:2]
                paths.update({v: path for v, path in cost_paths.items() if v in wanted})
            rows.append(measure(name, batch, paths, workdir, args.rounds, args.block_seconds, args.openvino_python,
                                settings))
            print("\n".join(table(rows[-1:])[2:]), flush=True)
    note = chart(rows, Path(args.out))
    command = "python3 tools/bench_saved_model.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(rows, facts, cli_seconds, machine(), (load_before, os.getloadavg()[0]), command.strip(), note)
    Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command.strip(), "machine": machine(),
                                               "load": [load_before, os.getloadavg()[0]], "rows": rows,
                                               "facts": facts, "cli_seconds": cli_seconds}, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, str(ROOT))
        specs = sys.argv[3:]
        worker(int(sys.argv[2]), [tuple(specs[i:i + 3]) for i in range(0, len(specs), 3)])
    else:
        sys.exit(main())
