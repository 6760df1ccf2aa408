"""What the reliability checks cost: a whole SavedModel conversion, against its static source checks and the load of
the written copy, measured in the same rounds (interleaved), medians of wall and CPU time.

    .venv/bin/python tools/bench_conversion_checks.py [--rounds 5] [--model resnet50|mobilenet_v2]

Builds a Keras application (random weights, no download) and exports it with model.export into a temporary
directory. Other processes share the machine: the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="resnet50", choices=("resnet50", "mobilenet_v2"))
    args = parser.parse_args()
    import keras
    from mp_rewrite import convert_saved_model
    from mp_rewrite.model.files import read_saved_model
    from mp_rewrite.savedmodel.source_check import check_source, load_error
    root = tempfile.mkdtemp()
    source, out = os.path.join(root, "source"), os.path.join(root, "out")
    model = {"resnet50": keras.applications.ResNet50, "mobilenet_v2": keras.applications.MobileNetV2}[args.model]
    model(weights=None).export(source, verbose=False)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(source) for f in fs)
    parsed = read_saved_model(source)
    times = {"convert (all of it)": [], "static source checks": [], "load of the written copy": []}
    for _ in range(args.rounds):
        shutil.rmtree(out, ignore_errors=True)
        times["convert (all of it)"].append(_timed(lambda: convert_saved_model(source, out, "bfloat16")))
        times["static source checks"].append(_timed(lambda: check_source(source, parsed)))
        times["load of the written copy"].append(_timed(lambda: load_error(out, read_saved_model(out))))
    print(f"{args.model}: {size / 1e6:.0f} MB SavedModel, {args.rounds} interleaved rounds, medians "
          f"(load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    for name, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"  {name:<26} {wall:6.2f} s wall {cpu:6.2f} s CPU")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
