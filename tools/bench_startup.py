"""Benchmark: how fast `mp-rewrite` answers what needs no TensorFlow, against `python -c "import tensorflow"`.

    .venv/bin/python tools/bench_startup.py [--rounds 5]

Each command runs in a fresh interpreter, interleaved with the TensorFlow import over several rounds (so a change
of the machine's load hits both); the table gives median wall time and the ratio to importing TensorFlow. Target:
help, version, argument errors and a missing path under 10% of `import tensorflow`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "mp-rewrite --help": ["-m", "mp_rewrite", "--help"],
    "mp-rewrite --version": ["-m", "mp_rewrite", "--version"],
    "mp-rewrite convert --help": ["-m", "mp_rewrite", "convert", "--help"],
    "mp-rewrite convert ./missing out": ["-m", "mp_rewrite", "convert", "./missing", "out"],
    "mp-rewrite convert (no arguments)": ["-m", "mp_rewrite", "convert"],
}
BASELINE = ("python -c 'import tensorflow'", ["-c", "import tensorflow"])


def wall(args: list) -> float:
    """Seconds for one run of `python ARGS` in a fresh interpreter (its output discarded)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], capture_output=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return time.perf_counter() - start


def main(argv=None) -> int:
    """Time every command against the TensorFlow import and print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    samples = {name: [] for name in [BASELINE[0], *COMMANDS]}
    for _ in range(args.rounds):
        samples[BASELINE[0]].append(wall(BASELINE[1]))
        for name, command in COMMANDS.items():
            samples[name].append(wall(command))
    base = statistics.median(samples[BASELINE[0]])
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}; {args.rounds} interleaved rounds, median wall time")
    print("| command | median s | / import tensorflow |\n|---|---|---|")
    for name, values in samples.items():
        print(f"| `{name}` | {statistics.median(values):.3f} | {statistics.median(values) / base:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
