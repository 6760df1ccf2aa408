"""Benchmark: batch 1 on both cores inside TensorFlow (issue 40, item 3) -- the frozen bfloat16 model whole, under
TF's default threads, one intra-op thread and the caller-thread setting, beside splits of the same frozen graph
(a Transformer's token rows `rowsN`: mp_rewrite/savedmodel/row_split.py; `routed2`, the graph `convert --freeze
--split` writes for it, rows2 beside the whole graph with a Switch on the batch; weight columns/heads `colsN` and a
CNN's image bands with halos `bands_<cuts>`, hand-built: tools/batch_one_columns.py, batch_one_bands.py) and
OpenVINO on the float32 SavedModel.

    python tools/bench_batch_one.py [--models transformer,mobilenetv2] [--rounds 8] [--block-seconds 0.4]
                                    [--workdir /tmp/batch_one] [--openvino-python /work/venvs/openvino/bin/python]
                                    [--variants reimported,rows2,cols2,bands_b5,...] [--json out.json]
                                    [--primitives]

Models as tools/bench_models.py builds them (`build_model`, `with_statistics`, `export`), converted with
`convert_saved_model(..., "bfloat16", freeze=True)` (= `mp-rewrite convert --precision bfloat16 --freeze`), once,
into --workdir. One worker process per TF setting (TF reads its thread settings once, at start): "default",
"intra1" (TF_NUM_INTRAOP_THREADS=1) and "caller" (TF_ONEDNN_THREADPOOL_USE_CALLER_THREAD=1, the whole model only);
each loads the frozen SavedModel, takes its body graph (the largest function of the signature's library, the frozen
graph as `--freeze` imported it), builds the split variants from it and imports each into a tf.function, checks
their outputs against the signature's (max |difference| printed), and then times whatever it is asked. OpenVINO is
one more worker (tools/openvino_run.py, in its own Python), fed the same arrays. Every round times one block of
each (worker, variant) in rotated order; the table shows medians over all calls, wall and CPU (all threads of the
worker), and each wall time over OpenVINO's. The CPU's bfloat16 flags and the load before and after are printed.
`--primitives` instead prints the oneDNN primitives one call of each variant runs (ONEDNN_VERBOSE=1, one intra-op
thread), summed over its branches: read them only from a quiet machine (concurrent branches timed while
descheduled look slow).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# "caller": TF's default threads, and oneDNN's thread pool runs part of each primitive on the calling thread instead
# of handing all of it to the intra-op pool and waiting (TF reads TF_ONEDNN_THREADPOOL_USE_CALLER_THREAD once).
SETTINGS = {"default": {}, "intra1": {"TF_NUM_INTRAOP_THREADS": "1"},
            "caller": {"TF_ONEDNN_THREADPOOL_USE_CALLER_THREAD": "1"}}
# MobileNetV2's cuts: the tensors where the bands are concatenated (after them the graph runs whole, or the next
# stage splits again). Names inside the frozen graph, suffix-matched.
# Stage ends: (Keras layer, op of its last node); a residual block's add or a projection's folded bias.
ADD, PROJECT = "AddV2", "BiasAdd"
MOBILENET_CUTS = {"b5": [("block_5_add", ADD)], "b12": [("block_12_add", ADD)],
                  "b16": [("block_16_project_BN", PROJECT)], "b5b12": [("block_5_add", ADD), ("block_12_add", ADD)],
                  "b2b5b12": [("block_2_add", ADD), ("block_5_add", ADD), ("block_12_add", ADD)],
                  "b12b16": [("block_12_add", ADD), ("block_16_project_BN", PROJECT)]}
DEFAULT_VARIANTS = {"transformer": ["reimported", "rows2", "cols2"],
                    "mobilenetv2": ["reimported", "bands_b5", "bands_b5b12", "cols2"]}


# --------------------------------------------------------------------------------------------- worker


def body_graph(function):
    """(GraphDef, input tensor, output tensor, input spec) of a frozen signature's body: the largest function of
    its library (frozen_function.imported_function's `body`, whose one input is the signature's only input)."""
    import tensorflow as tf
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def
    library = function.graph.as_graph_def().library
    body = max(library.function, key=lambda f: len(f.node_def))
    spec = next(iter(function.structured_input_signature[1].values()))
    shape = [1, *spec.shape.as_list()[1:]]
    graph_def, names = function_def_to_graph_def(body, input_shapes=[tf.TensorShape(shape)])
    graph_def.library.CopyFrom(type(library)())
    (arg,), (ret,) = body.signature.input_arg, body.signature.output_arg
    return graph_def, f"{arg.name}:0", names[body.ret[ret.name]], tf.TensorSpec(shape, spec.dtype)


def imported(graph_def, input_tensor: str, output: str, spec):
    """A concrete tf.function running `graph_def` on one input and returning one tensor."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def run(x):
        return tf.graph_util.import_graph_def(graph_def, input_map={input_tensor: x}, return_elements=[output],
                                              name="g")[0]
    return run.get_concrete_function(spec)


def variant_graph(variant: str, graph_def, input_tensor: str, output: str):
    """(GraphDef, output tensor, facts) of a split variant of the body graph."""
    from batch_one_bands import layer_output, split_bands

    from mp_rewrite.analysis.shapes import node_shapes
    from mp_rewrite.savedmodel.row_split import split_token_rows
    shapes = node_shapes(graph_def, batch=1)
    if variant.startswith("rows"):  # rows2, rows2_attnwhole
        parts = int(variant[4])
        whole_ops = ("Einsum", "Softmax") if variant.endswith("attnwhole") else ()
        graph, fetched, fed_whole = split_token_rows(graph_def, input_tensor, 1, [output], shapes, parts,
                                                     whole_ops)
        ops = sorted({op for _, op, _ in fed_whole})
        return graph, fetched[output], {"fed_whole": len(fed_whole), "fed_whole_ops": ops}
    if variant == "routed2":  # what convert --freeze --split writes: the whole graph and rows2, a Switch choosing
        from mp_rewrite.analysis.token_rows import row_plan
        from mp_rewrite.savedmodel.row_split import routed_rows
        graph, fetched = routed_rows(graph_def, row_plan(graph_def, input_tensor, 1, [output], shapes, 2))
        return graph, fetched[output], {}
    if variant.startswith("cols"):  # cols2: the weights by columns (heads, channels), then rows
        from batch_one_columns import split_columns
        graph, fetched, exchanges = split_columns(graph_def, [output], shapes, int(variant[4]))
        return graph, fetched[output], {"exchanges": len(exchanges)}
    if variant.startswith("bands"):  # bands_<cuts>[_explicit][_N]
        fields = variant.split("_")
        parts = int(fields[-1]) if fields[-1].isdigit() else 2
        cuts = [input_tensor, *(layer_output(graph_def, layer, op) for layer, op in MOBILENET_CUTS[fields[1]])]
        graph, fetched, work = split_bands(graph_def, cuts, [output], shapes, parts, explicit="explicit" in fields)
        return graph, fetched[output], {"rows_computed": {k.rsplit("/", 1)[-1]: round(v, 3) for k, v in
                                                          work.items()}}
    raise SystemExit(f"unknown variant {variant}")


def worker(path: str, variants: list, inputs_file: str) -> None:
    """Load the frozen model, build `variants`, report each (one JSON line), then answer "run N VARIANT"."""
    import numpy as np
    import tensorflow as tf

    from mp_rewrite.savedmodel.inputs import signature_inputs
    signature = tf.saved_model.load(path).signatures["serving_default"]
    arrays, _ = signature_inputs("serving_default", signature.structured_input_signature[1], {}, 1, seed=0)
    np.savez(inputs_file, **arrays)
    key, value = next(iter(arrays.items()))
    feed = tf.constant(value)
    want = next(iter(signature(**{key: feed}).values())).numpy().astype(np.float32)
    graph_def, input_tensor, output, spec = body_graph(signature)
    runners = {"whole": lambda: next(iter(signature(**{key: feed}).values())).numpy()}
    for variant in variants:
        start = time.perf_counter()
        if variant == "reimported":
            graph, fetch, facts = graph_def, output, {}
        else:
            graph, fetch, facts = variant_graph(variant, graph_def, input_tensor, output)
        function = imported(graph, input_tensor, fetch, spec)
        got = function(feed).numpy().astype(np.float32)
        facts.update({"nodes": len(graph.node), "build_s": round(time.perf_counter() - start, 2),
                      "max_diff": float(np.max(np.abs(got - want))), "max_out": float(np.max(np.abs(want)))})
        print(json.dumps({"variant": variant, **facts}), flush=True)
        runners[variant] = (lambda f: lambda: f(feed).numpy())(function)
    for run in runners.values():
        for _ in range(10):
            run()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        _, calls, variant = line.split()
        times, cpu = [], []
        for _ in range(int(calls)):
            start, start_cpu = time.perf_counter(), time.process_time()
            runners[variant]()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(json.dumps({"times": times, "cpu": cpu}), flush=True)


PRIMITIVES_MARK = "=== timed calls ==="


def primitives(path: str, variant: str, calls: int = 10) -> None:
    """Run one variant with ONEDNN_VERBOSE=1 set by the caller: 10 warm calls, then `calls` calls between marks
    (tools/onednn_primitives.py's protocol)."""
    import tensorflow as tf

    from mp_rewrite.savedmodel.inputs import signature_inputs
    signature = tf.saved_model.load(path).signatures["serving_default"]
    arrays, _ = signature_inputs("serving_default", signature.structured_input_signature[1], {}, 1, seed=0)
    value = tf.constant(next(iter(arrays.values())))
    graph_def, input_tensor, output, spec = body_graph(signature)
    if variant != "whole":
        graph_def, output, _ = variant_graph(variant, graph_def, input_tensor, output)
    run = imported(graph_def, input_tensor, output, spec)
    for _ in range(10):
        run(value)
    print(PRIMITIVES_MARK, flush=True)
    for _ in range(calls):
        run(value)
    print(PRIMITIVES_MARK, flush=True)


def primitive_table(path: str, variants: list, calls: int = 10) -> None:
    """Print, per variant, the oneDNN primitives one call executes (summed over its branches), under one intra-op
    thread: ms per call by kind and problem, and the total."""
    for variant in ["whole", *variants]:
        env = {**os.environ, "ONEDNN_VERBOSE": "1", "TF_NUM_INTRAOP_THREADS": "1"}
        proc = subprocess.run([sys.executable, __file__, "--primitives-of", path, variant], env=env,
                              capture_output=True, text=True, cwd=ROOT)
        timed = proc.stdout.split(PRIMITIVES_MARK)
        if len(timed) < 3:
            print(f"  {variant}: failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        totals = {}
        for line in timed[1].splitlines():
            fields = line.split(",")
            if line.startswith("onednn_verbose") and "exec" in fields:
                at = fields.index("exec")
                key = f"{fields[at + 2]} {fields[-2]}"
                count, ms = totals.get(key, (0, 0.0))
                totals[key] = (count + 1 / calls, ms + float(fields[-1]) / calls)
        total = sum(ms for _, ms in totals.values())
        print(f"  {variant}: {sum(n for n, _ in totals.values()):.0f} primitives, {total:.3f} ms per call: " +
              "; ".join(f"{k} x{n:.0f} {ms:.3f}"
                        for k, (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:8]))


# --------------------------------------------------------------------------------------------- driver


class Worker:
    """A worker process: ours (several variants, "run N VARIANT") or OpenVINO's (one, "run N")."""

    def __init__(self, command: list, env: dict, log, named: bool):
        self.named = named
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     cwd=ROOT, env={**os.environ, **env})

    def line(self) -> dict:
        text = self.proc.stdout.readline()
        if not text:
            raise RuntimeError("a worker died; see the log")
        return json.loads(text)

    def run(self, calls: int, variant: str) -> dict:
        self.proc.stdin.write(f"run {calls} {variant}\n" if self.named else f"run {calls}\n")
        self.proc.stdin.flush()
        return self.line()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def prepare(name: str, workdir: Path) -> tuple[Path, Path]:
    """The float32 export and its `--freeze` bfloat16 conversion (made once)."""
    fp32, frozen = workdir / name / "fp32", workdir / name / "freeze_bf16"
    if not (frozen / "saved_model.pb").exists():
        code = ("import sys; sys.path.insert(0, 'tools'); from pathlib import Path; "
                "from bench_models import build_model, with_statistics, export; "
                "from mp_rewrite.savedmodel.convert import convert_saved_model; "
                f"name, fp32, frozen = {name!r}, Path({str(fp32)!r}), Path({str(frozen)!r}); "
                "export(name, with_statistics(build_model(name)), fp32); "
                "convert_saved_model(fp32, frozen, 'bfloat16', freeze=True, overwrite=True)")
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    return fp32, frozen


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(name: str, args, log) -> dict:
    fp32, frozen = prepare(name, Path(args.workdir))
    variants = args.variants.split(",") if args.variants else DEFAULT_VARIANTS[name]
    inputs = Path(args.workdir) / f"{name}_b1_inputs.npz"
    workers, facts = {}, {}
    for setting, env in SETTINGS.items():
        wanted = variants if setting == "intra1" else [] if setting == "caller" else \
            [v for v in variants if v != "reimported"]
        command = [sys.executable, __file__, "--worker", str(frozen), ",".join(wanted), str(inputs)]
        workers[setting] = Worker(command, env, log, True)
        for _ in wanted:
            info = workers[setting].line()
            facts[f"{info.pop('variant')}@{setting}"] = info
        workers[setting].line()
    cells = [(s, "whole") for s in SETTINGS] + [(s, v) for s in ("default", "intra1") for v in variants
                                                if not (s == "default" and v == "reimported")]
    if args.openvino_python:
        command = [args.openvino_python, str(ROOT / "tools" / "openvino_run.py"), str(fp32), str(inputs),
                   str(Path(args.workdir) / f"{name}_b1_openvino.npz"), "--threads", "2"]
        workers["openvino"] = Worker(command, {}, log, False)
        facts["openvino"] = workers["openvino"].line()
        cells.append(("openvino", "openvino"))
    samples = {cell: {"times": [], "cpu": []} for cell in cells}
    for r in range(args.rounds):
        for setting, variant in cells[r % len(cells):] + cells[:r % len(cells)]:
            first = workers[setting].run(3, variant)
            calls = max(5, int(args.block_seconds / max(statistics.median(first["times"]), 1e-4)))
            got = workers[setting].run(calls, variant)
            samples[setting, variant]["times"] += got["times"]
            samples[setting, variant]["cpu"] += got["cpu"]
    for w in workers.values():
        w.close()
    return {"facts": facts, "cells": {f"{v}@{s}": {"wall": statistics.median(x["times"]) * 1e3,
                                                   "cpu": statistics.median(x["cpu"]) * 1e3,
                                                   "calls": len(x["times"])} for (s, v), x in samples.items()}}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "?")
    flags = open("/proc/cpuinfo").read()
    features = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f in flags]
    return (f"{cpu}, {os.cpu_count()} cores, {', '.join(features) or 'no bfloat16 units'}; TensorFlow "
            f"{importlib.metadata.version('tensorflow')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,mobilenetv2")
    parser.add_argument("--variants", help="comma-separated (default per model: " + "; ".join(
        f"{k}: {','.join(v)}" for k, v in DEFAULT_VARIANTS.items()) + ")")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-seconds", type=float, default=0.4)
    parser.add_argument("--workdir", default="/tmp/batch_one")
    parser.add_argument("--openvino-python")
    parser.add_argument("--json")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--primitives", action="store_true",
                        help="instead of timing: the oneDNN primitives of each variant (ONEDNN_VERBOSE=1, one intra-op "
                             "thread), summed over the branches")
    parser.add_argument("--primitives-of", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.primitives_of:
        primitives(*args.primitives_of)
        return 0
    if args.primitives:
        for name in args.models.split(","):
            _, frozen = prepare(name, Path(args.workdir))
            variants = args.variants.split(",") if args.variants else DEFAULT_VARIANTS[name]
            print(f"{name}, batch 1 (load before {load()}):")
            primitive_table(str(frozen), [v for v in variants if v != "reimported"])
        return 0
    if args.worker:
        worker(args.worker[0], args.worker[1].split(",") if args.worker[1] else [], args.worker[2])
        return 0
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    print(f"Machine: {machine()}; load average before: {load()}", flush=True)
    results = {}
    with open(Path(args.workdir) / "workers.log", "a") as log:
        for name in args.models.split(","):
            results[name] = measure(name, args, log)
            print(f"(load after {name}: {load()})", flush=True)
    for name, result in results.items():
        print(f"\n{name}, batch 1: wall / CPU ms per call (median of all calls), wall over OpenVINO's")
        base = result["cells"].get("openvino@openvino", {}).get("wall")
        print("| variant | setting | wall | CPU | / OpenVINO | max abs diff to whole |\n|---|---|---|---|---|---|")
        for cell, value in result["cells"].items():
            variant, setting = cell.split("@")
            ratio = f"{value['wall'] / base:.2f}x" if base else "-"
            diff = result["facts"].get(cell, {}).get("max_diff")
            print(f"| {variant} | {setting} | {value['wall']:.2f} | {value['cpu']:.2f} | {ratio} | "
                  f"{'-' if diff is None else f'{diff:.3g}'} |")
        for cell, info in result["facts"].items():
            print(f"  {cell}: {json.dumps(info)}")
    print(f"load average after: {load()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
