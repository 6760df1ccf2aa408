"""Where a SavedModel's call spends its time in oneDNN: every primitive TensorFlow executes (ONEDNN_VERBOSE=1),
summed per call by kind and implementation, beside the call's wall time.

    python tools/onednn_primitives.py SAVED_MODEL [--batch 8] [--seq-len 128] [--calls 10] [--signature KEY]

Made-up inputs as `verify` makes them (mp_rewrite.savedmodel.inputs); 5 warm-up calls, then `--calls` timed ones
whose verbose lines are summed. The wall time includes writing the verbose lines, so compare primitive totals
between models, and the wall time only against another run of this tool. What the primitives do not cover
(TensorFlow's executor, ops oneDNN does not run, the hand-offs to the intra-op thread pool) is the difference.
Re-runs itself with ONEDNN_VERBOSE=1 set before TensorFlow starts.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

MARK = "=== timed calls ==="


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128, help="unknown dimensions other than the batch")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--signature", default="serving_default")
    parser.add_argument("--top", type=int, default=15, help="rows of the table")
    args = parser.parse_args()
    if os.environ.get("ONEDNN_VERBOSE") != "1":
        proc = subprocess.run([sys.executable, *sys.argv], env={**os.environ, "ONEDNN_VERBOSE": "1"},
                              capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed", file=sys.stderr)
            return proc.returncode
        return _report(proc.stdout, args)
    _run(args)
    return 0


def _run(args) -> None:
    import tensorflow as tf
    from mp_rewrite.savedmodel.inputs import signature_inputs
    function = tf.saved_model.load(args.model).signatures[args.signature]
    arrays, _ = signature_inputs(args.signature, function.structured_input_signature[1], {}, args.batch, seed=0,
                                 dim=args.seq_len)
    feeds = {name: tf.constant(value) for name, value in arrays.items()}
    for _ in range(5):
        function(**feeds)
    print(MARK, flush=True)
    start = time.perf_counter()
    for _ in range(args.calls):
        function(**feeds)
    print(f"{MARK} wall {(time.perf_counter() - start) / args.calls * 1e3:.2f}", flush=True)


def _report(output: str, args) -> int:
    timed = output.split(MARK)
    if len(timed) < 3:
        print("no timed calls in the output (did the model run?)", file=sys.stderr)
        return 1
    totals = collections.defaultdict(lambda: [0, 0.0])
    for line in timed[1].splitlines():
        fields = line.split(",")
        if line.startswith("onednn_verbose") and "exec" in fields:
            at = fields.index("exec")
            key = (fields[at + 2], fields[at + 3], fields[-2])  # kind, implementation, problem
            totals[key][0] += 1
            totals[key][1] += float(fields[-1])
    wall = float(timed[2].split()[1])
    total = sum(ms for _, ms in totals.values()) / args.calls
    count = sum(n for n, _ in totals.values()) / args.calls
    print(f"{args.model}, batch {args.batch}: {wall:.2f} ms wall per call (verbose on), {count:.0f} oneDNN "
          f"primitives taking {total:.2f} ms; {max(wall - total, 0):.2f} ms outside them")
    print(f"{'ms/call':>8} {'count':>6}  kind, implementation, problem")
    for (kind, impl, problem), (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{ms / args.calls:8.3f} {n / args.calls:6.1f}  {kind}, {impl}, {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
