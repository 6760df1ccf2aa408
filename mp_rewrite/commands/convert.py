"""`mp-rewrite convert SRC DST`: write a mixed precision copy of a SavedModel (see mp_rewrite.saved_model).

Prints a table of what changed per function and the share of matmul/conv FLOPs now in low precision; with
--verify, then runs both models on the same inputs and exits 1 if an output is outside the tolerance.
"""

from __future__ import annotations

import dataclasses

from rich.table import Table

from .list_options import add_assign_options, add_list_options, assign_from_args, options_from_args, say_assignment
from .model_options import add_tag_set_option, saved_model_path, say
from .verify import (add_verify_options, check_verify_options, made_up_batch, progress_bar, run_verification,
                     stdout_console)

TOP_ROWS = 15  # functions listed in the table; the rest are summed in one line


def register(sub) -> None:
    """Add the `convert` subcommand."""
    p = sub.add_parser("convert", help="convert a SavedModel to mixed precision (float16 or bfloat16)",
                       description="Write a new SavedModel whose signatures, variables, assets and object graph "
                       "are the original's, with every function its signatures (and restored objects) run "
                       "rewritten to mixed precision the way Grappler's auto_mixed_precision pass would. The "
                       "source is only read; the output appears only when complete.")
    p.add_argument("source", help="the SavedModel directory to convert, or a Keras .keras/.h5 file (exported as "
                   "model.export does; the output is a SavedModel)")
    p.add_argument("output", help="the directory to write (must not exist, unless --overwrite)")
    p.add_argument("--precision", default="float16", metavar="float16|bfloat16",
                   help="the low precision (default float16)")
    p.add_argument("--signature", action="append", default=[], metavar="NAME",
                   help="convert only the functions of this signature (repeatable; default: every signature and "
                   "the functions tf.saved_model.load restores)")
    add_tag_set_option(p)
    p.add_argument("--device", default=None, metavar="gpu|cpu|any",
                   help="which device's nodes to convert (default: gpu for float16, cpu for bfloat16)")
    add_list_options(p)
    p.add_argument("--keep-fp32", action="append", default=[], metavar="PATTERN",
                   help="keep nodes matching this name pattern (glob or name scope) in float32 (repeatable)")
    p.add_argument("--force-low", action="append", default=[], metavar="PATTERN",
                   help="force nodes matching this name pattern to low precision (repeatable)")
    p.add_argument("--freeze", action="store_true",
                   help="an inference artifact: fold the variables the signatures read into constants, let "
                   "TensorFlow fold what that makes foldable, rewrite, and store weights used only in low precision "
                   "in low precision (about half the size). Keeps every signature; drops variables and the "
                   "restored objects (so no training)")
    p.add_argument("--freeze-weights", default="auto", choices=("auto", "constants", "variables"),
                   help="with --freeze: constants (weights folded into the graph), variables (kept as variables of "
                   "the output, in low precision where only read so: models of any size) or auto (default: "
                   "constants unless they pass protobuf's 2 GB limit on one graph)")
    p.add_argument("--split", default="off", metavar="auto|N|off",
                   help="run each signature's batch in N concurrent branches (slices of the batch, outputs "
                   "concatenated; in place the signature calls its rewritten function per slice, with --freeze the "
                   "frozen graph), where every op is proven to keep samples apart and the split equals the whole "
                   "call on random inputs; auto keeps it only where it measures faster here in one serving setting "
                   "(TF's default threads, one intra-op thread: the other timed in a child process) and not slower "
                   "in the other; with --tune the winner's split is raced beside it. Batch 1 is decided apart: one "
                   "sample's token rows (a Transformer's) in 2 branches, where proven, equal and (auto) faster. "
                   "Serve a split model with one intra-op thread. Default off")
    p.add_argument("--keras-metadata", default="keep", choices=("keep", "drop"),
                   help="a tf_keras model's keras_metadata.pb: keep (default; tf_keras.models.load_model then runs "
                   "float32 layers, a warning says how to load the converted functions) or drop (load_model refuses "
                   "the model; tf.saved_model.load runs it mixed precision)")
    p.add_argument("--tune", action="store_true",
                   help="convert candidates (TF's lists; matmul/conv only; the same without depthwise convolutions, "
                   "if the model has any; float32; with --freeze also the model as it is), time them here, and keep "
                   "the fastest that meets the verification tolerance (recorded in assets/mp_rewrite_tuning.json): "
                   "never slower than float32 on this machine. Tune where the model will be served")
    p.add_argument("--weights", default="keep", choices=("keep", "low"),
                   help="keep: variables stay float32 (default); low: weights in low precision (needs --freeze, "
                   "which already stores them so)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output (only once the new one is complete)")
    p.add_argument("--verify", action="store_true", help="then run both models on the same inputs and compare")
    p.add_argument("--no-run-check", dest="run_check", action="store_false",
                   help="do not call each signature of the written copy once before moving it into place (on the "
                   "inputs --verify would make: --inputs, --batch-size, --seq-len, --input-shapes); it is still "
                   "loaded")
    p.add_argument("--allow-opaque-xla", action="store_true",
                   help="write a model that computes in XlaCallModule ops (jax2tf, or Keras 3's model.export on the "
                   "JAX backend) with those ops unchanged: their serialized StableHLO is out of this pass's reach, "
                   "so their matmuls stay in the precision they were exported in. Without it such a model is "
                   "refused (set a Keras mixed policy before exporting, or convert in JAX)")
    p.add_argument("--guard", action="store_true",
                   help="accuracy guard: measure against float32 on --inputs (or random inputs) and keep in float32 "
                   "the few nodes the outputs need to meet --rtol/--atol")
    p.add_argument("--guard-overrides", metavar="FILE",
                   help="with --guard: write the kept nodes and why (.toml or .json), to re-apply with --keep-fp32-file")
    p.add_argument("--keep-fp32-file", metavar="FILE", help="keep_fp32 patterns from a guard overrides file")
    add_assign_options(p, batch=False)  # --batch-size comes with the verify options
    add_verify_options(p)
    p.set_defaults(func=run, precheck=precheck)


def precheck(args) -> None:
    """Before TensorFlow starts: the source is a SavedModel (or a Keras file) and the output may be written."""
    from ..model.files import KERAS_SUFFIXES
    from ..savedmodel.model_dir import check_output
    from ..savedmodel.split_option import parse_split
    if not args.source.lower().endswith(KERAS_SUFFIXES):
        check_output(args.source, args.output, args.overwrite)
    args.split = parse_split(args.split)
    if args.verify or args.guard or args.tune or args.run_check:
        check_verify_options(args)  # a bad option must not be found after the output is written
    if args.guard and args.guard_overrides:
        from ..guard.result import check_overrides_path
        check_overrides_path(args.guard_overrides)  # before minutes of guarding, not after


def run(args) -> int:
    """Convert (after the accuracy guard, if asked), print the summary, and verify if asked; 0 on success, 1 if
    verification failed or the guard could not meet the tolerance."""
    given = args.source  # a Keras file is exported to a temporary SavedModel first; the user's name is shown
    with saved_model_path(args.source) as source:
        args.source = source
        return _run(args, given)


def _run(args, given: str) -> int:
    keep = list(args.keep_fp32) + list(_guard_overrides(args.keep_fp32_file))
    assign = assign_from_args(args)
    options = options_from_args(args, keep, **assign)  # checked once, before anything slow
    check_before_writing(args, options)
    guarded = _run_guard(args, keep) if args.guard else None
    if guarded is not None:
        options = options_from_args(args, keep + list(guarded.keep_fp32), **assign)
    _say_what_this_cpu_computes(args)
    runs = {}  # the run check's calls of the written copy, which --verify compares instead of calling it again
    result = _tune(args, options) if args.tune else _convert(args, options, runs if args.verify else None)
    shared = {}  # signatures of one function share one frozen graph and its assignment: said once
    for label, graph in result.graphs.items():
        shared.setdefault(id(graph), (graph, []))[1].append(label)
    for graph, labels in shared.values():
        say_assignment(graph, ", ".join(labels))
    print_result(dataclasses.replace(result, source=given))
    said = set(result.split)  # what --split chose is no warning
    for note in result.notes:
        stdout_console().print(f"{'split: ' if note in said else '[bold yellow]warning:[/] '}{note}", soft_wrap=True)
    if guarded is not None and not guarded.result.met:
        stdout_console().print("the accuracy guard could not meet the tolerance; see the kept nodes above", soft_wrap=True)
        return 1
    if not args.verify:
        return 0
    report = run_verification(args.source, args.output, args, args.signature, result.precision, args.tag_set,
                              shown_original=given, converted_runs=runs)
    if not (result.written or (result.converted_nodes,))[0]:
        stdout_console().print(f"both sides ran float32 (no node was converted to {result.precision}): the "
                               "verification checked the graph rules' rewrites, not the low precision", soft_wrap=True)
    if not report.passed:
        find = "" if guarded is not None else "; --guard finds them and keeps them float32"
        stdout_console().print(f"the converted model is kept at {args.output}; loosen --rtol/--atol if the errors "
                               f"are acceptable, or keep the offending nodes in float32 with --keep-fp32{find}",
                               soft_wrap=True)
        return 1
    return 0


def check_before_writing(args, options) -> None:
    """What comes after the conversion (--verify) or before it (--guard, --tune: minutes of work) needs, checked before
    that work and before the first byte is written: the whole source, output, tag-set and signatures before the guard
    or tune (the conversion checks them itself otherwise), and that verify can feed every input.

    Raises:
        ModelError: naming what is wrong and the option that fixes it.
    """
    from ..errors import ModelError
    from ..model.files import read_saved_model
    from ..model.signatures import check_signature_keys, signature_keys
    from ..model.tags import parse_tag_set, single_meta_graph
    from ..savedmodel.convert import check_conversion
    from ..savedmodel.inputs import load_inputs, unfeedable_inputs
    tags = parse_tag_set(args.tag_set)
    if args.guard or args.tune:
        saved_model = check_conversion(args.source, args.output, tags, args.signature or None, args.freeze,
                                       args.overwrite, options, args.freeze_weights, args.allow_opaque_xla)[2]
    elif args.verify:
        saved_model = read_saved_model(args.source)
    else:
        return
    what = "--verify" if args.verify else "--guard" if args.guard else "--tune"
    _, meta_graph = single_meta_graph(saved_model, tags, what)
    keys = check_signature_keys(args.signature or None, signature_keys([meta_graph]))
    missing = unfeedable_inputs(meta_graph, keys, load_inputs(args.inputs) if args.inputs else {})
    if missing:
        raise ModelError(f"{what} cannot make up {len(missing)} input(s): {', '.join(missing)}; give them in "
                         "--inputs FILE.npz (keys: input names), or convert without it; nothing was written")


def _convert(args, options, runs: dict | None = None):
    """Convert with the CLI's options; given `runs`, keep the run check's calls in it (verify's converted_runs)."""
    from ..savedmodel.convert import convert_saved_model
    from ..savedmodel.inputs import input_recipe
    from ..savedmodel.verify import keeping_runs
    recipe = input_recipe(args.inputs, batch_size=made_up_batch(args), dim=args.dim, input_shapes=args.input_shapes,
                          seed=args.seed)
    finishing = "estimating FLOPs, writing, running the written copy" if args.run_check else \
        "estimating FLOPs, writing"
    with progress_bar("rewriting functions", finishing=finishing) as progress:
        return convert_saved_model(args.source, args.output, options=options, tag_set=args.tag_set,
                                   signatures=args.signature or None, weights=args.weights, freeze=args.freeze,
                                   freeze_weights=args.freeze_weights, split=args.split,
                                   keras_metadata=args.keras_metadata,
                                   overwrite=args.overwrite, run_check=args.run_check, run_inputs=recipe,
                                   allow_opaque_xla=args.allow_opaque_xla, progress=progress, on_note=say,
                                   on_run=keeping_runs(runs) if runs is not None else None)


def _tune(args, options):
    from ..savedmodel.tune import tune_saved_model
    with progress_bar("tuning") as progress:
        tuned = tune_saved_model(args.source, args.output, options=options, freeze=args.freeze,
                                 overwrite=args.overwrite, inputs=args.inputs, seed=args.seed,
                                 batch_size=made_up_batch(args), tag_set=args.tag_set,
                                 signatures=args.signature or None, weights=args.weights, progress=progress,
                                 allow_opaque_xla=args.allow_opaque_xla, split=args.split, rtol=args.rtol,
                                 atol=args.atol)
    stdout_console().print(tuned.summary(), soft_wrap=True)
    return tuned.conversion


def _say_what_this_cpu_computes(args) -> None:
    """One line when the conversion targets this CPU and it has no native kernels for the precision."""
    import tensorflow as tf

    from ..savedmodel.tune import cpu_low_precision_flags
    device = args.device or ("cpu" if args.precision == "bfloat16" else "gpu")
    if device == "gpu" and tf.config.list_physical_devices("GPU"):
        return
    native = {"bfloat16": {"avx512_bf16", "amx_bf16"}, "float16": {"avx512_fp16", "amx_fp16"}}.get(args.precision)
    if native is None:
        return  # an unknown precision is refused by the conversion, with its own message
    if device == "gpu":
        message = (f"converting for a GPU ({args.precision}, device gpu); this machine has none, and its CPU would "
                   f"run the result slower than float32. For this CPU use --tune, or --precision bfloat16 "
                   "--device cpu where it has AVX512-BF16/AMX")
    elif not native & cpu_low_precision_flags():
        message = (f"this CPU has no native {args.precision} instructions ({' or '.join(sorted(native))}): "
                   f"{args.precision} matmuls and convolutions run slower here than float32. The model is for CPUs "
                   "that have them; to get the fastest model for this one, add --tune")
    else:
        return
    stdout_console().print(f"note: {message}", soft_wrap=True)


def _guard_overrides(path) -> list:
    if not path:
        return []
    from ..guard.accuracy_guard import load_overrides
    return load_overrides(path)


def _run_guard(args, keep):
    """Run the accuracy guard on the (first) signature; print what it kept; save the overrides if asked."""
    from ..guard.saved_model import guard_saved_model
    options = options_from_args(args, keep)
    guarded = guard_saved_model(args.source, args.inputs, args.signature[0] if args.signature else None,
                                args.precision, args.rtol, args.atol, batch_size=made_up_batch(args), seed=args.seed,
                                tag_set=args.tag_set, device=args.device, keep_fp32=keep, force_low=args.force_low,
                                lists=options.lists)
    stdout_console().print(guarded.result.summary(), soft_wrap=True)
    if args.guard_overrides:
        guarded.save_overrides(args.guard_overrides)
    return guarded


def _flops(value: int) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} FLOP"


def _rows(result) -> list[tuple]:
    """(name, RewriteResult, FlopShare or None) for the main graphs and functions that changed or compute."""
    label = "{}" if result.frozen else "main graph ({})"
    rows = [(label.format(tags), r, result.graph_flops.get(tags)) for tags, r in result.graphs.items()
            if r.retyped or r.casts]
    for name, r in result.functions.items():
        share = result.function_flops.get(name)
        if r.retyped or r.casts or (share is not None and share.nodes):
            rows.append((name, r, share))
    return sorted(rows, key=lambda row: (-(row[2].total if row[2] else 0), -len(row[1].retyped)))


def print_result(result) -> None:
    """Print what changed per function, then the totals and the low-precision share of matmul/conv FLOPs."""
    console = stdout_console()
    table = Table(title=f"{result.source} -> {result.output} ({result.precision}, device {result.device})",
                  title_justify="left")
    for column in ("function", "nodes", "converted", "casts inserted", "matmul/conv FLOPs", f"in {result.precision}"):
        table.add_column(column, justify="left" if column == "function" else "right")
    rows = _rows(result)
    for name, r, share in rows[:TOP_ROWS]:
        flops = _flops(share.total) if share and share.total else "-"
        low = f"{share.share:.1%}" if share and share.share is not None else "-"
        table.add_row(name, str(r.num_nodes), str(len(r.converted_nodes)), str(len(r.casts)), flops, low)
    if rows:  # a table with no row (nothing converted, e.g. a tuned float32 model) says nothing
        console.print(table)
    listed = {name for name, _, _ in rows[:TOP_ROWS]}
    more = len(rows) - min(len(rows), TOP_ROWS)
    unchanged = sum(1 for name in result.functions if name not in {n for n, _, _ in rows})
    notes = [f"{_count(more, 'more function')} not listed"] * bool(more and listed)
    notes += [f"{_count(unchanged, 'function')} unchanged (wrappers, nothing to convert)"] * bool(unchanged)
    notes += [f"{_count(len(result.skipped), 'function')} not rewritten ({_why(result.skipped)})"] * \
        bool(result.skipped)
    for note in notes + [_flop_line(result)] + _fusion_lines(result):
        console.print(note, soft_wrap=True)
    functions = len(result.functions)
    # Read back from the written copy (what it holds), falling back on the rewrite's records.
    converted, casts = result.written or (result.converted_nodes, result.casts)
    console.print(f"wrote {result.output}: {_count(converted, 'node')} converted to "
                  f"{result.precision} in the main graph and {_count(functions, 'function')}{_copies(result)}, "
                  f"{_casts_said(result, rows, casts)}, in {result.seconds:.1f} s", soft_wrap=True)
    console.print("(nodes now computing in low precision, and casts in both directions: the numbers "
                  "mp-rewrite inspect and demo report for the same rewrite)", soft_wrap=True)
    if result.ran:
        console.print(f"the written copy ran {_count(len(result.ran), 'signature')} once before it was moved into "
                      f"place ({', '.join(result.ran)})", soft_wrap=True)


def _copies(result) -> str:
    """Where the written copy holds more low-precision nodes than the rewrite converted, why: batch 1's token-row
    split copies the nodes it runs once per branch (frozen, beside the whole graph; in place, a copy of the function),
    so the count read back from the file (777 for the benchmark Transformer in place) is not the table's (281)."""
    if not result.written or result.written[0] <= result.converted_nodes:
        return ""
    where = " in batch 1's token rows" if any("batch 1: token rows in" in line for line in result.split) else ""
    return f" ({result.converted_nodes} by the rewrite, the rest their copies{where})"


def _casts_said(result, rows, casts: int) -> str:
    """The casts the written copy holds, and where the table's (the rewrite's records, once per graph that
    signatures share) differ, how: freezing folds a Cast of a weight into a constant of the precision."""
    inserted = sum(len(r.casts) for r in {id(r): r for _, r, _ in rows}.values())
    if not result.written or inserted in (0, casts) or len(rows) > TOP_ROWS:
        return f"{_count(casts, 'cast')} inserted"
    folded = " (the rest folded into " + result.precision + " constants)" if result.frozen and inserted > casts else ""
    return f"{_count(casts, 'cast')} in the written copy of the {inserted} the rewrite inserted{folded}"


def _fusion_lines(result) -> list[str]:
    """The fusions the rules enabled (per kind) and the first reasons they declined: in the frozen graphs, or in
    the function bodies rewritten in place."""
    import collections
    from ..rules.record import DECLINED
    records = [record for r in result.results() for record in getattr(r, "rules", [])]
    if not records:
        return []
    enabled = collections.Counter(r.fusion for r in records if r.applied and r.fusion)
    declined = collections.Counter(r.reason for r in records if r.status == DECLINED)
    line = "fusions enabled for TensorFlow's remapper: " + (
        ", ".join(f"{n}x {kind}" for kind, n in enabled.most_common()) or "none")
    if declined:
        line += f"; {sum(declined.values())} declined (" + "; ".join(
            f"{n}x {why}" for why, n in declined.most_common(3)) + ")"
    return [line, *_left_out_lines(result)]


def _left_out_lines(result) -> list[str]:
    """One line per rule left out of a function or graph because its rewrite failed the check (rules.graph_check):
    which rule, where, and why; the rest of that graph converted with the other rules."""
    from ..rules.record import LEFT_OUT
    bodies = {id(body): (name, body) for name, body in [*result.graphs.items(), *result.functions.items()]}
    return [f"rule '{record.rule}' left out of '{name}': its rewrite"
            + (f" at '{record.node}' " if record.node != "graph" else " ")
            + record.reason.removeprefix('left out of this graph: its rewrite ')
            for name, body in bodies.values() for record in getattr(body, "rules", []) if record.status == LEFT_OUT]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _why(skipped: dict) -> str:
    reasons = sorted(set(skipped.values()))
    return "; ".join(reasons)


def _flop_line(result) -> str:
    share = result.flops
    if result.opaque and (share is None or not share.nodes):
        return "matmul/conv FLOPs: none found outside the XlaCallModule ops, whose work is not counted"
    if share is None or not share.nodes:
        return "matmul/conv FLOPs: none found"
    if share.share is None:
        return f"matmul/conv FLOPs: shapes unknown for all {share.nodes} matmul/conv nodes"
    unknown = f"; {share.unknown} of {share.nodes} nodes with unknown shapes not counted" if share.unknown else ""
    return (f"matmul/conv FLOPs in {result.precision}: {share.share:.1%} ({_flops(share.low)} of "
            f"{_flops(share.total)}, estimated from shapes, unknown batch dimensions counted as 1{unknown})")
