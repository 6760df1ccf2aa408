"""A seeded fuzz test: 1000 mutated SavedModel protos of two models (flipped bytes, removed inputs, invalid dtype enums, deleted
functions, duplicate names) through `mp-rewrite convert`. Whatever the damage: no traceback, no hang, the source
untouched, nothing left next to the output, every exit 0 a model that loads and runs, and no refusal that blames
mp_rewrite (the run check refuses an output that fails where the source runs: exit 2, but our bug).

A failing case is copied, with the worker's record, to $MP_REWRITE_FUZZ_KEEP (default: the temp directory's
mp_rewrite-fuzz-failures/), and the message names it: rerun it with `mp-rewrite convert CASE/src out --precision
bfloat16`. The cases depend on the bytes of the two models saved at test time (function names carry TensorFlow's
trace counter), so the same seed in another test order is another case: keep the directory."""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import subprocess
import sys
from pathlib import Path

import pytest

from mutations import KINDS, mutate
from users import entries, load_and_run, tree_hash

CASES_PER_KIND = 100
SECONDS_PER_CASE = 60  # a case taking longer is a hang (they take well under a second)
OUR_BUG = ("mp_rewrite bug", "bug in mp_rewrite", "our bug")  # what a refusal says when the output is at fault


def kept(case: Path, record: dict, why: str) -> str:
    """Copy a failing case (its src, its out if any) and the worker's record where it outlives pytest's temporary
    directories; return the failure message naming both."""
    root = Path(os.environ.get("MP_REWRITE_FUZZ_KEEP") or Path(tempfile.gettempdir()) / "mp_rewrite-fuzz-failures")
    target = root / case.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(case, target, symlinks=True)
    (target / "record.json").write_text(json.dumps(record, indent=1))
    return (f"fuzz case {case.name} ({why}); kept at {target} (record.json: the worker's record); rerun: "
            f"mp-rewrite convert {target}/src out --precision bfloat16")


@pytest.fixture(scope="module")
def fuzzed(source, looper, tmp_path_factory):
    """(case directory, kind, hash of its source) for every case, and the worker's record of each."""
    root = tmp_path_factory.mktemp("fuzz")
    cases = []
    for model in (source, looper):
        data = (model / "saved_model.pb").read_bytes()
        for kind in KINDS:
            for seed in range(CASES_PER_KIND):
                case = root / f"{model.name}-{kind}-{seed}"
                shutil.copytree(model, case / "src")
                (case / "src" / "saved_model.pb").write_bytes(mutate(data, kind, seed))
                cases.append((case, kind, tree_hash(case / "src")))
    worker = Path(__file__).with_name("fuzz_worker.py")
    proc = subprocess.run([sys.executable, str(worker), str(SECONDS_PER_CASE), *(str(c) for c, _, _ in cases)],
                          capture_output=True, text=True, timeout=SECONDS_PER_CASE * 4 + 600)
    records = {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert proc.returncode == 0 and len(records) == len(cases), f"the worker died: {proc.stderr[-2000:]}"
    return cases, records


def test_no_traceback_no_hang_and_one_line_errors(fuzzed):
    cases, records = fuzzed
    for case, kind, _ in cases:
        record = records[str(case)]
        assert "traceback" not in record, kept(case, record, f"traceback: {record.get('traceback')}")
        assert not record.get("hang"), kept(case, record, "hung")
        if record["exit"] != 0:
            lines = record["stderr"].strip().splitlines()
            assert record["exit"] == 2 and len(lines) == 1 and lines[0].startswith("mp-rewrite: error: "), \
                kept(case, record, f"not a one-line refusal: {record}")
            assert not any(words in lines[0] for words in OUR_BUG), kept(case, record, lines[0])


def test_sources_untouched_and_no_leftovers(fuzzed):
    cases, records = fuzzed
    for case, _, before in cases:
        record = records[str(case)]
        assert tree_hash(case / "src") == before, kept(case, record, "the source changed")
        expected = ["out", "src"] if record["exit"] == 0 else ["src"]
        assert entries(case) == expected, kept(case, record, f"left {entries(case)}")


def test_every_success_loads_and_runs(fuzzed):
    cases, records = fuzzed
    outcomes = collections.Counter()
    for case, kind, _ in cases:
        converted = records[str(case)]["exit"] == 0
        outcomes[kind, "converted" if converted else "refused"] += 1
        if converted:
            try:
                shape = load_and_run(case / "out")["y"].shape
            except Exception as e:  # TensorFlow's errors; the case must be named and kept, not lost in a traceback
                pytest.fail(kept(case, records[str(case)], f"exit 0, but the output fails: {str(e).splitlines()[0]}"))
            assert shape == (2, 16), kept(case, records[str(case)], f"exit 0, output shape {shape}")
    print("\nfuzz outcomes:", dict(sorted(outcomes.items())))
    # Each kind of damage is sometimes harmless (a removed control input, a renamed unused node): the test would
    # prove nothing if everything were refused.
    assert sum(n for (k, result), n in outcomes.items() if result == "converted") > 0

