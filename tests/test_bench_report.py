"""tools/bench_saved_model_report.py: what the benchmark's page says of times other processes disturbed, read from
what the rest of the machine used while each variant was timed (analysis/machine_load.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from bench_saved_model_report import disturbed  # noqa: E402


def test_a_time_other_processes_shared_is_named_on_the_page():
    # The benchmark Transformer at batch 8 (2026-12-02, sixth stop): OpenVINO and the split with one intra-op
    # thread both ran on about one core (CPU time over wall 1.0-1.07, against 1.9-2.0 for every other row).
    rows = [{"model": "transformer", "batch": 8, "others": {"openvino": 0.93, "ours_split_auto@intra1": 0.97,
                                                             "ours_freeze": 0.04}},
            {"model": "bert", "batch": 8, "others": {"openvino": 0.02}}]
    line = disturbed(rows)
    assert line.startswith("Disturbed: other processes used more than 0.25 cores"), line
    assert "transformer batch 8 OpenVINO (CPU plugin): 0.93 cores" in line
    assert "transformer batch 8 mp-rewrite --freeze --split auto, 1 intra-op thread: 0.97 cores" in line
    assert "bert" not in line and "0.04" not in line
    quiet = disturbed([{**row, "others": {"openvino": 0.02, "fp32": 0.11}} for row in rows])
    assert quiet.startswith("Other processes used at most 0.11 cores") and "no time above was disturbed" in quiet
    assert "not known here" in disturbed([{"model": "mlp", "batch": 8}])  # no /proc/stat: nothing claimed
