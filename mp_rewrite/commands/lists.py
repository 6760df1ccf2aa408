"""`mp-rewrite lists`: print the effective op lists for a precision (built-in + env + file + options)."""

from __future__ import annotations

import json

from ..core.oplists import LIST_NAMES, load_lists


def register(sub) -> None:
    """Add the `lists` subcommand."""
    p = sub.add_parser("lists", help="show the Allow/Infer/Deny/Clear op lists in effect")
    p.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--lists", dest="lists_file", metavar="FILE", help="a TOML file of list changes")
    for name in LIST_NAMES:
        p.add_argument(f"--{name}", action="append", default=[], metavar="OP", help=f"add OP to the {name} list")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args) -> int:
    """Print the lists."""
    add = {n: getattr(args, n) for n in LIST_NAMES if getattr(args, n)}
    lists = load_lists(args.precision, lists_file=args.lists_file, add=add)
    if args.json:
        print(json.dumps({"precision": lists.precision, "sources": list(lists.sources), **lists.as_dict()}, indent=1))
        return 0
    print(f"{lists.precision} op lists (sources: {', '.join(lists.sources)})")
    for name, ops in lists.as_dict().items():
        print(f"\n{name} ({len(ops)}):")
        print("  " + ", ".join(ops))
    return 0
