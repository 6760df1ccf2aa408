"""The op-list options every subcommand shares, with one meaning each: --allow/--infer/--deny/--clear OP move OP
into that list (out of any other), --remove OP takes it out of every list, --lists FILE applies a TOML file first."""

from __future__ import annotations

from ..core.assign_env import ASSIGN_ENV, assign_from_env

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


def options_from_args(args, keep_fp32=None, **assign):
    """The rewrite Options of a subcommand's arguments, built once (core.options.make_options) and passed whole.

    Args:
        keep_fp32: the keep_fp32 patterns when they are more than args.keep_fp32 (the guard's, a file's).
        assign: what assign_from_args gives (assign="cost" and its costs), or nothing for the lists.
    """
    from ..core.options import make_options
    return make_options(args.precision, args.device, None, args.keep_fp32 if keep_fp32 is None else keep_fp32,
                        args.force_low, lists_file=args.lists_file, remove=args.remove,
                        **{name: getattr(args, name) for name in LIST_FLAGS}, **assign)


def add_assign_options(parser, batch: bool = True) -> None:
    """Add --assign {lists,cost}, --costs FILE (and --batch-size N unless the command has its own)."""
    g = parser.add_argument_group("precision assignment")
    g.add_argument("--assign", choices=("lists", "cost"), default=None,
                   help="lists: Grappler's op lists decide; cost: then a minimum cut over op times measured in the "
                        "model on this machine (or --costs FILE) keeps in float32 what is faster there, casts "
                        "counted; it never makes low what the lists keep float32 (default: cost for a CPU, lists "
                        f"for a GPU; {ASSIGN_ENV}=lists|cost changes it)")
    g.add_argument("--costs", metavar="FILE",
                   help="a cost table (mp-rewrite costs MODEL -o FILE, measured where the model is served); "
                        "implies --assign cost")
    if batch:
        g.add_argument("--batch-size", type=int, default=None, metavar="N",
                       help="with --assign cost: the batch size an unknown leading input dimension is measured at "
                            "(default 8 for a SavedModel, measured in it; 1 for a bare graph's op table)")


def default_assign(args) -> str:
    """The assignment when neither --assign nor --costs is given (convert, inspect, explain and view alike, so
    that they tell one story): "cost" when it converts for a CPU (costs measured in the model on this machine, the
    choice checked by running it), "lists" for a GPU (Grappler's lists were written for its Tensor Cores).
    MP_REWRITE_ASSIGN=lists|cost overrides it (lists: the same conversion on every machine).

    Raises:
        OptionError: MP_REWRITE_ASSIGN is neither.
    """
    chosen = assign_from_env()
    device = args.device or ("gpu" if args.precision == "float16" else "cpu")
    return chosen or ("cost" if device == "cpu" else "lists")


def assign_from_args(args) -> dict:
    """The rewrite_graph_def keyword arguments the assign options give: {} for the lists; else assign="cost" and
    the costs: --costs FILE, or this machine's table in measuring mode, at --batch-size (what the conversion
    rewrites is then measured when it is rewritten: savedmodel.measured_costs, or the op table for a bare graph).
    Without --assign, default_assign decides.

    Raises:
        OptionError: --assign lists with --costs; a bad MP_REWRITE_ASSIGN. CostTableError: a bad cost file.
    """
    from ..errors import OptionError
    assign = getattr(args, "assign", None) or ("cost" if getattr(args, "costs", None) else default_assign(args))
    if assign == "lists":
        if getattr(args, "costs", None):
            raise OptionError("--costs FILE is for --assign cost; drop --assign lists or --costs")
        return {}
    from ..analysis.op_costs import load_costs, this_machine
    batch = getattr(args, "batch_size", None)
    if getattr(args, "costs", None):
        table = load_costs(args.costs)
        table.batch = batch if batch is not None else table.batch
    else:
        table = this_machine(args.precision)
        table.batch = batch
    table.dim = getattr(args, "dim", None)
    return {"assign": "cost", "costs": table}


def predicted(result) -> dict | None:
    """What the cost assignment predicted, summed over a RewriteResult's main graph and its functions (ms): the
    cut ("cost"), the lists, float32, the bound; None when the lists colored it."""
    parts = [r.assignment for r in (result, *result.functions.values()) if r.assignment is not None]
    if not parts:
        return None
    total = {k: sum(getattr(a, k) for a in parts) for k in ("cost", "lists_cost", "fp32_cost", "bound")}
    total["demoted"] = sum(len(a.demoted) for a in parts)
    total["candidates"] = sum(len(a.candidates) for a in parts)
    total["note"] = next((a.note for a in parts if a.note), "")
    total["source"] = parts[0].source
    total["decision"] = next((a.decision for a in parts if a.decision), "")
    return total


def say_assignment(result, label: str = "", stream=None, verb: str = "wrote") -> None:
    """One line on what the cost assignment chose and predicts, and where its costs come from, after the race's
    decision where variants were raced ("wrote float32: bfloat16 measured ...", `verb` for "wrote" where nothing
    is written); on stderr, why it kept everything float32 when the machine has no low-precision units."""
    import sys
    p = predicted(result)
    if p is None:
        return
    if p["note"]:
        print(f"note: {p['note']} (--assign lists converts by Grappler's lists anyway)", file=stream or sys.stderr)
        return
    decision = p["decision"]
    if decision:  # what was written and why, in a user's words, before the figures
        print(verb + decision.removeprefix("wrote"), file=stream or sys.stdout)
    print(f"cost assignment{f' of {label}' if label else ''}: {p['demoted']} of {p['candidates']} candidates kept "
          f"float32; predicted {p['cost']:.2f} ms per run against Grappler's lists {p['lists_cost']:.2f} ms and "
          f"float32 {p['fp32_cost']:.2f} ms; {p['source']}", file=stream or sys.stdout)
