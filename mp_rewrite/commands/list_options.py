"""The op-list options every subcommand shares, with one meaning each: --allow/--infer/--deny/--clear OP move OP
into that list (out of any other), --remove OP takes it out of every list, --lists FILE applies a TOML file first."""

from __future__ import annotations

LIST_FLAGS = ("allow", "infer", "deny", "clear")


def add_list_options(parser) -> None:
    """Add --lists, --allow, --infer, --deny, --clear and --remove to a subcommand's parser."""
    g = parser.add_argument_group("op lists (TF's lists for the precision, then these changes)")
    g.add_argument("--lists", dest="lists_file", metavar="FILE", help="a TOML file of op list changes")
    for name in LIST_FLAGS:
        g.add_argument(f"--{name}", action="append", default=[], metavar="OP",
                       help=f"move OP into the {name} list, out of any other (repeatable)")
    g.add_argument("--remove", action="append", default=[], metavar="OP",
                   help="take OP out of every list, so it keeps its dtype (repeatable)")


def lists_from_args(args):
    """The OpLists the options give (None: the built-in lists with TF's environment variables)."""
    from ..core.oplists import edit_lists
    return edit_lists(args.precision, None, args.lists_file, *(getattr(args, n) for n in LIST_FLAGS),
                      remove=args.remove)


def options_from_args(args, keep_fp32=None):
    """The rewrite Options of a subcommand's arguments, built once (core.options.make_options) and passed whole.

    Args:
        keep_fp32: the keep_fp32 patterns when they are more than args.keep_fp32 (the guard's, a file's).
    """
    from ..core.options import make_options
    return make_options(args.precision, args.device, None, args.keep_fp32 if keep_fp32 is None else keep_fp32,
                        args.force_low, lists_file=args.lists_file, remove=args.remove,
                        **{name: getattr(args, name) for name in LIST_FLAGS})
