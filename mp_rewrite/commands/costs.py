"""`mp-rewrite costs MODEL [-o FILE]`: the op costs of a model measured on this machine (cached), the per-op
table the cost assignment (`--assign cost`) reads, and what the assignment predicts against Grappler's lists."""

from __future__ import annotations

import collections
import json

from .inspect import check_model_path
from .list_options import predicted


def register(sub) -> None:
    """Add the `costs` subcommand."""
    p = sub.add_parser("costs", help="measure a model's op costs here (float32 vs low precision) for --assign cost",
                       description="Time each distinct op of MODEL that Grappler's lists would make low precision, "
                                   "in float32 and in the low precision, at the model's own shapes, on this "
                                   "machine (cached per machine under $XDG_CACHE_HOME/mp_rewrite), and show the "
                                   "table and what the cost assignment predicts. -o FILE exports the table for "
                                   "--costs FILE on another machine.")
    p.add_argument("model", metavar="MODEL", help="a SavedModel directory, a GraphDef (.pb/.pbtxt) or a MetaGraphDef")
    p.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="the batch size an unknown leading input dimension is measured at (default 1)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the model's cost table (JSON) to FILE")
    p.add_argument("--no-cache", action="store_true", help="measure everything again; do not update the cache")
    p.add_argument("--top", type=int, default=20, metavar="N", help="rows of the table (default 20)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run, precheck=check_model_path)


def run(args) -> int:
    """Measure (or read from the cache), print the table, and export it if asked."""
    from ..analysis.graph_costs import graph_candidates
    from ..analysis.op_costs import MachineCosts, measure_costs
    from ..core.rewrite import rewrite_graph_def
    from ..model.loaded import load_model
    from .verify import stderr_status
    model = load_model(args.model)
    with stderr_status("measuring op costs on this machine"):
        table = measure_costs(model.graph_def, args.precision, model.fetches, args.batch_size,
                              cache=not args.no_cache)
    specs = graph_candidates(model.graph_def, args.precision, tuple(model.fetches), args.batch_size)[0]
    keys = {s.key for s in specs}
    mine = MachineCosts(table.precision, table.machine, {k: v for k, v in table.ops.items() if k in keys},
                        table.casts, table.source, args.batch_size)
    result = rewrite_graph_def(model.graph_def, args.precision, model.fetches, assign="cost", costs=mine,
                               function_names=model.function_names)
    rows = _rows(specs, mine)
    if args.json:
        print(json.dumps({"machine": mine.machine, "rows": rows, "prediction": predicted(result)}, indent=1))
    else:
        _print(args, mine, rows, predicted(result))
    if args.output:
        mine.save(args.output)
        print(f"wrote {args.output}: {len(mine.ops)} op signatures; convert with --assign cost --costs "
              f"{args.output}")
    return 0


def _rows(specs, table) -> list[dict]:
    """One row per op signature: op, input shapes, nodes, float32 and low ms per node (None: not measured)."""
    count, first = collections.Counter(s.key for s in specs), {}
    for s in specs:
        first.setdefault(s.key, s)
    rows = []
    for key, spec in first.items():
        times = table.ops.get(key)
        shapes = [list(shape) if shape is not None else None for shape, _, _ in spec.fp32_inputs]
        rows.append({"op": spec.fp32_node.op, "shapes": shapes, "nodes": count[key],
                     "fp32_ms": times[0] if times else None, "low_ms": times[1] if times else None})
    return sorted(rows, key=lambda r: -(r["fp32_ms"] or 0) * r["nodes"])


def _print(args, table, rows, p) -> None:
    from rich.table import Table
    from .verify import stdout_console
    console = stdout_console()
    m = table.machine
    console.print(f"{m.get('cpu')} ({', '.join(m.get('cpu_flags', ())) or 'no vector flags'}), TensorFlow "
                  f"{m.get('tensorflow')}, oneDNN {m.get('onednn')}; costs from {table.source}", soft_wrap=True)
    if p["note"]:
        console.print(f"note: {p['note']}", soft_wrap=True)
    grid = Table(title=f"op costs per node ({args.precision} vs float32, ms)", title_justify="left")
    for column in ("op", "input shapes", "nodes", "float32", args.precision, "speed-up"):
        grid.add_column(column, justify="left" if column in ("op", "input shapes") else "right")
    for r in rows[:args.top]:
        f, low = r["fp32_ms"], r["low_ms"]
        ratio = f"{f / low:.2f}x" if f is not None and low else "-"
        grid.add_row(r["op"], _shapes(r["shapes"]), str(r["nodes"]), _num(f), _num(low), ratio)
    console.print(grid)
    if len(rows) > args.top:
        console.print(f"{len(rows) - args.top} more op signatures not listed (--top N)")
    console.print(f"predicted for the {p['candidates']} nodes the lists make {args.precision}: float32 "
                  f"{p['fp32_cost']:.3f} ms, lists {p['lists_cost']:.3f} ms, cost assignment {p['cost']:.3f} ms "
                  f"({p['demoted']} kept float32), bound {p['bound']:.3f} ms (each op at its faster precision, "
                  "casts not counted)", soft_wrap=True)


def _num(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _shapes(shapes) -> str:
    return " ".join("?" if s is None else "x".join(str(d) for d in s) or "scalar" for s in shapes)
