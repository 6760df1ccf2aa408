"""The `mp-rewrite` command line: one subcommand per module in mp_rewrite/commands/.

Errors of the package's own type print one line and exit 2; a bug still shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from .model_options import add_effects_option

# Subcommand modules, in the order `mp-rewrite --help` lists them. Each defines register(subparsers), which adds
# its parser and sets `func` (args -> exit code).
COMMANDS = ("demo", "convert", "verify", "inspect", "explain", "view", "lists", "costs")
# The subcommands that run the model they are given (to measure, check or time it): they take --run-effects.
RUNS_MODELS = ("convert", "verify", "inspect", "explain", "view")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every available subcommand registered."""
    from .. import __version__
    parser = argparse.ArgumentParser(prog="mp-rewrite", description="Mixed precision graph rewriter for TensorFlow "
                                     "(Grappler's auto_mixed_precision pass, in Python, explained).")
    parser.add_argument("--version", action="version", version=f"mp-rewrite {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show TensorFlow's own log lines (kept out of the output by default)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"mp_rewrite.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"mp_rewrite.commands.{name}":
                raise
            continue
        module.register(sub)
    for name in RUNS_MODELS:
        if name in sub.choices:
            add_effects_option(sub.choices[name])
    return parser


def import_tensorflow_quietly(verbose: bool = False) -> None:
    """Import TensorFlow with file descriptor 2 silenced: its C++ start-up lines ("oneDNN custom operations are
    on", absl's pre-init warning) ignore TF_CPP_MIN_LOG_LEVEL and bury a CLI's own output. An import error is
    still raised, after stderr is restored. With `verbose`, TensorFlow logs as it would on its own."""
    # TF's bfloat16 pass and fast bfloat16 CPU kernels need oneDNN. TF 2.21's `tensorflow` wheel turns it on by
    # itself on this x86 machine (it logs "oneDNN custom operations are on" without the variable; checked with
    # _pywrap_util_port.IsMklEnabled()); older wheels and other CPUs may not, so it is set here all the same.
    # TF_ENABLE_ONEDNN_OPTS=0 in the environment still turns it off.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    if verbose:
        import tensorflow  # noqa: F401
        return
    # TF's C++ log lines are noise in a CLI's output; "2" still lets E-lines through (cuInit, oneDNN "DT_HALF only
    # on platforms with AVX-512" on machines that have it).
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def main(argv=None) -> int:
    """Run the CLI; return the exit code (0 ok, 1 a check failed, 2 bad input or a failed rewrite).

    Arguments are parsed and each command's `precheck(args)` (paths, option values: TensorFlow-free) runs before
    TensorFlow is imported, so help, version and argument errors answer at once.
    """
    argv = sys.argv[1:] if argv is None else argv
    from ..errors import MpRewriteError
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and argument errors: argparse has printed what to say
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    previous = signal.signal(signal.SIGTERM, _terminated) if _main_thread() else None
    try:
        precheck = getattr(args, "precheck", None)
        if precheck is not None:
            precheck(args)
        keep_freed_memory()
        _import_tensorflow_keeping_sigterm(previous is not None, args.verbose)
        with effects_said(args):
            return int(args.func(args) or 0)
    except Terminated:
        return _report_terminated()
    except KeyboardInterrupt:
        print("mp-rewrite: interrupted; nothing half-written was left", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mp-rewrite lists | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        # Terminated raised while TensorFlow's C++ was on the stack can come back as another error: pybind11
        # replaces it ("MISMATCH of original and normalized active exception types"), and the loader reports that
        # as an unloadable model. The clean-up has run either way; what ended the run was the SIGTERM.
        if Terminated.received:
            return _report_terminated()
        if not isinstance(e, MpRewriteError):
            raise
        print(f"mp-rewrite: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def effects_said(args):
    """The effects policy of a command (core.effects): the model's effects are run only with --run-effects, and a
    command other than convert (whose summary names them) says in a note what a copy stood in for."""
    from ..core.effects import running_effects
    from .model_options import say
    return running_effects(getattr(args, "run_effects", False), None if args.command == "convert" else say)


def _report_terminated() -> int:
    print("mp-rewrite: terminated (SIGTERM); nothing half-written was left", file=sys.stderr)
    return 143


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory for reuse rather than hand it back to the system at once.

    A conversion copies protos holding every weight several times (Grappler's calls, the rewrite, the save); with
    glibc's defaults each large block is unmapped when freed and faulted in again when the next one is made, which
    cost ResNet-50's `convert --freeze` 0.7 s of system time in 10 s. Freed memory then stays with the process
    until it exits, which a command-line run does soon. A no-op where the C library is not glibc.
    """
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # glibc's malloc.h
    libc.mallopt(m_mmap_threshold, 32 << 20)  # the largest glibc accepts on 64-bit systems
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_top_pad, 256 << 20)


def _import_tensorflow_keeping_sigterm(handled: bool, verbose: bool) -> None:
    """Import TensorFlow with SIGTERM held back: its C++ start-up installs a handler of its own (which kills the
    process) over Python's. Ours is put back afterwards and a SIGTERM that arrived meanwhile is delivered to it."""
    if not handled:
        import_tensorflow_quietly(verbose)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        import_tensorflow_quietly(verbose)
        signal.signal(signal.SIGTERM, _terminated)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean-up runs (staging directories, locks, the old output).
    `received` stays set once one has arrived, however the exception was carried (or replaced) on its way up."""
    received = False


def _terminated(signum, frame):
    Terminated.received = True
    raise Terminated()


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()

if __name__ == "__main__":
    sys.exit(main())


def one_line(message: str) -> str:
    """The message on one line: control characters (a corrupt model's names can hold any) written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
