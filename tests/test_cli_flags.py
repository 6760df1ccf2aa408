"""One meaning per flag in every subcommand, and a CLI that ends cleanly however it is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mp_rewrite.testing import example_models

CLI = [sys.executable, "-m", "mp_rewrite"]


def _lists(*flags) -> dict:
    proc = subprocess.run([*CLI, "lists", "--precision", "bfloat16", "--json", *flags], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_list_flags_move_and_remove_in_lists():
    lists = _lists("--deny", "Relu", "--remove", "Softmax", "--allow", "AddV2")
    assert "Relu" in lists["deny"] and "Relu" not in lists["clear"]  # moved, not "in two lists"
    assert all("Softmax" not in lists[name] for name in ("allow", "infer", "deny", "clear"))
    assert "AddV2" in lists["allow"] and "AddV2" not in lists["infer"]


@pytest.mark.parametrize("command", ["convert", "inspect", "explain", "lists"])
def test_list_flags_say_the_same_in_every_help(command):
    help_text = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "move OP into the deny list, out of any other" in " ".join(help_text.split())
    assert "--remove OP" in help_text


def test_an_op_given_twice_names_the_flags():
    proc = subprocess.run([*CLI, "lists", "--deny", "Relu", "--remove", "Relu"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "given to both --deny and --remove" in proc.stderr and "api" not in proc.stderr


def test_a_closed_pipe_is_not_an_error():
    proc = subprocess.run(f"{sys.executable} -m mp_rewrite lists | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_sigterm_during_a_conversion_leaves_nothing(tmp_path):
    source = tmp_path / "resnet"
    example_models.cnn_bn(image_size=64).export(str(source), verbose=False)
    proc = subprocess.Popen([*CLI, "convert", str(source), str(tmp_path / "out"), "--freeze"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.iterdir())) == 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the conversion takes its lock next to the output: it is under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if (tmp_path / "out" / "saved_model.pb").exists():
        pytest.skip("the conversion finished before SIGTERM arrived")
    assert proc.returncode == 143 and "terminated" in err and "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resnet"]  # no output, no staging leftovers


def test_sigterm_replaced_by_another_error_inside_tensorflow_still_exits_143(monkeypatch, capsys):
    """pybind11 replaces an exception raised by a Python signal handler while TensorFlow's C++ is on the stack
    ("MISMATCH of original and normalized active exception types"), and the loader reports that as an unloadable
    model: seen in CI, a SIGTERM during `tf.saved_model.load` exited 2 with "cannot load the source SavedModel"."""
    from mp_rewrite.commands import cli
    from mp_rewrite.errors import ModelError

    def loading(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler main() installed raises Terminated here
        except KeyboardInterrupt:
            raise ModelError("TensorFlow cannot load the source SavedModel: pybind11::error_already_set: MISMATCH")
        return 0

    build = cli.build_parser

    def parser_with_loading():
        parser = build()
        parser._subparsers._group_actions[0].choices["lists"].set_defaults(func=loading, precheck=None)
        return parser
    monkeypatch.setattr(cli, "build_parser", parser_with_loading)
    monkeypatch.setattr(cli.Terminated, "received", False, raising=False)
    assert cli.main(["lists"]) == 143
    assert "terminated (SIGTERM)" in capsys.readouterr().err


def test_tensorflow_logs_only_with_verbose():
    quiet = subprocess.run([*CLI, "lists"], capture_output=True, text=True, timeout=120)
    loud = subprocess.run([*CLI, "-v", "lists"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"))
    assert quiet.returncode == loud.returncode == 0
    assert "I0000" not in quiet.stderr and "I0000" in loud.stderr
