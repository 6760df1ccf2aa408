"""`mp-rewrite convert` and `mp-rewrite verify` as a user runs them.

A few tests start the real command in a subprocess (exit code, stdout, one-line error, no traceback; each starts
TensorFlow, ~5 s); the rest call `mp_rewrite.commands.cli.main` in-process, which is the same code minus the interpreter.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from mp_rewrite.commands import cli  # noqa: E402


class Scorer(tf.Module):
    """One signature, one big-ish weight (256 KB, so that a small file size limit breaks the copy)."""

    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([256, 256], seed=[1, 2]) * 0.05)
        self.b = tf.Variable(tf.zeros([8]))

    @tf.function(input_signature=[tf.TensorSpec([None, 256], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w))[:, :8] + self.b}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "scorer"
    module = Scorer()
    tf.saved_model.save(module, str(path), signatures=module.__call__)
    return path


def _tree_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        digest.update(str(file.relative_to(path)).encode())
        if file.is_file():
            digest.update(file.read_bytes())
    return digest.hexdigest()


def _run(*args, cwd=None, limit_file_size: int | None = None) -> subprocess.CompletedProcess:
    """Run `mp-rewrite ARGS` (or `saved_model_cli ARGS` when args[0] is "saved_model_cli") in a fresh
    interpreter, as the console scripts do."""
    if args[0] == "saved_model_cli":
        command = [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", *args[1:]]
    else:
        command = [sys.executable, "-m", "mp_rewrite", *args]

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
                          preexec_fn=limit if limit_file_size else None)


def _one_line_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mp-rewrite: error: "), proc.stderr
    assert fragment in lines[0] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------------- subprocesses


def test_convert_verify_and_saved_model_cli(source, tmp_path):
    out = tmp_path / "scorer_bf16"
    proc = _run("convert", str(source), str(out), "--precision", "bfloat16", "--verify")
    assert proc.returncode == 0, proc.stderr
    # No progress bar and no TF chatter when piped: at most a plain line per step of long work (a CI log sees it
    # go on; this conversion is short enough to say none on an idle machine).
    assert all(re.match(r"[a-zA-Z ,]+: \d+/\d+ \S", line) for line in proc.stderr.splitlines()), proc.stderr
    assert "__inference___call___" in proc.stdout and "100.0%" in proc.stdout
    assert "matmul/conv FLOPs in bfloat16: 100.0%" in proc.stdout
    assert "verification passed: 1 output of 1 signature" in proc.stdout and "FAIL" not in proc.stdout
    shown = [_run("saved_model_cli", "show", "--all", "--dir", str(d)) for d in (source, out)]
    assert all(p.returncode == 0 for p in shown), shown[1].stderr
    assert "signature_def['serving_default']" in shown[1].stdout and "shape: (-1, 256)" in shown[1].stdout
    # Same signatures and restored functions, line for line; only the set of ops used differs (Cast is new).
    ops_line = "contains the following ops"
    assert [line for line in shown[1].stdout.splitlines() if ops_line not in line] == \
        [line for line in shown[0].stdout.splitlines() if ops_line not in line]
    assert "'Cast'" in next(line for line in shown[1].stdout.splitlines() if ops_line in line)
    np.save(tmp_path / "x.npy", np.ones((2, 256), np.float32))
    ran = _run("saved_model_cli", "run", "--dir", str(out), "--tag_set", "serve", "--signature_def",
               "serving_default", "--inputs", f"x={tmp_path / 'x.npy'}")
    assert ran.returncode == 0, ran.stderr
    assert "Result for output key y:" in ran.stdout


@pytest.mark.parametrize("args, fragment", [
    (("convert", "no_such_model", "out"), "'no_such_model' does not exist"),
    (("convert", "SOURCE", "out", "--precision", "float8"), "unknown precision 'float8'"),
])
def test_errors_as_a_user_hits_them(source, tmp_path, args, fragment):
    args = [str(source) if a == "SOURCE" else a for a in args]
    proc = _run(*args, cwd=tmp_path)
    _one_line_error(proc, fragment)
    assert proc.stdout == "" and not (tmp_path / "out").exists()


def test_full_disk_loses_nothing(source, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["convert", str(source), str(out), "--precision", "float16"]) == 0
    before_source, before_out = _tree_hash(source), _tree_hash(out)
    assert (source / "variables" / "variables.data-00000-of-00001").stat().st_size > 200_000
    proc = _run("convert", str(source), str(out), "--precision", "bfloat16", "--overwrite",
                limit_file_size=100_000)  # writing the 256 KB variables file fails like a full disk
    _one_line_error(proc, "cannot write the converted model to")
    assert "File too large" in proc.stderr and "nothing was written" in proc.stderr
    assert _tree_hash(source) == before_source and _tree_hash(out) == before_out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --------------------------------------------------------------------------------------------- in-process


@pytest.mark.parametrize("make, args, fragment", [
    ("empty", ("convert", "BAD", "OUT"), "is not a SavedModel: it has no saved_model.pb"),
    ("corrupt", ("convert", "BAD", "OUT"), "is not a valid SavedModel proto"),
    (None, ("convert", "SOURCE", "OUT", "--signature", "predict"), "no signature 'predict'"),
    (None, ("convert", "SOURCE", "SOURCE/variables/out"), "is inside the source"),
    ("existing", ("convert", "SOURCE", "OUT"), "already exists; pass --overwrite"),
    (None, ("convert", "SOURCE", "OUT", "--weights", "low"), "--weights low needs --freeze"),
    (None, ("convert", "SOURCE", "OUT", "--device", "tpu"), "unknown device 'tpu'"),
    (None, ("verify", "SOURCE", "BAD"), "bad' does not exist"),
    (None, ("convert", "SOURCE", "OUT", "--guard", "--guard-overrides", "BAD/kept.toml"), "does not exist"),
    (None, ("convert", "SOURCE", "OUT", "--tag-set", "serve,,gpu"), "--tag-set 'serve,,gpu' has an empty tag"),
    (None, ("convert", "SOURCE", "OUT", "--tag-set", "gpu"), "no MetaGraph tagged 'gpu' (its tag-sets: serve)"),
])
def test_cli_errors_are_one_line(source, tmp_path, capsys, make, args, fragment):
    bad, out = tmp_path / "bad", tmp_path / "out"
    if make:
        (out if make == "existing" else bad).mkdir()
    if make == "corrupt":
        (bad / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff\xff\x0fgarbage")
    subs = {"SOURCE": str(source), "BAD": str(bad), "OUT": str(out)}
    argv = [subs.get(a, a.replace("SOURCE", str(source))) for a in args]
    before = _tree_hash(source)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mp-rewrite: error: ") and fragment in err[0], err
    assert _tree_hash(source) == before
    assert not (out.exists() and any(out.iterdir()))


def test_verify_command_passes_and_fails(source, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["convert", str(source), str(out), "--precision", "bfloat16"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", str(source), str(out)]) == 0
    text = capsys.readouterr().out
    assert "serving_default" in text and "pass" in text
    assert "compared at rtol=0.05, atol=0.05 (the bfloat16 defaults)" in text
    assert cli.main(["verify", str(source), str(out), "--rtol", "0", "--atol", "0"]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "verification FAILED (1 of 1 outputs)" in text


def test_convert_verify_failure_exits_1_and_keeps_the_output(source, tmp_path, capsys):
    out = tmp_path / "out"
    np.savez(tmp_path / "in.npz", x=np.full((3, 256), 3.0, np.float32))
    code = cli.main(["convert", str(source), str(out), "--precision", "bfloat16", "--verify", "--inputs",
                     str(tmp_path / "in.npz"), "--atol", "1e-6", "--rtol", "1e-6"])
    text = capsys.readouterr().out
    assert code == 1 and "verification FAILED" in text and "the converted model is kept at" in text
    assert "--guard finds them and keeps them float32" in text  # what finds the offending nodes
    assert (out / "saved_model.pb").is_file()


def test_progress_bar_on_a_terminal(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats stderr as a terminal
    assert cli.main(["convert", str(source), str(tmp_path / "out"), "--precision", "bfloat16", "--verify"]) == 0
    captured = capsys.readouterr()
    assert "rewriting functions" in captured.err and "verifying" in captured.err
    assert "verification passed" in captured.out
