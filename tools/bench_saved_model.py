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
(the kernels a profiler trace of one call shows: a split model's batch 1 runs one side of its routing, not both),
and its outputs, so that the table can show that TF's rewrite took effect. OpenVINO is one
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

from bench_models import (DEFAULT_MODELS, MODELS, PEERS, ROOT, TUNE_BATCH, VARIANTS, cli_convert_seconds,
                          convert_by_cost, prepare)
from bench_saved_model_report import chart, machine, report, table
from mp_rewrite.analysis.machine_load import busy_seconds

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the `tensorflow` wheel leaves oneDNN off (see tests/conftest.py)

# Serving settings a TF process chooses at start (issue 40): each but "default" runs the TF variants again in a worker
# of its own, their names suffixed "@setting" (OpenVINO keeps its own threads).
SERVING = {"default": {}, "intra1": {"TF_NUM_INTRAOP_THREADS": "1"}}


# --------------------------------------------------------------------------------------------- worker


def _executed_kernels(function, inputs) -> tuple[int, int, dict]:
    """(bf16 matmul/conv kernels, all matmul/conv kernels, {"op dtype": count} of every computing node) TF ran for
    one call (analysis.execution.ran_nodes: a split model's batch 1 runs one side of its routing, not both)."""
    from tensorflow.core.framework import types_pb2

    from mp_rewrite.analysis.execution import ran_nodes
    low = total = 0
    census = {}
    for node in ran_nodes(function, **inputs):
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
        times, cpu, others = {v: [] for v in variants}, {v: [] for v in variants}, {v: [] for v in variants}
        for r in range(rounds):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                busy, start = busy_seconds(), time.perf_counter()
                block = workers[v].run(calls, v)
                times[v] += block["times"]
                cpu[v] += block["cpu"]
                after = busy_seconds()
                if busy is not None and after is not None:  # what the rest of the machine used meanwhile
                    others[v].append(max(0.0, after - busy - sum(block["cpu"])) / (time.perf_counter() - start))
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
            "others": {v: statistics.median(o) for v, o in others.items() if o},
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
