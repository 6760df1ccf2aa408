"""What a user sees: the CLI run in a fresh interpreter, a fingerprint of a directory tree, the leftovers next to an
output, and whether a SavedModel loads and runs."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf


def run_cli(*args, prelude: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `mp-rewrite ARGS` in a fresh interpreter. `prelude` is Python run first (to force an interleaving)."""
    code = f"import sys\n{prelude}\nfrom mp_rewrite.commands.cli import main\nsys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def tree_hash(path: Path) -> str:
    """A digest of every file name and content under `path` (links followed)."""
    digest = hashlib.sha256()
    for file in sorted(Path(path).rglob("*")):
        digest.update(str(file.relative_to(path)).encode())
        if file.is_file():
            digest.update(file.read_bytes())
    return digest.hexdigest()


def entries(directory: Path) -> list[str]:
    """The names in a directory, hidden ones included (leftovers are hidden)."""
    return sorted(os.listdir(directory))


def one_line_error(stderr: str, fragment: str) -> str:
    """Assert stderr is one `mp-rewrite: error:` line holding `fragment` (after the plain progress lines work that
    went on for over 10 s writes where stderr is not a terminal: "rewriting functions: 1/2 serve"); return it."""
    lines = [line for line in stderr.strip().splitlines() if not re.match(r"[a-zA-Z ,']+: \d+/\d+ ", line)]
    assert len(lines) == 1 and lines[0].startswith("mp-rewrite: error: "), stderr
    assert fragment in lines[0] and "Traceback" not in stderr, stderr
    return lines[0]


def load_and_run(path: Path) -> dict:
    """Load a SavedModel and call its serving signature on ones; return the outputs as numpy arrays."""
    loaded = tf.saved_model.load(str(path))
    function = loaded.signatures["serving_default"]
    specs = function.structured_input_signature[1]
    feeds = {k: tf.ones([2 if d is None else d for d in s.shape], s.dtype) for k, s in specs.items()}
    return {k: np.asarray(v) for k, v in function(**feeds).items()}
