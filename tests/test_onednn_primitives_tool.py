"""tools/onednn_primitives.py: the oneDNN primitives a SavedModel's call runs, summed per call, beside its wall."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mp_rewrite.testing import example_models

TOOL = Path(__file__).resolve().parents[1] / "tools" / "onednn_primitives.py"


def test_it_tables_the_primitives_of_a_call(tmp_path):
    example_models.mlp().export(str(tmp_path / "mlp"), verbose=False)
    proc = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "mlp"), "--batch", "4", "--calls", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    head, _, rows = proc.stdout.partition("kind, implementation, problem\n")
    assert "batch 4:" in head and "oneDNN primitives taking" in head and "outside them" in head, proc.stdout
    assert "inner_product" in rows or "matmul" in rows, proc.stdout  # the MLP's Dense layers


def test_a_model_that_cannot_load_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "missing")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
