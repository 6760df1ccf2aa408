"""Benchmark: `convert --freeze` with and without `--split`, under TF's default threads and one intra-op thread.

    python tools/bench_batch_split.py NAME=WHOLE_MODEL,SPLIT_MODEL [...] [--batches 8,32] [--rounds 3]

For each pair of SavedModels (the same model converted with `--freeze` and with `--freeze --split N`, or in place
with and without `--split N`: `--whole-label 'in place'`), each
(model, batch, setting) runs in its own process (TF reads its threads once, at start); inside it the whole model,
the split model and -- for reference, what a server with concurrent requests gets -- two concurrent calls of the
whole model on half the batch each (two Python threads) are timed interleaved: 10 warm calls each, then 8 rounds
of one 0.25 s block per variant, the median block kept, wall and CPU time of the process. The whole sequence of
processes is repeated `--rounds` times, alternated, and the table shows the medians over rounds, wall / CPU ms
per served batch, and each cell's wall speed-up over the whole model under TF's default threads. The CPU, its
bfloat16 features and the load before and after are printed. Settings: "TF defaults" (intra-op threads = cores)
and "1 intra-op thread" (tf.config.threading.set_intra_op_parallelism_threads(1), as TF_NUM_INTRAOP_THREADS=1 or
TF Serving's --tensorflow_intra_op_parallelism=1 set it).
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

SETTINGS = {"default": "TF defaults", "intra1": "1 intra-op thread"}
VARIANTS = ("whole", "split", "two_calls")
WARM_CALLS, BLOCKS, BLOCK_SECONDS = 10, 8, 0.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="NAME=WHOLE,SPLIT")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--whole-label", default="--freeze",
                        help="what the whole model is called in the table (e.g. 'in place' for an in-place pair)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        whole, split = args.pairs[0].split(",")
        print(json.dumps(_timed(whole, split, args.child, batches[0])))
        return 0
    pairs = {}
    for pair in args.pairs:
        name, _, paths = pair.partition("=")
        whole, _, split = paths.partition(",")
        if not (name and whole and split):
            parser.error(f"give each model as NAME=WHOLE,SPLIT, not {pair!r}")
        pairs[name] = f"{whole},{split}"
    facts = machine()
    print(f"Machine: {facts['cpu']}, {facts['cores']} cores, {', '.join(facts['features']) or 'no bfloat16 units'}; "
          f"TensorFlow {facts['tensorflow']}; load average before: {_load()}")
    runs = {}
    for _ in range(args.rounds):
        for name, models in pairs.items():
            for batch in batches:
                for setting in SETTINGS:
                    runs.setdefault((name, batch, setting), []).append(_child(models, setting, batch))
    _print(pairs, batches, runs, args.rounds, args.whole_label)
    print(f"load average after: {_load()}")
    return 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _child(models: str, setting: str, batch: int) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, __file__, models, "--child", setting, "--batches", str(batch)], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{models} ({setting}, batch {batch}): {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _timed(whole_path: str, split_path: str, setting: str, batch: int) -> dict:
    """{variant: {"wall": ms, "cpu": ms}} per served batch in this process's setting, the variants interleaved."""
    import tensorflow as tf
    if setting == "intra1":
        tf.config.threading.set_intra_op_parallelism_threads(1)
    from mp_rewrite.savedmodel.inputs import signature_inputs
    whole = tf.saved_model.load(whole_path).signatures["serving_default"]
    split = tf.saved_model.load(split_path).signatures["serving_default"]
    arrays, _ = signature_inputs("serving_default", whole.structured_input_signature[1], {}, batch, seed=0)
    feeds = {name: tf.constant(value) for name, value in arrays.items()}
    halves = [{name: value[part] for name, value in feeds.items()}
              for part in (slice(0, batch // 2), slice(batch // 2, batch))]

    def two_calls():
        other = threading.Thread(target=lambda: whole(**halves[1]))
        other.start()
        whole(**halves[0])
        other.join()
    serve = {"whole": lambda: whole(**feeds), "split": lambda: split(**feeds), "two_calls": two_calls}
    for call in serve.values():
        for _ in range(WARM_CALLS):
            call()
    blocks = {variant: [] for variant in serve}
    for _ in range(BLOCKS):
        for variant, call in serve.items():
            wall, cpu, calls = time.perf_counter(), time.process_time(), 0
            while time.perf_counter() - wall < BLOCK_SECONDS:
                call()
                calls += 1
            blocks[variant].append(((time.perf_counter() - wall) / calls * 1e3,
                                    (time.process_time() - cpu) / calls * 1e3))
    return {variant: {"wall": statistics.median(w for w, _ in values), "cpu": statistics.median(c for _, c in values)}
            for variant, values in blocks.items()}


def _print(pairs: dict, batches: list, runs: dict, rounds: int, whole: str = "--freeze") -> None:
    print(f"\nwall / CPU ms per served batch, median of {rounds} alternated processes (variants interleaved in "
          f"each); (x) = wall speed-up over {whole} with TF's default threads")
    columns = [("default", "whole"), ("default", "split"), ("intra1", "whole"), ("intra1", "split"),
               ("intra1", "two_calls")]
    names = {"whole": whole, "split": "split", "two_calls": "two concurrent half calls"}
    print("| model | batch | " + " | ".join(f"{names[v]}, {SETTINGS[s]}" for s, v in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name in pairs:
        for batch in batches:
            cells, base = [], None
            for setting, variant in columns:
                values = [run[variant] for run in runs[name, batch, setting]]
                wall, cpu = (statistics.median(v[key] for v in values) for key in ("wall", "cpu"))
                base = wall if base is None else base
                cells.append(f"{wall:.1f} / {cpu:.1f} ({base / wall:.2f}x)")
            print(f"| {name} | {batch} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
