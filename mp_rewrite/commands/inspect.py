"""`mp-rewrite inspect MODEL`: the colored graph and why nodes stayed float32 — text, JSON, DOT/SVG, HTML, a
TensorBoard log or a Model Explorer overlay."""

from __future__ import annotations

import dataclasses
import os
import sys

from ..errors import ModelError, OptionError
from .list_options import add_assign_options, add_list_options, assign_from_args, options_from_args, say_assignment
from .model_options import add_tag_set_option, say

FORMATS = ("text", "json", "dot", "svg", "html", "tensorboard", "model-explorer")


def add_model_options(p) -> None:
    """The options shared by `inspect` and `explain`: the model and how to rewrite it."""
    p.add_argument("model", metavar="MODEL", help="a SavedModel directory, a GraphDef (.pb/.pbtxt), a MetaGraphDef, "
                   "or a Keras .keras/.h5 file")
    add_tag_set_option(p)
    p.add_argument("--precision", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--device", choices=("gpu", "cpu", "any"),
                   help="which placed nodes to convert (default: gpu for float16, cpu for bfloat16)")
    p.add_argument("--function", metavar="NAME", help="only this rewritten function of the model")
    p.add_argument("--fetch", action="append", metavar="NAME",
                   help="a node or tensor the graph returns (kept float32); default: the signatures' outputs")
    p.add_argument("--keep-fp32", action="append", default=[], metavar="PATTERN",
                   help="node names, scopes or globs to keep in float32")
    p.add_argument("--force-low", action="append", default=[], metavar="PATTERN",
                   help="node names, scopes or globs to force to low precision")
    add_list_options(p)
    add_assign_options(p)


def register(sub) -> None:
    """Add the `inspect` subcommand."""
    p = sub.add_parser("inspect", help="show the colored graph and why ops stayed float32",
                       description="Rewrite MODEL and report what was converted and why the rest was not.")
    add_model_options(p)
    p.add_argument("--format", default="text", choices=FORMATS,
                   help="model-explorer: node data for Google's Model Explorer (the viz extra), colored as the "
                        "pictures; `mp-rewrite view` opens the model with it")
    p.add_argument("-o", "--output", metavar="OUT", help="output file (a directory for tensorboard); default stdout")
    p.add_argument("--around", metavar="NODE", help="dot/svg/html: draw only the neighbourhood of NODE (default: the "
                   "whole model, one box per layer, of the graph holding the network; see docs/pictures.md)")
    p.add_argument("--depth", type=int, default=2, metavar="K", help="edges around --around NODE (default 2)")
    p.add_argument("--collapse-scopes", nargs="?", const=True, default=None, type=int, metavar="DEPTH",
                   help="dot/svg/html: draw name scopes (at DEPTH, or the deepest that fits) as boxes; automatic "
                        "above --max-nodes nodes")
    p.add_argument("--no-collapse", dest="collapse_scopes", action="store_false", help="never collapse scopes")
    p.add_argument("--engine", default="auto", choices=("auto", "python", "graphviz"),
                   help="svg: who lays the picture out (default auto: Python for the whole model, which wraps long "
                        "chains into columns; for --around/--collapse-scopes Graphviz's dot where installed)")
    p.add_argument("--max-nodes", type=int, default=150, metavar="N",
                   help="box budget of a picture; for the whole model, of opening nested layers (default 150)")
    p.add_argument("--top", type=int, default=12, metavar="N", help="rows per summary table (default 12)")
    p.add_argument("--show", choices=("precision", "time"), default=None,
                   help="whole-model svg/html: color the layers by precision or by their measured time per call "
                        "(float32 → as converted, from the cost table; time measures it once where the rewrite "
                        "had none, e.g. after --assign lists). Default: svg precision; html precision with a "
                        "toggle to the times the rewrite read (--show precision leaves them out)")
    p.set_defaults(func=run, precheck=check_inspect_args)


def check_inspect_args(args) -> None:
    """Before TensorFlow starts: MODEL exists, and Model Explorer is installed for --format model-explorer."""
    check_model_path(args)
    if args.format == "model-explorer":
        from ..report.model_explorer import require_installed
        require_installed()


def check_model_path(args) -> None:
    """Before TensorFlow starts: MODEL exists (what it holds is read later)."""
    import os
    if not os.path.exists(args.model):
        raise ModelError(f"'{args.model}' does not exist; give a SavedModel directory, a GraphDef (.pb/.pbtxt), "
                         "a MetaGraphDef or a Keras .keras/.h5 file")


def load_and_rewrite(args):
    """Read args.model and rewrite it with the options of add_model_options; returns (LoadedModel, result)."""
    model, result, _ = rewrite_with_costs(args)
    return model, result


def rewrite_with_costs(args):
    """As load_and_rewrite, and the costs the rewrite read: a CostTable, a machine or file table (the rewrite
    made the graph's table from it), or None for Grappler's lists. Returns (LoadedModel, result, costs)."""
    from ..core.assignment import SOURCE
    from ..model.loaded import load_model, rewrite_model
    from ..savedmodel.in_place import rules_after_pass, rules_and_costs, rules_before_pass
    from .verify import stderr_status
    model = load_model(args.model, args.tag_set, say)
    say_opaque(model, args.precision)
    say_split(model)
    say_dispatch(model)
    options = options_from_args(args, **assign_from_args(args))
    records = {}
    if model.meta_graph is not None:  # what convert rewrites in place: with the cost assignment, after the rules
        if _in_model(args, model, options):
            with stderr_status(TIMING):
                meta_graph, options, records = rules_and_costs(model.meta_graph, options, model.path)
            if options.costs.keep == SOURCE:
                # The times are those of the rules' float32 graph (the model as given was only raced): drawn on
                # the model as given, the nodes the rules rewrote would have none (ResNet-50: 10 of 65 ms).
                drawn = ("the model as given ran fastest: convert writes it unchanged; shown as its times were "
                         "measured, with the graph rules' rewrites, in float32")
                say(drawn)
                costs = options.costs
                options = dataclasses.replace(options, costs=dataclasses.replace(costs, keep="float32",
                                                                                 note=f"{costs.note}; {drawn}"))
                meta_graph, records = rules_before_pass(model.meta_graph, options)
        else:
            meta_graph, records = rules_before_pass(model.meta_graph, options)
        model = dataclasses.replace(model, meta_graph=meta_graph, graph_def=meta_graph.graph_def)
    result = rewrite_model(model, fetches=args.fetch, options=options)
    if model.meta_graph is not None:
        rules_after_pass(result, records, options)
    say_assignment(result, verb="chose")
    return model, result, options.costs


def opaque_modules(model) -> list:
    """The XlaCallModule ops of the model's main graph and the functions it rewrites (model/xla_modules.py)."""
    from ..model.xla_modules import xla_modules
    return xla_modules(model.graph_def, model.function_names)


def say_opaque(model, precision: str) -> None:
    """One note (stderr, whatever the format) when the model computes in XlaCallModule ops the pass cannot see."""
    from ..model.xla_modules import opaque_line
    modules = opaque_modules(model)
    if modules:
        say(f"{opaque_line(modules, precision)}; their work was not reached, and no count below includes it")


def say_split(model) -> None:
    """One note when the model's signatures split their batch, or one sample's token rows, into concurrent branches
    (convert --split): how to serve it."""
    from ..savedmodel.split_option import SERVE, row_branches, split_branches
    functions = model.graph_def.library.function
    split, rows = split_branches(f.signature.name for f in functions), row_branches(functions)
    branches, least = split or (0, 0)
    batches = "each batch" if least == branches else f"each batch of {least} or more"
    said = ([f"split {batches} into {branches} concurrent branches"] if branches else []) + \
        ([f"run batch 1 as its token rows in {rows} concurrent branches"] if rows else [])
    if said:
        say(f"its signatures {' and '.join(said)} (convert --split): {SERVE}")


def say_dispatch(model) -> None:
    """One note when the model's signatures dispatch on the batch size (convert's batch dispatch)."""
    from ..savedmodel.dispatch_verdict import dispatches
    if dispatches(f.signature.name for f in model.graph_def.library.function):
        say("its signatures dispatch on the batch size (convert's batch dispatch): each batch runs float32 or the low "
            "precision, whichever measured faster at its size where it was converted")


def _text_items(result, tables, model, top: int):
    """The text report's blocks, true of a model with XlaCallModule ops: report/text.py knows only the GraphDef,
    so its "no matmul" and "every compute-heavy op computes in low precision" lines are said of what it saw."""
    from ..model.xla_modules import summary as modules_summary
    from ..report import text
    from ..report.stats import summarize
    stats = summarize(tables, result)
    items = text.blocks(stats, top)
    modules = opaque_modules(model)
    if not modules:
        return items
    flop = text.flop_line(stats)
    unseen = f"not reached: {modules_summary(modules)}, serialized StableHLO this pass cannot see into"
    replaced = {"matmul/conv FLOPs: the graph has no matmul or convolution":
                "matmul/conv FLOPs: none outside the XlaCallModule ops",
                "every compute-heavy op computes in low precision":
                "every compute-heavy op the pass saw computes in low precision (the work inside the XlaCallModule "
                "ops was not reached)"}
    out = []
    for item in items:
        out.append(replaced.get(item, item) if isinstance(item, str) else item)
        if isinstance(item, str) and item == flop:
            out.append(unseen)
    return out


def _json_with_opaque(result, function, tables, model) -> str:
    """The JSON report with "xla_call_modules": one entry per XlaCallModule op (what it computes, if read)."""
    import json

    from ..report import json_report
    report = json_report.to_dict(result, function, tables=tables, model=model.path)
    report["xla_call_modules"] = [
        {"graph": m.graph, "node": m.node, "module": m.name, "gradient": m.gradient, "unread": m.unread,
         "ops": None if m.heavy is None else [{"op": op, "dtype": d, "count": n} for (op, d), n in m.heavy.items()]}
        for m in opaque_modules(model)]
    return json.dumps(report, indent=1)


TIMING = "timing the model's ops on this machine (once: the times are cached)"


def _in_model(args, model, options) -> bool:
    """Whether the costs are measured in the model, as convert measures them: a SavedModel directory, the whole
    model (no --fetch), this machine's costs."""
    from ..savedmodel.measured_costs import measuring
    return model.kind == "saved_model" and os.path.isdir(model.path) and args.fetch is None and measuring(options)


def _measured_in_model(args, model, options):
    """The options with the SavedModel's costs measured in the model (or cached), as convert measures them."""
    from ..savedmodel.measured_costs import in_place_costs
    from .verify import stderr_status
    if not _in_model(args, model, options):
        return options
    with stderr_status(TIMING):
        return in_place_costs(options, model.path, model.meta_graph)


def time_costs(args, model, costs, measure: bool = True):
    """The CostTable of the time view and explain's times: the one the rewrite read; made from the machine's or
    file's table for this model; or, after Grappler's lists, measured now as `--assign cost` measures it (with a
    note: it takes a while once, then the cache answers). None without a table and `measure` False."""
    from ..core.assignment import CostTable
    if costs is None:
        if not measure:
            return None
        from ..analysis.op_costs import this_machine
        say("the time view reads the model's op times on this machine: measured now unless cached (the first "
            "time takes a while)")
        options = options_from_args(args, assign="cost", costs=this_machine(args.precision))
        costs = _measured_in_model(args, model, options).costs
    if isinstance(costs, CostTable):
        return costs
    return costs.for_graph(model.graph_def, args.precision, fetches=model.fetches)


def write_output(path: str | None, text: str, say: bool = True) -> None:
    """Write text to `path` and, with `say`, one line saying so ("wrote mobilenet.html (212 KB)"); or to stdout
    when None.

    Raises:
        ModelError: the file cannot be written.
    """
    if path is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise ModelError(f"cannot write '{path}': {e.strerror or e}") from None
    if say:
        print(f"wrote {path} ({max(1, round(len(text.encode()) / 1024))} KB)")


def _picture_options(args) -> dict:
    if args.max_nodes < 1:
        raise OptionError(f"--max-nodes must be at least 1, got {args.max_nodes}")
    return {"around": args.around, "depth": args.depth, "collapse_scopes": args.collapse_scopes,
            "max_nodes": args.max_nodes}


def run(args) -> int:
    """Rewrite the model and write the report in the chosen format."""
    from ..report import dot, html, tensorboard, text
    from ..report.node_table import build_tables
    if args.format == "tensorboard" and not args.output:
        raise OptionError("--format tensorboard needs -o LOGDIR")
    if args.around and args.format in ("text", "json", "tensorboard", "model-explorer"):
        raise OptionError(f"--around draws a picture: use it with --format dot, svg or html, not {args.format}")
    timed = _check_show(args)
    model, result, costs = rewrite_with_costs(args)
    # --show time measures what is missing; the HTML page's default shows the times the rewrite already had
    costs = time_costs(args, model, costs, measure=args.show == "time") if timed else None
    if args.format == "dot":
        write_output(args.output, dot.to_dot(result, args.function, **_picture_options(args)))
        return 0
    if args.format == "svg" and costs is not None:
        from ..report.whole_model import whole_model_svg
        write_output(args.output, whole_model_svg(result, args.function, _picture_options(args)["max_nodes"],
                                                  costs=costs))
        return 0
    if args.format == "svg":
        write_output(args.output, dot.to_svg(result, args.function, engine=args.engine, **_picture_options(args)))
        return 0
    if args.format == "model-explorer":
        return _write_model_explorer(args, model, result)
    tables = build_tables(result, args.function, with_flops=args.format != "tensorboard")
    if args.format == "tensorboard":
        path = tensorboard.write_tensorboard(result, args.output, args.function, tables)
        print(f"wrote {path}; view it with: tensorboard --logdir {args.output} (TensorBoard comes with "
              "pip install 'mp_rewrite[viz]')")
    elif args.format == "json":
        write_output(args.output, _json_with_opaque(result, args.function, tables, model))
    elif args.format == "html":
        write_output(args.output, html.to_html(result, args.function, tables=tables, model=args.model,
                                               top=args.top, costs=costs, show=args.show or "precision",
                                               **_picture_options(args)))
    elif args.output is None and sys.stdout.isatty():
        from rich.console import Console
        text.render_rich(_text_items(result, tables, model, args.top), Console(highlight=False))
    else:
        write_output(args.output, text.render_plain(_text_items(result, tables, model, args.top)))
    return 0


def _check_show(args) -> bool:
    """Whether the report draws the time view (--show time, or an HTML whole-model page unless --show precision).

    Raises:
        OptionError: --show with a format or picture that has no time view.
    """
    whole = not args.around and args.collapse_scopes is None
    if args.show is not None and args.format not in ("svg", "html"):
        raise OptionError(f"--show colors a picture: use it with --format svg or html, not {args.format}")
    if args.show == "time" and not whole:
        raise OptionError("--show time draws the whole-model picture: drop --around and --collapse-scopes")
    if args.show == "time" and args.format == "svg" and args.engine == "graphviz":
        raise OptionError("--show time is drawn by the Python layout: drop --engine graphviz")
    return whole and (args.show == "time" or (args.format == "html" and args.show is None))


def _write_model_explorer(args, model, result) -> int:
    from ..report.model_explorer import to_model_explorer
    overlay = to_model_explorer(result, model, args.function, quiet=not args.verbose)
    write_output(args.output, overlay.to_json(), say=False)
    if args.output:
        print(f"wrote {args.output}: {overlay.summary()}; open it with: mp-rewrite view {args.model}, or in Model "
              f"Explorer open {overlay.source.path} with the adapter '{overlay.source.adapter}' and add it as "
              "node data")
    return 0
