"""The catalog sweep: every model of tools/catalog_models.py converted in the three modes, one process each.

    .venv/bin/python tools/sweep_catalog.py [--models GLOB,...] [--modes default,freeze,lists] [--page FILE]
    (--modes split,split-in-place: `--split 2` frozen and in place, what the batch split makes of each model)

For each model: build and export it (a process of its own), then `mp-rewrite convert SRC OUT --precision bfloat16
--verify` as it is (the default: in place, cost assignment, rules), with `--freeze`, and with `--assign lists`; each
run is ok (exit 0), verify failed (written and run, but --verify found errors past the low precision's tolerance:
exit 1), refused (a one-line error that says what to do, non-zero exit) or failed (a Python traceback, an error
that calls itself a bug, a time-out). Where the default converted, the written copy's time per call over
the source's at batch 8 (wall, alternated blocks in one process). A line per step as it goes; then a table, and a
page (Markdown, with the machine, its load and this command) for the README to link.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalog_models import catalog  # noqa: E402

from mp_rewrite.savedmodel.split_option import SERVE  # noqa: E402

MODES = {"default": [], "freeze": ["--freeze"], "lists": ["--assign", "lists"],
         # Per-core branches as asked (no timing): what the batch-rows analysis and the check make of each model.
         "split": ["--freeze", "--split", "2"], "split-in-place": ["--split", "2"]}
HERE = Path(__file__).resolve().parent


def classify(code: int | None, output: str) -> tuple[str, str]:
    """(ok | refused | failed, the line that says why) of one convert run: its exit code (None: timed out) and its
    output (stdout and stderr)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if code is None:
        return "failed", "timed out"
    if "Traceback (most recent call last)" in output:
        return "failed", "traceback: " + (lines[-1] if lines else "")
    error = [line for line in lines if line.startswith("mp-rewrite: error:")]
    if code == 0:
        left = [line for line in lines if " left out of " in line]
        split = [line for line in lines if line.startswith("split: ")]  # what a --split run wrote, or why not
        # The split's line whole (batch 1's choice comes last), but for the serving advice every split line ends with.
        said = [f"{len(left)} rule(s) left out: {left[0]}" for _ in left[:1]] + [line.removesuffix(f"; {SERVE}")
                                                                                 for line in split[:1]]
        return "ok", "; ".join(said)
    verdict = [line for line in lines if line.startswith("verification FAILED")]
    if code == 1 and verdict:  # written, runs, and --verify found the low precision's errors past the tolerance
        return "verify failed", verdict[-1]
    if error and "bug" in error[-1]:
        return "failed", error[-1]
    if error:
        return "refused", error[-1]
    return "failed", f"exit {code}: " + (lines[-1] if lines else "no output")


def _run(command: list, timeout: float) -> tuple[int | None, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as expired:
        out = (expired.stdout or b"") + (expired.stderr or b"")
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out, time.perf_counter() - start


def sweep_model(entry: dict, modes: list, workdir: Path, timeout: float, timing: bool) -> dict:
    """Build one model and convert it in each mode; the row of the table."""
    row = {"name": entry["name"], "kind": entry["kind"], "modes": {}}
    if entry["skip"]:
        row["built"] = entry["skip"]
        return row
    source = workdir / entry["name"].replace(" ", "_") / "source"
    shutil.rmtree(source.parent, ignore_errors=True)
    source.parent.mkdir(parents=True)
    code, output, seconds = _run([sys.executable, str(HERE / "catalog_models.py"), "build", entry["name"],
                                  str(source)], timeout)
    if code != 0:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"(\w+\.)*\w+(Error|Exception|Exit)\b", line)]
        row["built"] = "not built: " + ((errors or lines)[-1] if lines else f"exit {code}")[:200]
        print(f"  {entry['name']}: {row['built']}", flush=True)
        return row
    row["built"] = "built"
    cli = str(Path(sys.executable).parent / "mp-rewrite")
    for mode in modes:
        out = source.parent / mode
        code, output, seconds = _run([cli, "convert", str(source), str(out), "--precision", "bfloat16", "--verify",
                                      *MODES[mode]], timeout)
        status, why = classify(code, output)
        row["modes"][mode] = {"status": status, "why": why, "seconds": round(seconds, 1)}
        print(f"  {entry['name']} {mode}: {status} in {seconds:.0f} s {why}"[:300], flush=True)
        if mode == "default" and status == "ok" and timing:
            code, output, _ = _run([sys.executable, str(HERE / "catalog_models.py"), "time", str(source), str(out)],
                                   timeout)
            found = [line for line in output.splitlines() if line.startswith("{")]  # TF logs to stderr after it
            row["speed"] = json.loads(found[-1]) if code == 0 and found else None
    shutil.rmtree(source.parent, ignore_errors=True)
    return row


def machine() -> str:
    """The CPU, its bfloat16 features, TensorFlow's and keras-hub's versions and the load, in one line
    (bench_saved_model_report.machine's facts)."""
    from bench_saved_model_report import machine as facts
    import keras_hub
    found = facts()
    return (f"{found['cpu']} ({', '.join(found['features']) or 'no bfloat16 units'}), {found['cores']} cores, "
            f"TensorFlow {found['tensorflow']}, Keras {found['keras']}, keras-hub {keras_hub.__version__}, "
            f"load {os.getloadavg()[0]:.2f}")


def page(rows: list, modes: list, command: str, started: str) -> str:
    """The Markdown page: the command, the machine, the counts and the table."""
    counts = {s: sum(r["modes"].get(m, {}).get("status") == s for r in rows for m in modes)
              for s in ("ok", "verify failed", "refused", "failed")}
    lines = [f"# The catalog sweep ({started})", "", f"Command: `{command}`", "", f"Machine: {machine()}", "",
             f"{sum(r.get('built') == 'built' for r in rows)} of {len(rows)} models built; conversions: "
             f"{counts['ok']} ok, {counts['verify failed']} written but outside --verify's tolerance, "
             f"{counts['refused']} refused, {counts['failed']} failed.", "",
             "| model | kind | " + " | ".join(modes) + " | default / source, batch 8 (wall) |",
             "|---|---|" + "---|" * len(modes) + "---|"]
    for row in rows:
        if row.get("built") != "built":
            lines.append(f"| {row['name']} | {row['kind']} | " + " | ".join("–" for _ in modes) +
                         f" | {row.get('built', '')} |")
            continue
        cells = []
        for mode in modes:
            run = row["modes"].get(mode, {})
            why = f": {run['why']}" if run.get("why") else ""
            cells.append(f"{run.get('status', '–')} ({run.get('seconds', 0):.0f} s){why}".replace("|", "/"))
        speed = row.get("speed")
        cells.append(f"{speed['ratio']:.2f}x ({speed['copy_ms']:.1f} / {speed['source_ms']:.1f} ms)" if speed
                     else "not measured")
        lines.append(f"| {row['name']} | {row['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="*", help="comma-separated globs of catalog names (default: all)")
    parser.add_argument("--modes", default="default,freeze,lists", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process (default 900)")
    parser.add_argument("--workdir", default="/tmp/mp_rewrite_sweep", help="where models are built (removed after)")
    parser.add_argument("--page", default=None, help="write the Markdown page here")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--no-time", action="store_true", help="skip the batch-8 timing of the default")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r}: choose from {', '.join(MODES)}")
    patterns = args.models.split(",")
    entries = [e for e in catalog() if any(fnmatch.fnmatch(e["name"], p) for p in patterns)]
    if not entries:
        parser.error(f"no catalog model matches {args.models!r}")
    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"sweeping {len(entries)} models x {len(modes)} modes on {machine()}", flush=True)
    command = "python tools/sweep_catalog.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = []
    for index, entry in enumerate(entries, 1):
        print(f"[{index}/{len(entries)}] {entry['name']} ({entry['kind']})"
              + (f": not built, {entry['skip']}" if entry["skip"] else ""), flush=True)
        rows.append(sweep_model(entry, modes, Path(args.workdir), args.timeout, not args.no_time))
        text = page(rows, modes, command.strip(), started)
        if args.page:  # after every model: a sweep cut short still has its page
            Path(args.page).write_text(text)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(text)
    return 1 if any(r["modes"].get(m, {}).get("status") == "failed" for r in rows for m in modes) else 0


if __name__ == "__main__":
    sys.exit(main())
