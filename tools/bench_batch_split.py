"""Benchmark: `convert --freeze` with and without `--split`, under TF's default threads and one intra-op thread.

    python tools/bench_batch_split.py NAME=WHOLE_MODEL,SPLIT_MODEL [...] [--batches 8,32] [--rounds 3]

For each pair of SavedModels (the same model converted with `--freeze` and with `--freeze --split N`), every
(model, setting, batch) is timed in its own process by tools/bench_serving_settings.py's child (10 warm calls,
then the median of 6 blocks of 0.5 s, wall and CPU), and the whole sequence is repeated `--rounds` times,
alternated (ABAB), so a change in the machine's load hits every cell alike. The table shows the median over rounds,
wall / CPU ms per call, and each cell's wall ratio against the whole model under TF's defaults. The CPU, its
bfloat16 features and the load before and after are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_saved_model_report import machine

CHILD = str(Path(__file__).resolve().parent / "bench_serving_settings.py")
SETTINGS = {"default": "TF defaults", "intra1": "1 intra-op thread"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="NAME=WHOLE,SPLIT")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pairs = {}
    for pair in args.pairs:
        name, _, paths = pair.partition("=")
        whole, _, split = paths.partition(",")
        if not (name and whole and split):
            parser.error(f"give each model as NAME=WHOLE,SPLIT, not {pair!r}")
        pairs[name] = {"whole": whole, "split": split}
    batches = [int(b) for b in args.batches.split(",")]
    facts = machine()
    print(f"Machine: {facts['cpu']}, {facts['cores']} cores, {', '.join(facts['features']) or 'no bfloat16 units'}; "
          f"TensorFlow {facts['tensorflow']}; load average before: {' '.join(map(str, os.getloadavg()))}")
    runs = {}
    for _ in range(args.rounds):
        for name, models in pairs.items():
            for batch in batches:
                for setting in SETTINGS:
                    for variant, model in models.items():
                        runs.setdefault((name, batch, setting, variant), []).append(_child(model, setting, batch))
    _print(pairs, batches, runs, args.rounds)
    print(f"load average after: {' '.join(map(str, os.getloadavg()))}")
    return 0


def _child(model: str, setting: str, batch: int) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, CHILD, model, "--child", setting, "--batch", str(batch)], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{model} ({setting}, batch {batch}): {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print(pairs: dict, batches: list, runs: dict, rounds: int) -> None:
    print(f"\nwall / CPU ms per call, median of {rounds} alternated processes; (x) = wall speed-up over the whole "
          "model with TF's default threads")
    columns = [(setting, variant) for setting in SETTINGS for variant in ("whole", "split")]
    print("| model | batch | " + " | ".join(f"{'split' if v == 'split' else '--freeze'}, {SETTINGS[s]}"
                                          for s, v in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name in pairs:
        for batch in batches:
            cells, base = [], None
            for setting, variant in columns:
                values = runs[name, batch, setting, variant]
                wall, cpu = (statistics.median(v[key] for v in values) for key in ("wall", "cpu"))
                base = wall if base is None else base
                cells.append(f"{wall:.1f} / {cpu:.1f} ({base / wall:.2f}x)")
            print(f"| {name} | {batch} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
