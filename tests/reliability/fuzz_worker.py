"""Run `mp-rewrite convert` in-process on each fuzz case, in one interpreter (TensorFlow starts once), and print
one JSON line per case: exit code, stderr, and the traceback if an exception escaped the CLI. A case that runs longer
than the alarm is recorded as a hang. Usage: python fuzz_worker.py SECONDS CASE_DIR...  (each holds `src`)."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import sys
import traceback


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` in the code under test swallows it."""


def _alarm(signum, frame):
    raise Hang()


def run_case(main, case: str, seconds: int) -> dict:
    err = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    record = {"case": case}
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            record["exit"] = main(["convert", f"{case}/src", f"{case}/out", "--precision", "bfloat16"])
    except Hang:
        record["exit"], record["hang"] = None, True
    except BaseException:  # noqa: B036 -- anything escaping the CLI is a traceback a user would see
        record["exit"], record["traceback"] = None, traceback.format_exc()
    finally:
        signal.alarm(0)
    record["stderr"] = err.getvalue()
    return record


if __name__ == "__main__":
    from mp_rewrite.commands.cli import main
    seconds = int(sys.argv[1])
    for case in sys.argv[2:]:
        print(json.dumps(run_case(main, case, seconds)), flush=True)
