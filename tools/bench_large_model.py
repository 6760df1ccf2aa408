"""Benchmark: `mp-rewrite convert` on a large SavedModel (by default ~600M parameters: nine 8192x8192 float32
weights, 2.4 GB — the size of GPT-2 large, T5-large or Whisper-medium).

    python3 tools/bench_large_model.py [--layers 9] [--width 8192] [--workdir /tmp/mp_large]
                                       [--cases default,freeze] [--timeout 1800] [--json out.json] [--keep]

Builds a tf.Module whose `serving_default` signature is `y = relu(...relu(x @ W1)... @ Wn)` (x: [batch, width]
float32), one weight at a time (the random tensor that initialises a variable is dropped before the next one is
made, so the builder never holds more than the model plus one weight), and saves it as a SavedModel, in a child
process so this one stays small. Then runs, each as a child process (the CLI, TensorFlow start-up included):

    default: python -m mp_rewrite convert SRC OUT --precision bfloat16 --overwrite
    freeze:  python -m mp_rewrite convert SRC OUT --precision bfloat16 --freeze --overwrite

and reports per case: wall time, peak resident memory of the child (`ru_maxrss` from `os.wait4` on that child,
so one case's peak does not leak into the next), exit status, the last lines of its output, and the size of the
output directory. A failing case is a result, not an error of this script. Use `--layers 2 --width 1024` for a
quick run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {"default": [], "freeze": ["--freeze"]}


def build(path: Path, layers: int, width: int) -> None:
    """Save the chain-of-matmuls SavedModel at `path` (runs in a child process, see main)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    class Chain(tf.Module):
        def __init__(self):
            super().__init__()
            self.kernels = []
            for i in range(layers):
                # stateless: the same weights every run; scaled so activations stay O(1) through the chain
                value = tf.random.stateless_normal((width, width), seed=(i, 0), stddev=2.0 / width ** 0.5)
                self.kernels.append(tf.Variable(value, name=f"w{i}"))
                del value

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])
        def serve(self, x):
            for w in self.kernels:
                x = tf.nn.relu(tf.matmul(x, w))
            return {"y": x}

    model = Chain()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def run_child(command: list, log: Path, timeout: float) -> dict:
    """Run `command` with its output in `log`; wall seconds, peak RSS (bytes) of that child, exit status."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline, status, usage = start + timeout, None, None
        while status is None:
            pid, raw, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage = os.waitstatus_to_exitcode(raw), rusage
            elif time.perf_counter() > deadline:
                proc.kill()
                _, raw, usage = os.wait4(proc.pid, 0)
                status = f"killed after {timeout:.0f} s timeout"
            else:
                time.sleep(0.05)
        proc.returncode = status if isinstance(status, int) else -9
    return {"wall_s": time.perf_counter() - start, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "exit": status}


def last_lines(log: Path, n: int = 4) -> list:
    lines = [line.rstrip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-n:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--workdir", default="/tmp/mp_large")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per conversion")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the source and outputs (default: delete them)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / f"chain_{args.layers}x{args.width}"
    env_python = [sys.executable]
    params = args.layers * args.width * args.width
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; model: {args.layers} x {args.width}x{args.width} float32 = {params / 1e6:.0f}M "
          f"parameters, {params * 4 / 1e9:.2f} GB", flush=True)
    shutil.rmtree(source, ignore_errors=True)
    built = run_child(env_python + [__file__, "--build", str(source), str(args.layers), str(args.width)],
                      workdir / "build.log", args.timeout)
    if built["exit"] != 0:
        print(f"building the model failed ({built['exit']}):\n" + "\n".join(last_lines(workdir / "build.log", 20)))
        return 1
    results = {"command": " ".join(["python3", "tools/bench_large_model.py", *(argv or sys.argv[1:])]),
               "layers": args.layers, "width": args.width, "parameters": params,
               "source_bytes": dir_bytes(source), "build": built, "load_before": os.getloadavg()[0], "cases": {}}
    print(f"built {source} in {built['wall_s']:.1f} s (peak RSS {built['peak_rss_bytes'] / 2**30:.1f} GiB), "
          f"{results['source_bytes'] / 1e9:.2f} GB on disk", flush=True)
    for case in args.cases.split(","):
        output = workdir / f"out_{case}"
        shutil.rmtree(output, ignore_errors=True)
        command = env_python + ["-m", "mp_rewrite", "convert", str(source), str(output), "--precision", "bfloat16",
                                *CASES[case], "--overwrite"]
        log = workdir / f"{case}.log"
        result = run_child(command, log, args.timeout)
        result.update(command=" ".join(["mp-rewrite", *command[3:]]), tail=last_lines(log),
                      output_bytes=dir_bytes(output), load_after=os.getloadavg()[0])
        results["cases"][case] = result
        print(f"{case}: exit {result['exit']}, {result['wall_s']:.1f} s wall ({result['user_s']:.1f} user, "
              f"{result['sys_s']:.1f} sys), peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB, output "
              f"{result['output_bytes'] / 1e9:.2f} GB; last lines:\n    " + "\n    ".join(result["tail"]), flush=True)
        if not args.keep:
            shutil.rmtree(output, ignore_errors=True)
    print("\n| case | exit | wall s | peak RSS GiB | output GB |\n|---|---|---|---|---|")
    for case, r in results["cases"].items():
        print(f"| {case} | {r['exit']} | {r['wall_s']:.1f} | {r['peak_rss_bytes'] / 2**30:.2f} | "
              f"{r['output_bytes'] / 1e9:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(source, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--build":
        build(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(main())
