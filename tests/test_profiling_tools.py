"""tools/onednn_primitives.py (the oneDNN primitives a call runs) and tools/bench_serving_settings.py (a call under
the serving settings a process can choose), run as a user runs them."""

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


def test_the_serving_settings_benchmark_tables_each_setting(tmp_path):
    example_models.mlp().export(str(tmp_path / "mlp"), verbose=False)
    tool = TOOL.parent / "bench_serving_settings.py"
    proc = subprocess.run([sys.executable, str(tool), str(tmp_path / "mlp"), "--rounds", "1", "--batch", "4",
                           "--settings", "intra1,frozen_weights"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "setting" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| default", "| intra1", "| frozen_weights"], proc.stdout
    assert "Machine:" in proc.stdout and "load average after" in proc.stdout
    bad = subprocess.run([sys.executable, str(tool), str(tmp_path / "mlp"), "--settings", "turbo"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown setting(s) turbo" in bad.stderr
