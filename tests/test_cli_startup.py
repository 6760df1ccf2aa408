"""`mp-rewrite` answers help, version, argument errors and missing paths before TensorFlow is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import contextlib, io, sys
from mp_rewrite.commands import cli
err = io.StringIO()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
    try:
        code = cli.main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
print(code, 'tensorflow' in sys.modules, err.getvalue().strip().splitlines()[-1:] or [''])
"""


@pytest.mark.parametrize("argv, code, message", [
    (["--help"], 0, ""),
    (["--version"], 0, ""),
    (["convert", "--help"], 0, ""),
    (["inspect", "--help"], 0, ""),
    (["convert"], 2, "required: source, output"),
    (["convert", "./no_such_model", "out"], 2, "'./no_such_model' does not exist"),
    (["verify", "./no_such_model", "other"], 2, "'./no_such_model' does not exist"),
    (["inspect", "./no_such_model"], 2, "'./no_such_model' does not exist"),
    (["explain", "./no_such_model", "node"], 2, "'./no_such_model' does not exist"),
    (["lists", "--precision", "float8"], 2, "invalid choice: 'float8'"),
])
def test_answers_before_tensorflow_is_imported(argv, code, message, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got_code, tf_imported, last_line = proc.stdout.strip().split(" ", 2)
    assert int(got_code) == code
    assert tf_imported == "False", f"{argv} imported TensorFlow before answering"
    assert message in last_line
