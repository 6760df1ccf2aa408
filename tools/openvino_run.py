"""OpenVINO as a peer of tools/bench_saved_model.py: convert a float32 SavedModel and time it on the CPU plugin.

Runs in OpenVINO's own environment, not the project's (it needs no TensorFlow: OpenVINO's TensorFlow frontend reads
the SavedModel itself). Make it once:

    python3 -m venv /work/venvs/openvino && /work/venvs/openvino/bin/pip install openvino

then pass `--openvino-python /work/venvs/openvino/bin/python` to the benchmark.

Usage: `openvino_run.py SAVED_MODEL INPUTS.npz OUTPUTS.npz [--threads 2]`. It speaks the benchmark's worker
protocol: `openvino.convert_model` on the float32 SavedModel (serving signature), reshaped to the static shapes of
INPUTS.npz (the same arrays the TensorFlow workers feed), compiled for "CPU" with INFERENCE_NUM_THREADS=threads and
OpenVINO's defaults otherwise (performance hint LATENCY; inference precision bf16 on a CPU with AVX512-BF16/AMX, f32
without); then one JSON line {"ready": true, "warm_s", "convert_s", "compile_s", "precision", ...}, the outputs of
one call written to OUTPUTS.npz, and for every stdin line "run N" a JSON line {"times": [...], "cpu": [...]} of N
synchronous calls (wall seconds, and CPU seconds of this process, all threads).
"""

import argparse
import json
import sys
import time


def _match_inputs(model, arrays: dict) -> dict:
    """{OpenVINO input port name: array}: matched by tensor name (OpenVINO keeps the signature's input names, some
    with a suffix such as ':0'), else by position."""
    out, unused = {}, dict(arrays)
    for port in model.inputs:
        names = port.get_names()
        key = next((k for k in unused if k in names or any(n.split(":")[0] == k for n in names)), None)
        if key is None:
            key = next((k for k in unused if any(k in n for n in names)), None)
        if key is None:
            key = next(iter(unused))
        out[port.get_any_name()] = unused.pop(key)
    return out


def _output_names(model) -> list:
    """A readable name per output: the signature's output name where OpenVINO kept it."""
    names = []
    for i, port in enumerate(model.outputs):
        plain = sorted(n for n in port.get_names() if ":" not in n and "/" not in n)
        names.append(plain[0] if plain else f"output_{i}")
    return names


def _type_name(value) -> str:
    """'bf16' / 'f32' for an openvino.Type, str() of anything else."""
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def _layer_times(request, feeds: dict, calls: int) -> dict:
    """{layer type (its kernel precision): ms per call} from OpenVINO's per-layer profile (PERF_COUNT) of `calls`
    calls after a warm one, summed per type, slowest first."""
    request.infer(feeds)
    totals = {}
    for _ in range(calls):
        request.infer(feeds)
        for layer in request.profiling_info:
            if layer.status.name != "EXECUTED" or layer.real_time.total_seconds() <= 0:
                continue
            precision = layer.exec_type.rsplit("_", 1)[-1] if "_" in layer.exec_type else layer.exec_type
            label = f"{layer.node_type} ({precision})"
            totals[label] = totals.get(label, 0.0) + layer.real_time.total_seconds() * 1000 / calls
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("saved_model")
    parser.add_argument("inputs")
    parser.add_argument("outputs")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import numpy as np
    import openvino as ov

    arrays = dict(np.load(args.inputs))
    start = time.perf_counter()
    model = ov.convert_model(args.saved_model)
    convert_s = time.perf_counter() - start
    feeds = _match_inputs(model, arrays)
    model.reshape({name: list(value.shape) for name, value in feeds.items()})
    core = ov.Core()
    start = time.perf_counter()
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": args.threads})
    compile_s = time.perf_counter() - start
    request = compiled.create_infer_request()
    request.infer(feeds)  # first call: primitive creation
    start = time.perf_counter()
    for _ in range(3):
        request.infer(feeds)
    warm = (time.perf_counter() - start) / 3
    names = _output_names(model)
    np.savez(args.outputs, **{name: np.asarray(request.get_output_tensor(i).data, dtype=np.float32)
                              for i, name in enumerate(names)})
    info = {"ready": True, "warm_s": warm, "convert_s": convert_s, "compile_s": compile_s,
            "precision": _type_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
            "threads": compiled.get_property("INFERENCE_NUM_THREADS"),
            "hint": str(compiled.get_property("PERFORMANCE_HINT")), "openvino": ov.__version__,
            "bf16_kernels": 0, "kernels": 0, "census": {}}
    print(json.dumps(info), flush=True)
    profiled = None
    for line in sys.stdin:
        if line.startswith("profile"):  # PERF_COUNT slows every call a little: a second compilation has it on
            if profiled is None:
                profiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": args.threads,
                                                             "PERF_COUNT": True}).create_infer_request()
            print(json.dumps({"kernels": _layer_times(profiled, feeds, int(line.split()[1]))}), flush=True)
            continue
        times, cpu = [], []
        for _ in range(int(line.split()[1])):
            start, start_cpu = time.perf_counter(), time.process_time()
            request.infer(feeds)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(json.dumps({"times": times, "cpu": cpu}), flush=True)


if __name__ == "__main__":
    main()
