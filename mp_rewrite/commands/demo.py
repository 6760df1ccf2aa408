"""`mp-rewrite demo`: build a small Keras model, rewrite its graph, check the numerics, print the summary."""

from __future__ import annotations

import numpy as np


def register(sub) -> None:
    """Add the `demo` subcommand."""
    p = sub.add_parser("demo", help="rewrite a bundled Keras example and print what changed")
    p.add_argument("--example", default="cnn_bn/inference",
                   help="which bundled graph (see mp_rewrite.examples.EXAMPLES); default cnn_bn/inference")
    p.add_argument("--precision", default="bfloat16", choices=("float16", "bfloat16"),
                   help="bfloat16 (default) runs fast on CPUs; float16 targets GPUs")
    p.add_argument("--device", default="cpu", choices=("gpu", "cpu", "any"))
    p.set_defaults(func=run)


def run(args) -> int:
    """Rewrite the example, run both graphs on the same inputs, print the summary and the largest error."""
    from ..testing.examples import EXAMPLES
    from ..analysis.execution import run_graph_def
    from ..core.rewrite import rewrite_graph_def
    if args.example not in EXAMPLES:
        from ..errors import OptionError
        raise OptionError(f"unknown example {args.example!r}; choose one of: {', '.join(EXAMPLES)}")
    example = EXAMPLES[args.example]()
    result = rewrite_graph_def(example.graph_def, args.precision, example.fetches, device=args.device)
    print(f"{args.example}: {result.summary()}")
    print(f"Grappler's own line (it counts type attributes, and only the casts into {args.precision}):")
    print(f"  {result.grappler_line()}")
    if example.kind == "inference":
        expected = run_graph_def(example.graph_def, example.inputs, example.fetches)
        got = run_graph_def(result.graph_def, example.inputs, example.fetches)
        worst = max(float(np.max(np.abs(e - g))) for e, g in zip(expected, got))
        print(f"outputs match float32 within {worst:.2e} (max abs difference, {args.precision})")
    print("next: mp-rewrite inspect/explain to see why each node has its color; mp-rewrite convert for SavedModels")
    return 0
