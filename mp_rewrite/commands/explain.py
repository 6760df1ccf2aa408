"""`mp-rewrite explain MODEL NODE`: the final color of one node, the chain of reasons that decided it, and what
would have made it convert."""

from __future__ import annotations

import json

from .inspect import add_model_options, check_model_path, opaque_modules, rewrite_with_costs, time_costs


def register(sub) -> None:
    """Add the `explain` subcommand."""
    p = sub.add_parser("explain", help="why one node has its dtype (and what would convert it)",
                       description="Rewrite MODEL and explain NODE: its color per type attribute, the chain of "
                                   "nodes that decided it, and near misses. For SavedModels every rewritten "
                                   "function is searched (names are per function).")
    add_model_options(p)
    p.add_argument("node", metavar="NODE", help="the node name (as in the GraphDef or FunctionDef)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run, precheck=check_model_path)


def run(args) -> int:
    """Print the explanation of every node named NODE."""
    from ..report.explanation import explain_all
    model, result, costs = rewrite_with_costs(args)
    costs = time_costs(args, model, costs, measure=False)  # times where the rewrite had a table: none measured
    explanations = explain_all(result, args.node, args.function, costs=costs)
    opaque = {(m.graph, m.node): m for m in opaque_modules(model)}
    if args.json:
        print(json.dumps([_with_module(e.as_dict(), opaque.get((e.graph or "", args.node))) for e in explanations],
                         indent=1))
        return 0
    blocks = []
    for e in explanations:
        head = f"in function {e.graph}:\n" if e.graph and (len(explanations) > 1 or not args.function) else ""
        module = opaque.get((e.graph or "", args.node))
        blocks.append(head + e.text() + (f"\n  {_module_line(module)}" if module else ""))
    print("\n\n".join(blocks))
    return 0


def _module_line(module) -> str:
    """What an XlaCallModule node holds, which no reason above covers (model/xla_modules.py)."""
    from ..model.xla_modules import summary
    return (f"inside: {summary([module])}, serialized StableHLO (module {module.name or '?'}) this pass cannot see "
            "into; its work was not reached")


def _with_module(explained: dict, module) -> dict:
    if module is not None:
        explained["xla_call_module"] = _module_line(module)
    return explained
