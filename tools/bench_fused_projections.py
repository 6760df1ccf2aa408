"""Is one Q/K/V matmul per attention layer faster than three in TensorFlow? (issue 40, batch 1's next lever)

The frozen benchmark Transformer runs its query, key and value projections as three MatMuls of one input by
[256, 256] weights. OpenVINO and other runtimes fuse them into one [256, 768] product; in a TensorFlow graph that is
`MatMul(x, concat(Wq, Wk, Wv))` then a `Split` of its columns into the three. This times both forms in bfloat16,
four layers chained as in the model (each layer's three outputs summed into the next input), at the row counts
the split model runs: 64 (a branch of batch 1's token rows), 128 (batch 1 whole), 1024 and 4096 (batch 8 and 32).
With `--branches 2` the rows are cut in two halves, each running the chain, concatenated at the end: what batch
1's token rows run in the split model (a branch per core). Interleaved blocks in one process, median CPU and wall
ms per call, the ratio fused / three.

    TF_NUM_INTRAOP_THREADS=1 python tools/bench_fused_projections.py [--rows 64,128,1024,4096] [--branches 2]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_fusion import machine, measure  # noqa: E402 -- after the environment TF reads at import

LAYERS, WIDTH = 4, 256


def forms(weights, branches: int):
    """{"three": ..., "fused": ...}: the two forms of LAYERS chained projections on each of `branches` row blocks,
    as tf.functions."""
    import tensorflow as tf
    fused_weight = tf.concat(weights, axis=1)

    def three(x):
        q, k, v = (tf.matmul(x, w) for w in weights)
        return q + k + v

    def fused(x):
        q, k, v = tf.split(tf.matmul(x, fused_weight), 3, axis=1)
        return q + k + v

    def chained(layer):
        @tf.function
        def run(x):
            parts = tf.split(x, branches, axis=0)
            for _ in range(LAYERS):
                parts = [layer(part) for part in parts]
            return tf.concat(parts, axis=0)
        return run
    return {"three": chained(three), "fused": chained(fused)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,128,1024,4096")
    parser.add_argument("--branches", type=int, default=1, help="row blocks run side by side (each rows/N)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block-seconds", type=float, default=0.25)
    args = parser.parse_args(argv)
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    weights = [tf.constant(rng.normal(size=(WIDTH, WIDTH)) / 16, dtype=tf.bfloat16) for _ in range(3)]
    functions = forms(weights, args.branches)
    print(machine())
    print(f"TF {tf.__version__}, intra-op threads {os.environ.get('TF_NUM_INTRAOP_THREADS', 'TF default')}; "
          f"{LAYERS} layers of Q/K/V projections [{WIDTH}, {WIDTH}] in bfloat16, {args.branches} branch(es)")
    print("| rows | three MatMuls: CPU / wall ms | one MatMul + Split: CPU / wall ms | fused / three (wall) |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        x = tf.constant(rng.normal(size=(rows, WIDTH)), dtype=tf.bfloat16)
        apart = np.abs(functions["three"](x).numpy().astype("float32") - functions["fused"](x).numpy().astype(
            "float32")).max()
        times = measure(functions, [x], args.rounds, args.block_seconds)
        (c3, w3), (cf, wf) = times["three"], times["fused"]
        print(f"| {rows} | {c3:.3f} / {w3:.3f} | {cf:.3f} / {wf:.3f} | {wf / w3:.2f}x |"
              + (f" (outputs apart by {apart:.3g})" if apart else ""), flush=True)
    print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
