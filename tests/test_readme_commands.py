"""Every command the README shows in a ```bash block runs as written after the set-up commands.

The first ```bash block is the set-up itself (a fresh venv and the install; CI runs it). Every later one runs line by
line, in order, from a scratch directory that sees this checkout's `.venv` (the environment running the tests),
`tools/`, `lists/` and `docs/` where the README expects them, so a command that only works in the author's shell
fails here. The first command makes the model the others read; after it the blocks run two at a time, each block's
lines in order (a block reads nothing a later block makes): each command is a process that imports TensorFlow, and
run one after another they were the suite's longest test (310 s of its 24 minutes in CI on 2 cores).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)

pytestmark = [pytest.mark.slow, pytest.mark.first]


def readme_blocks() -> list[list[str]]:
    """The commands of every ```bash block but the first (set-up), a list per block, comments and blank lines left
    out."""
    blocks = BLOCK.findall((ROOT / "README.md").read_text())
    assert len(blocks) >= 2, "the README shows its set-up and at least one block of commands"
    found = []
    for block in blocks[1:]:
        lines = [line.split(" #")[0].strip() for line in block.splitlines()]
        found.append([line for line in lines if line and not line.startswith("#")])
    return [block for block in found if block]


def test_the_setup_block_is_what_ci_runs():
    setup = BLOCK.findall((ROOT / "README.md").read_text())[0]
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in setup.splitlines() if "pytest" in line).strip()
    assert test_command in ci


def expected_output(command: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a README command must print on stdout, and what it must not: the README says what they print.

    Every `--verify` compares outputs that depend on the inputs (the README's example model varies; a model of random
    weights whose activations die out would make it say "verification proved nothing") and passes; `explain` of the
    example's BatchNorm multiply says why it stays float32 (the cut never converts what the lists keep float32)."""
    if "--verify" in command:
        return ("verification passed",), ("proved nothing",)
    if " explain " in command and "batchnorm/mul" in command:
        return ("float32 — infer op",), ()
    return (), ()


def test_every_readme_command_runs_as_written(tmp_path):
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the README's `.venv/bin/...` is this environment
    for name in ("tools", "lists", "docs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # tools/ import the package as the editable install does
    env.pop("MP_REWRITE_ASSIGN", None)  # a user's default (conftest pins the lists for the other tests)

    def run(commands: list) -> None:
        for command in commands:
            proc = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                                  env=env)
            assert proc.returncode == 0, \
                f"README command failed: {command}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
            assert "Traceback" not in proc.stderr, f"{command}: {proc.stderr[-1500:]}"
            wanted, unwanted = expected_output(command)
            for text in wanted:
                assert text in proc.stdout, f"{command}: does not print {text!r}\n{proc.stdout[-1500:]}"
            for text in unwanted:
                assert text not in proc.stdout, f"{command}: prints {text!r}\n{proc.stdout[-1500:]}"
    (first, *rest), *blocks = readme_blocks()
    run([first])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(run, block) for block in (rest, *blocks)]:
            done.result()  # a failed block's assertion, raised here
