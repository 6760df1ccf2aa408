"""A CPU with bfloat16 units, with oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`, a setting users reach for):
bfloat16 convolutions cannot run ("could not create a primitive descriptor"). `--assign lists` then writes a model
that does not run, which the run check refuses in one line; the default (the cost assignment) knows the cap leaves
no bfloat16 units (analysis.op_costs.MachineCosts.low_units), times nothing in bfloat16 and converts what runs
(float32) with a note, never a traceback (a variant that fails while timed: test_onednn_isa_cap.py).

Each conversion runs the CLI in a fresh interpreter with that environment (oneDNN reads it once, at start), and a
cache directory of its own (a profile cached without the cap would be reused: the cap is not in its key).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from users import entries, one_line_error, run_cli

CPU_FLAGS = open("/proc/cpuinfo").read() if sys.platform.startswith("linux") else ""
pytestmark = pytest.mark.skipif("avx512_bf16" not in CPU_FLAGS and "amx_bf16" not in CPU_FLAGS,
                                reason="the CPU has no bfloat16 units (avx512_bf16/amx_bf16): bfloat16 fails "
                                "without oneDNN held to AVX2 too, nothing is specific to the cap")
RUNS = """
import sys, tensorflow as tf
function = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
feeds = {name: tf.ones([2, 32, 32, 3]) for name in function.structured_input_signature[1]}
print(function(**feeds)["output_0"].shape)
"""


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """example_models.cnn_bn at 32x32 (convolutions, batch norms, a dense layer), exported (only read): what the
    cap refuses is any bfloat16 convolution, and a small model keeps the five CLI runs here short."""
    from mp_rewrite.testing import example_models
    path = tmp_path_factory.mktemp("avx2") / "cnn"
    example_models.cnn_bn(image_size=32).export(str(path), verbose=False)
    return path


@pytest.fixture
def avx2(monkeypatch, tmp_path):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MP_REWRITE_ASSIGN", raising=False)  # tests/conftest.py sets the lists; the default is asked


def test_lists_in_bfloat16_are_refused_in_one_line(cnn, tmp_path, avx2):
    done = run_cli("convert", cnn, tmp_path / "out", "--precision", "bfloat16", "--freeze", "--assign", "lists")
    assert done.returncode == 2
    line = one_line_error(done.stderr, "failed to run signature 'serve': ")
    assert "could not create a primitive descriptor" in line and "oneDNN held to AVX2 by ONEDNN_MAX_CPU_ISA" in line
    assert "nothing was written" in line and "out" not in entries(tmp_path)


@pytest.mark.parametrize("freeze", [[], ["--freeze"]], ids=["in-place", "frozen"])
def test_the_default_converts_what_runs(cnn, tmp_path, avx2, freeze):
    done = run_cli("convert", cnn, tmp_path / "out", "--precision", "bfloat16", *freeze)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "note: oneDNN is held to AVX2 (ONEDNN_MAX_CPU_ISA) on the machine the costs are for: no bfloat16 kernels " \
           "below AVX512_CORE_BF16, so every op stays float32" in done.stderr
    assert "0 nodes converted to bfloat16" in done.stdout
    assert "the written copy ran 2 signatures" in done.stdout
    ran = subprocess.run([sys.executable, "-c", RUNS, str(tmp_path / "out")], capture_output=True, text=True)
    assert ran.returncode == 0 and "(2, 10)" in ran.stdout, ran.stderr


def test_tune_races_only_the_candidates_that_run(cnn, tmp_path, avx2):
    """`--tune` converts each candidate; one whose written copy cannot run here is out of the race (it stopped the
    whole tune with the run check's error before), and the fastest of the rest is written."""
    done = run_cli("convert", cnn, tmp_path / "out", "--precision", "bfloat16", "--freeze", "--tune")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "--tune: candidate 'grappler' is out of the race: the converted model failed to run" in done.stdout
    ran = subprocess.run([sys.executable, "-c", RUNS, str(tmp_path / "out")], capture_output=True, text=True)
    assert ran.returncode == 0 and "(2, 10)" in ran.stdout, ran.stderr
