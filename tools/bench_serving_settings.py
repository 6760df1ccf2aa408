"""Benchmark: one SavedModel's call under the TensorFlow serving settings a process can choose, side by side.

    python tools/bench_serving_settings.py MODEL [MODEL ...] [--batch 8] [--rounds 3] [--seq-len 128]
                                          [--settings default,frozen_weights,intra1,intra1_two_halves]

Settings (each one process; TF reads them once, at start):
- default: TensorFlow's own (intra-op threads = cores);
- frozen_weights: TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1 (oneDNN keeps a variable weight's layout across calls, as it
  does for constants; only for a process whose variables never change);
- intra1: one intra-op thread (each oneDNN primitive runs on the thread that calls it: no hand-off);
- intra1_two_halves: one intra-op thread, and the batch served as two concurrent calls of half of it (two Python
  threads): what a server with concurrent requests gets from the second core.

Method: for each model the settings' processes run one after the other, and the whole sequence is repeated
`--rounds` times (alternated, so a change in the machine's load hits every setting alike); each process makes 10
warm calls, then times 6 blocks of 0.5 s; the table shows, per setting, the median over rounds of the block
medians, wall and CPU (all threads of the process), and the wall ratio against `default`. Inputs are made as
`verify` makes them (mp_rewrite.savedmodel.inputs). The CPU, its bfloat16 features and the load are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from bench_saved_model_report import machine

SETTINGS = {"default": ({}, None), "frozen_weights": ({"TF_ONEDNN_ASSUME_FROZEN_WEIGHTS": "1"}, None),
            "intra1": ({}, 1), "intra1_two_halves": ({}, 1)}
BLOCKS, BLOCK_SECONDS, WARM_CALLS = 6, 0.5, 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128, help="unknown dimensions other than the batch")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = args.settings.split(",")
    if set(settings) - set(SETTINGS):
        parser.error(f"unknown setting(s) {', '.join(sorted(set(settings) - set(SETTINGS)))}; choose from "
                     f"{', '.join(SETTINGS)}")
    if "intra1_two_halves" in settings and args.batch % 2:
        parser.error(f"intra1_two_halves serves the batch as two halves: give an even --batch, not {args.batch}")
    if args.child:
        print(json.dumps(_timed(args.models[0], args.child, args.batch, args.seq_len)))
        return 0
    if "default" not in settings:
        settings.insert(0, "default")
    facts = machine()
    print(f"Machine: {facts['cpu']}, {facts['cores']} cores, {', '.join(facts['features']) or 'no bfloat16 units'}; "
          f"TensorFlow {facts['tensorflow']}; load average before: {os.getloadavg()[0]:.2f}")
    for model in args.models:
        runs = {setting: [] for setting in settings}
        for _ in range(args.rounds):
            for setting in settings:
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **SETTINGS[setting][0]}
                proc = subprocess.run([sys.executable, __file__, model, "--child", setting, "--batch",
                                       str(args.batch), "--seq-len", str(args.seq_len)],
                                      env=env, capture_output=True, text=True)
                if proc.returncode:
                    print(f"{model} ({setting}): {proc.stderr.strip().splitlines()[-1]}", file=sys.stderr)
                    return 1
                runs[setting].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        _print(model, args.batch, runs)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def _timed(model: str, setting: str, batch: int, seq_len: int) -> dict:
    """{"wall": ms, "cpu": ms} per served batch, the median of the blocks, in this process's setting."""
    import tensorflow as tf
    if SETTINGS[setting][1] is not None:
        tf.config.threading.set_intra_op_parallelism_threads(SETTINGS[setting][1])
    from mp_rewrite.savedmodel.inputs import signature_inputs
    function = tf.saved_model.load(model).signatures["serving_default"]
    halves = setting == "intra1_two_halves"
    size = batch // 2 if halves else batch
    arrays, _ = signature_inputs("serving_default", function.structured_input_signature[1], {}, size, seed=0,
                                 dim=seq_len)
    feeds = {name: tf.constant(value) for name, value in arrays.items()}

    def serve():
        if not halves:
            function(**feeds)
            return
        other = threading.Thread(target=lambda: function(**feeds))
        other.start()
        function(**feeds)
        other.join()
    for _ in range(WARM_CALLS):
        serve()
    walls, cpus = [], []
    for _ in range(BLOCKS):
        wall, cpu, calls = time.perf_counter(), time.process_time(), 0
        while time.perf_counter() - wall < BLOCK_SECONDS:
            serve()
            calls += 1
        walls.append((time.perf_counter() - wall) / calls * 1e3)
        cpus.append((time.process_time() - cpu) / calls * 1e3)
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}


def _print(model: str, batch: int, runs: dict) -> None:
    base = statistics.median(r["wall"] for r in runs["default"])
    print(f"\n{model}, batch {batch} (ms per served batch; median of {len(runs['default'])} alternated runs)")
    print("| setting | wall | CPU | wall vs default |\n|---|---|---|---|")
    for setting, values in runs.items():
        wall, cpu = (statistics.median(r[key] for r in values) for key in ("wall", "cpu"))
        print(f"| {setting} | {wall:.2f} | {cpu:.2f} | {base / wall:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
