"""`mp-rewrite verify ORIGINAL CONVERTED`: run both SavedModels on the same inputs and compare every output.

Also the progress bar and result tables that `mp-rewrite convert --verify` shares. Progress goes to stderr as a
rich bar on a terminal and is silent when stderr is piped; tables go to stdout (plain text when piped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..savedmodel.verify import VerifyReport, verify_saved_models
from .model_options import add_tag_set_option

PLAIN_WIDTH = 120  # tables printed to a pipe or file: wide enough not to wrap columns


def register(sub) -> None:
    """Add the `verify` subcommand."""
    p = sub.add_parser("verify", help="compare a converted SavedModel's outputs with the original's",
                       description="Run every signature of both SavedModels on the same inputs (random ones from "
                       "the signature with a fixed seed, or --inputs) and compare each output: max abs and rel "
                       "error, cosine similarity, NaN/Inf counts. Exit 1 if an output is outside the tolerance.")
    p.add_argument("original", help="the original SavedModel directory")
    p.add_argument("converted", help="the converted SavedModel directory")
    p.add_argument("--signature", action="append", default=[], metavar="NAME",
                   help="verify only this signature (repeatable; default: all)")
    add_tag_set_option(p)
    p.add_argument("--precision", default=None, metavar="float16|bfloat16",
                   help="whose default tolerances to use (default: detected from the converted model)")
    add_verify_options(p)
    p.set_defaults(func=run, precheck=precheck)


def precheck(args) -> None:
    """Before TensorFlow starts: both paths are SavedModels and the verification options are usable."""
    from ..model.files import saved_model_file
    saved_model_file(args.original)
    saved_model_file(args.converted)
    check_verify_options(args)


def check_verify_options(args) -> None:
    """Check every verification option (tolerances, seed, sizes, shapes, inputs file) without TensorFlow."""
    from ..savedmodel.inputs import check_input_options
    check_input_options(inputs=args.inputs, seed=args.seed, batch_size=made_up_batch(args), dim=args.dim,
                        input_shapes=args.input_shapes, rtol=args.rtol, atol=args.atol)


def made_up_batch(args) -> int:
    """The batch size of made-up inputs: --batch-size, else savedmodel.inputs.DEFAULT_BATCH (the option stays None
    when not given, so that convert's cost assignment chooses its own: commands.list_options)."""
    from ..savedmodel.inputs import DEFAULT_BATCH
    return DEFAULT_BATCH if args.batch_size is None else args.batch_size


def add_verify_options(parser) -> None:
    """Add the options shared by `verify` and `convert --verify`."""
    g = parser.add_argument_group("verification")
    g.add_argument("--inputs", metavar="FILE.npz", help="input arrays keyed by input name (or SIGNATURE/name); "
                   "inputs not in the file are made up (strings must be given)")
    g.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="size of an undefined batch dimension in made-up inputs (default 2); for convert's cost "
                   "assignment, the batch it measures at (default: measured at 8, the variants raced at 1, 8 and "
                   "32 and the best across them kept)")
    g.add_argument("--seq-len", dest="dim", type=int, default=16, metavar="N",
                   help="size of every other undefined dimension in made-up inputs (default 16); for convert's "
                   "cost assignment and --split auto, the length they measure at")
    g.add_argument("--input-shapes", metavar="NAME=AxB,...",
                   help="shapes of made-up inputs, e.g. token_ids=2x128,padding_mask=2x128")
    g.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    g.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: float16 1e-2, "
                   "bfloat16 5e-2)")
    g.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: float16 1e-2, "
                   "bfloat16 5e-2)")


def run(args) -> int:
    """Verify and print the comparison; 0 if every output passed, 1 otherwise."""
    report = run_verification(args.original, args.converted, args, args.signature, args.precision, args.tag_set)
    return 0 if report.passed else 1


def run_verification(original, converted, args, signatures, precision, tag_set=None,
                     shown_original: str | None = None, converted_runs: dict | None = None) -> VerifyReport:
    """Run verify_saved_models with the CLI's options and progress bar, then print the report (naming the original
    `shown_original`, when it is not the directory read: a Keras file exported to a temporary SavedModel;
    `converted_runs`: the run check's calls of the converted model, compared instead of calling it again)."""
    with progress_bar("verifying") as progress:
        report = verify_saved_models(original, converted, signatures=signatures or None, inputs=args.inputs,
                                     batch_size=made_up_batch(args), seed=args.seed, rtol=args.rtol, atol=args.atol,
                                     precision=precision, input_shapes=args.input_shapes, dim=args.dim,
                                     tag_set=tag_set, progress=progress, converted_runs=converted_runs)
    print_report(dataclasses.replace(report, original=shown_original) if shown_original else report)
    return report


def stdout_console() -> Console:
    """A console for tables: rich on a terminal, plain and wide when piped. Never rich's automatic highlighting:
    it colors "2.31x" as "2." and "31x"; what is colored, the markup says."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(width=PLAIN_WIDTH, no_color=True, highlight=False)


@contextlib.contextmanager
def progress_bar(description: str, finishing: str | None = None):
    """Yield a callback (done, total, name) driving a progress bar on stderr when it is a terminal, else writing a
    line to stderr per step (StepLines: a CI log sees long work go on). The bar is removed when the block ends;
    `finishing` replaces the description once done == total."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield StepLines(description, finishing)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("[dim]{task.fields[item]}"))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None, item="")

        def update(done, total, name):
            label = finishing if finishing and done >= total else description
            bar.update(task, completed=done, total=total, item=name, description=label)
        yield update


class StepLines:
    """A progress callback (done, total, name) for output that is not a terminal: once the work has gone on for
    `after` seconds (short work stays silent, and a CLI error stays the one line on stderr), one plain line per step
    ("tuning: 7/23 verifying 'grappler' (candidate 2 of 6), about 3 min left"), at most one every `every` seconds
    (a stage of many small steps, such as rewriting hundreds of functions, says where it is now and then), the last
    always."""

    def __init__(self, description: str, finishing: str | None = None, stream=None, every: float = 1.0,
                 after: float = 10.0):
        self.description, self.finishing, self.stream, self.every = description, finishing, stream, every
        self.began, self.after = time.monotonic(), after
        self.last = -math.inf  # when the last line was written

    def __call__(self, done, total, name) -> None:
        label = self.finishing if self.finishing and total and done >= total else self.description
        now = time.monotonic()
        if now - self.began < self.after or (now - self.last < self.every and not (total and done >= total)):
            return
        self.last = now
        count = f"{done}/{total} " if total else ""
        print(f"{label}: {count}{name}", file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def stderr_status(description: str):
    """A spinner with `description` on stderr while the block runs (long work shows progress); silent when stderr
    is not a terminal (progress_bar's lines say where long work is)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with console.status(description):
        yield


def _number(value: float) -> str:
    return "0" if value == 0 else f"{value:.2e}"


def print_report(report: VerifyReport, console: Console | None = None) -> None:
    """Print one row per output (max abs/rel error, cosine, NaN/Inf, verdict) and the summary line."""
    console = console or stdout_console()
    table = Table(title=f"{report.converted} against {report.original}", title_justify="left")
    for column in ("signature", "output", "shape", "max abs", "max rel", "cosine", "NaN/Inf", "result"):
        table.add_column(column, justify="right" if column in ("max abs", "max rel", "cosine") else "left")
    for c in report.checks:
        special = f"{c.nan[0] + c.inf[0]} -> {c.nan[1] + c.inf[1]}"
        cosine = "-" if c.cosine is None else f"{c.cosine:.6f}"
        result = "[green]pass[/]" if c.passed else f"[red]FAIL[/] {c.problem}"
        if c.passed and c.unvarying:
            result = f"[yellow]proves nothing[/] ({c.unvarying})"
        table.add_row(c.signature, c.output, "x".join(map(str, c.shape)) or "scalar", _number(c.max_abs),
                      _number(c.max_rel), cosine, special, result)
    console.print(table)
    console.print(report.summary(), soft_wrap=True)
    for signature, per in report.inputs.items():
        made = ", ".join(f"{name} {how}" for name, how in per.items())
        console.print(f"  inputs of {signature}: {made or 'none'}", soft_wrap=True)
