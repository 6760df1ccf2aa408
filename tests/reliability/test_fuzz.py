"""A seeded fuzz test: 1000 mutated SavedModel protos of two models (flipped bytes, removed inputs, invalid dtype enums, deleted
functions, duplicate names) through `mp-rewrite convert`. Whatever the damage: no traceback, no hang, the source
untouched, nothing left next to the output, and every exit 0 a model that loads and runs."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mutations import KINDS, mutate
from users import entries, load_and_run, tree_hash

CASES_PER_KIND = 100
SECONDS_PER_CASE = 60  # a case taking longer is a hang (they take well under a second)


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
        assert "traceback" not in record, f"{case.name}: {record['traceback']}"
        assert not record.get("hang"), f"{case.name} hung"
        if record["exit"] != 0:
            lines = record["stderr"].strip().splitlines()
            assert record["exit"] == 2 and len(lines) == 1 and lines[0].startswith("mp-rewrite: error: "), \
                f"{case.name}: {record}"


def test_sources_untouched_and_no_leftovers(fuzzed):
    cases, records = fuzzed
    for case, _, before in cases:
        assert tree_hash(case / "src") == before, case.name
        expected = ["out", "src"] if records[str(case)]["exit"] == 0 else ["src"]
        assert entries(case) == expected, case.name


def test_every_success_loads_and_runs(fuzzed):
    cases, records = fuzzed
    outcomes = collections.Counter()
    for case, kind, _ in cases:
        converted = records[str(case)]["exit"] == 0
        outcomes[kind, "converted" if converted else "refused"] += 1
        if converted:
            assert load_and_run(case / "out")["y"].shape == (2, 16), case.name
    print("\nfuzz outcomes:", dict(sorted(outcomes.items())))
    # Each kind of damage is sometimes harmless (a removed control input, a renamed unused node): the test would
    # prove nothing if everything were refused.
    assert sum(n for (k, result), n in outcomes.items() if result == "converted") > 0

