"""`mp-rewrite lists`: print the effective op lists for a precision (built-in + env + file + options)."""

from __future__ import annotations

import json

from .list_options import add_list_options, lists_from_args


def register(sub) -> None:
    """Add the `lists` subcommand."""
    p = sub.add_parser("lists", help="show the Allow/Infer/Deny/Clear op lists in effect")
    p.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    add_list_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args) -> int:
    """Print the lists."""
    from ..core.oplists import load_lists
    lists = lists_from_args(args) or load_lists(args.precision)
    if args.json:
        print(json.dumps({"precision": lists.precision, "sources": list(lists.sources), **lists.as_dict()}, indent=1))
        return 0
    print(f"{lists.precision} op lists (sources: {', '.join(lists.sources)})")
    for name, ops in lists.as_dict().items():
        print(f"\n{name} ({len(ops)}):")
        print("  " + ", ".join(ops))
    return 0
