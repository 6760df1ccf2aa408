"""tools/sweep_catalog.py, the catalog sweep: how it judges a convert run, and one real model swept in the three
modes end to end (the TF1 export: a main graph the rules run in, with ref variables), page and rows written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

from sweep_catalog import classify  # noqa: E402


@pytest.mark.parametrize("code, output, status, why", [
    (0, "wrote x\n", "ok", ""),
    (0, "rule 'gelu' left out of 'f': its rewrite failed the check (x)\n", "ok", "1 rule(s) left out"),
    (2, "mp-rewrite: error: output 'x' already exists; pass --overwrite\n", "refused", "mp-rewrite: error: output"),
    (2, "mp-rewrite: error: the converted model does not load ... This is a bug in mp_rewrite: please report it\n",
     "failed", "This is a bug"),
    (1, "Traceback (most recent call last):\n  File x\nKeyError: 'a/Shape_2'\n", "failed", "traceback: KeyError"),
    (1, "verification FAILED (2 of 2 outputs): 2 outputs of 2 signatures compared\n", "verify failed",
     "verification FAILED (2 of 2"),
    # A split's line is kept whole, batch 1's choice at its end too (a page once read "batch 1 runs w").
    (0, "split: signature serving_default (frozen): not split: node 'a/Repeat/Tile' (Tile): its parameters carry "
        "the batch (same, channel_shape(1)); batch 1 runs whole: output output_0 is (0,) in token rows, (1, 16, 128) "
        "whole (batch 1); serve it with one intra-op thread: TF_NUM_INTRAOP_THREADS=1, "
        "tf.config.threading.set_intra_op_parallelism_threads(1), or TF Serving's --tensorflow_intra_op_parallelism=1\n",
     "ok", "(1, 16, 128) whole (batch 1)"),
    (None, "", "failed", "timed out"),
    (-9, "", "failed", "exit -9"),
])
def test_a_run_is_ok_refused_or_failed(code, output, status, why):
    got, line = classify(code, output)
    assert got == status and why in line


def test_the_catalog_lists_every_keras_hub_backbone_and_says_why_one_is_not_built():
    from catalog_models import backbone_classes, catalog
    entries = catalog()
    names = {entry["name"] for entry in entries}
    assert set(backbone_classes()) <= names and len(backbone_classes()) >= 80
    skipped = {entry["name"]: entry["skip"] for entry in entries if entry["skip"]}
    assert "needs other models" in skipped["SAMBackbone"]
    assert {"BertBackbone", "OPTBackbone", "DebertaV3Backbone", "SwinTransformerBackbone"}.isdisjoint(skipped)


@pytest.mark.slow
def test_a_tf1_export_converts_in_every_mode(tmp_path):
    page, rows = tmp_path / "sweep.md", tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(TOOLS / "sweep_catalog.py"), "--models", "TF1*",
                           "--workdir", str(tmp_path / "work"), "--page", str(page), "--json", str(rows)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [row] = json.loads(rows.read_text())
    assert {mode: run["status"] for mode, run in row["modes"].items()} == {
        "default": "ok", "freeze": "ok", "lists": "ok"}, row
    assert row["speed"]["source_ms"] > 0 and row["speed"]["copy_ms"] > 0  # the default's copy timed beside its source
    text = page.read_text()
    assert "1 of 1 models built; conversions: 3 ok, 0 written but outside --verify's tolerance, 0 refused, 0 failed" \
        in text and "| TF1 dense block |" in text
    assert not (tmp_path / "work" / "TF1_dense_block").exists()  # the built model and its copies are removed
