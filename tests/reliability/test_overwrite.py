"""An overwrite that cannot lose a model: every interleaving of the two renames forced, in-process (a patched
rename that fails, is interrupted or waits while a second run starts) and by killing the CLI between them; then the
next run restores or cleans up what was left, and says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mp_rewrite import convert_saved_model
from mp_rewrite.errors import ModelError
from mp_rewrite.model.files import read_saved_model
from mp_rewrite.savedmodel import model_dir
from mp_rewrite.savedmodel.output_lock import lock_path, output_lock
from users import entries, load_and_run, one_line_error, run_cli, tree_hash

# Python run in the CLI's interpreter before main(): SIGKILL itself at one point of the write.
KILL_AT = """
import os, signal
_rename = os.rename
def rename(src, dst):
    moving_new = "-n-" in os.path.basename(str(src))
    if {before_new} and moving_new:
        os.kill(os.getpid(), signal.SIGKILL)
    _rename(src, dst)
    if ({after_aside} and str(dst).endswith("/previous")) or ({after_new} and moving_new):
        os.kill(os.getpid(), signal.SIGKILL)
os.rename = rename
"""


def kill_at(point: str) -> str:
    flags = {name: name == point for name in ("before_new", "after_aside", "after_new")}
    return KILL_AT.format(**flags)


@pytest.fixture
def existing(source, tmp_path):
    """An output directory holding a float16 conversion of the source, and its hash."""
    out = tmp_path / "out"
    convert_saved_model(source, out, "float16")
    return out, tree_hash(out)


def test_kill_between_the_renames_then_the_next_run_restores_the_old_model(source, existing):
    out, before = existing
    before_source = tree_hash(source)
    killed = run_cli("convert", source, out, "--precision", "bfloat16", "--overwrite", prelude=kill_at("after_aside"))
    assert killed.returncode == -9
    assert not out.exists() and any("-o-" in name for name in entries(out.parent))  # the old model is set aside
    # The next run puts it back before anything else; without --overwrite it then refuses, as for any output.
    proc = run_cli("convert", source, out, "--precision", "bfloat16")
    *notes, error = proc.stderr.strip().split("\n")  # the killed run's new model is removed too
    assert proc.returncode == 2 and sorted(n.split(" ", 1)[0] for n in notes) == ["removed", "restored"]
    assert any(n.startswith(f"restored '{out}' from ") for n in notes), proc.stderr
    one_line_error(error, "already exists; pass --overwrite")
    assert tree_hash(out) == before and tree_hash(source) == before_source
    assert entries(out.parent) == ["out"]


def test_kill_after_the_new_model_is_in_place_then_the_old_copy_is_removed(source, existing):
    out, before = existing
    killed = run_cli("convert", source, out, "--precision", "bfloat16", "--overwrite", prelude=kill_at("after_new"))
    assert killed.returncode == -9 and tree_hash(out) != before
    load_and_run(out)
    notes = []
    with output_lock(out.parent / "other", on_note=notes.append):
        pass
    assert len(notes) == 1 and "the previous copy of" in notes[0] and str(out) in notes[0]
    assert entries(out.parent) == ["out"]


def test_kill_while_writing_leaves_a_staging_directory_the_next_run_removes(source, tmp_path):
    out = tmp_path / "out"
    killed = run_cli("convert", source, out, "--precision", "bfloat16", prelude=kill_at("before_new"))
    assert killed.returncode == -9 and not out.exists()
    staging = [name for name in entries(tmp_path) if "-n-" in name]
    assert len(staging) == 1 and (tmp_path / staging[0] / "saved_model.pb").exists()
    proc = run_cli("convert", source, out, "--precision", "bfloat16")
    assert proc.returncode == 0, proc.stderr
    assert f"removed '{tmp_path / staging[0]}', the unfinished output of an interrupted conversion" in proc.stderr
    assert entries(tmp_path) == ["out"]


@pytest.fixture
def rename_hook(monkeypatch):
    """add(before=, after=): call before(src, dst) / after(src, dst) around each rename model_dir makes; a hook may
    raise or wait."""
    real = os.rename
    befores, afters = [], []

    def rename(src, dst):
        for hook in befores:
            hook(src, dst)
        real(src, dst)
        for hook in afters:
            hook(src, dst)
    monkeypatch.setattr(model_dir.os, "rename", rename)

    def add(before=None, after=None):
        befores.extend([before] if before else [])
        afters.extend([after] if after else [])
    return add


def _moving_new(src) -> bool:
    return "-n-" in os.path.basename(str(src))


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_second_rename_fails_or_is_interrupted_and_the_old_model_stays(source, existing, rename_hook, failure):
    out, before = existing

    def fail(src, dst):
        if _moving_new(src):
            raise failure
    rename_hook(before=fail)
    expected = ModelError if isinstance(failure, OSError) else KeyboardInterrupt
    with pytest.raises(expected) as caught:
        convert_saved_model(source, out, "bfloat16", overwrite=True)
    if expected is ModelError:
        assert "nothing was written (the existing output and the source are unchanged)" in str(caught.value)
    assert tree_hash(out) == before and entries(out.parent) == ["out"]


def test_interrupted_just_after_the_new_model_is_in_place(source, existing, rename_hook):
    out, before = existing

    def interrupt(src, dst):
        if _moving_new(src):
            raise KeyboardInterrupt
    rename_hook(after=interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert_saved_model(source, out, "bfloat16", overwrite=True)
    assert tree_hash(out) != before and entries(out.parent) == ["out"]  # the swap was done: keep the new model
    assert load_and_run(out)["y"].shape == (2, 16)


def test_a_second_run_is_refused_while_the_first_is_between_the_renames(source, existing, rename_hook):
    out, _ = existing
    between, resume, errors = threading.Event(), threading.Event(), []

    def pause(src, dst):
        if _moving_new(src) and not os.path.exists(out):  # the old model is set aside, the new not yet in place
            between.set()
            resume.wait(120)
    rename_hook(before=pause)

    def first():
        try:
            convert_saved_model(source, out, "bfloat16", overwrite=True)
        except BaseException as e:  # reported below
            errors.append(e)
    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert between.wait(120)
        with pytest.raises(ModelError, match=f"another conversion \\(process {os.getpid()}\\) is writing"):
            convert_saved_model(source, out, "float16", overwrite=True)
        proc = run_cli("convert", source, out, "--overwrite")
        one_line_error(proc.stderr, "another conversion")
        assert proc.returncode == 2 and not out.exists()  # neither touched what the first run is doing
    finally:
        resume.set()
        thread.join(120)
    assert not errors and entries(out.parent) == ["out"]
    assert load_and_run(out)["y"].shape == (2, 16)


def test_an_output_name_at_the_file_system_limit(source, tmp_path):
    name = "m" * (os.pathconf(tmp_path, "PC_NAME_MAX"))
    out = tmp_path / name
    convert_saved_model(source, out, "bfloat16")
    convert_saved_model(source, out, "float16", overwrite=True)
    assert entries(tmp_path) == [name] and load_and_run(out)["y"].shape == (2, 16)


@pytest.mark.parametrize("freeze, split, dispatch", [(False, "off", "off"), (True, "off", "off"), (True, 2, "off"),
                                                     (False, "off", "force"), (True, "off", "force")],
                         ids=["in place", "frozen", "frozen, split", "in place, dispatch", "frozen, dispatch"])
def test_the_same_model_converted_twice_has_the_same_bytes(source, tmp_path, monkeypatch, freeze, split, dispatch):
    # In one process: a frozen model is traced anew, and TensorFlow names traced functions (tf.cond's branches too:
    # the split's) after a process-wide counter; the second conversion's bytes must not depend on the first's. A
    # batch dispatch's races are kept: the second conversion reads them (and so cannot decide otherwise).
    monkeypatch.setenv("MP_REWRITE_DISPATCH", dispatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing kept by an earlier test
    results = [convert_saved_model(source, tmp_path / name, "bfloat16", freeze=freeze, split=split)
               for name in ("a", "b")]
    if dispatch == "force":
        first, second = (next(iter(r.graphs.values())).dispatch for r in results)
        assert first.kept and "earlier conversion" not in first.why, first.why
        assert second.kept and second.segments == first.segments, second.why
        if "not kept" not in first.why:  # no other process disturbed the first's races: the second reads them all
            assert "times measured by an earlier conversion on this machine" in second.why, second.why
            assert "timed now" not in second.why and second.times == first.times
    files = ("saved_model.pb", "fingerprint.pb")
    assert [(tmp_path / "a" / f).read_bytes() for f in files] == [(tmp_path / "b" / f).read_bytes() for f in files]
    if freeze:
        names = {f.signature.name for f in read_saved_model(tmp_path / "b").meta_graphs[0].graph_def.library.function}
        assert "__inference_body_0" in names, names  # ranked by a walk of the model, not numbered by the counter
        assert load_and_run(tmp_path / "b")["y"].shape == (2, 16)


def _cli(*args) -> list[str]:
    return [sys.executable, "-c", "import sys\nfrom mp_rewrite.commands.cli import main\nsys.exit(main(sys.argv[1:]))",
            *map(str, args)]


def _kill_while_converting(source, out) -> None:
    """Start a real `convert` into `out` and SIGKILL it once it is writing (its staging directory exists)."""
    proc = subprocess.Popen(_cli("convert", source, out, "--precision", "bfloat16"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    deadline = time.monotonic() + 120
    try:
        while not any("-n-" in name for name in entries(out.parent)):
            assert proc.poll() is None, "the conversion ended before it could be killed"
            assert time.monotonic() < deadline, "the conversion did not start writing in time"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_kill_9_leaves_a_lock_file_the_next_run_in_the_directory_removes(source, tmp_path):
    out = tmp_path / "out"
    _kill_while_converting(source, out)
    stale = lock_path(out)
    assert stale.exists() and not out.exists()  # the kernel dropped the flock; the file stays
    # The next conversion into the directory, of another output, takes the stale lock over and removes it.
    notes = []
    with output_lock(tmp_path / "other", on_note=notes.append):
        assert not stale.exists()
    assert len(notes) == 1 and "the unfinished output of an interrupted conversion" in notes[0]
    assert entries(tmp_path) == []


def test_a_lock_a_live_conversion_holds_is_not_removed(source, tmp_path):
    held = tmp_path / "held"
    with output_lock(held):
        before = os.stat(lock_path(held))
        proc = run_cli("convert", source, tmp_path / "out", "--precision", "bfloat16")  # another process
        assert proc.returncode == 0, proc.stderr
        assert os.path.samestat(os.stat(lock_path(held)), before)
        refused = run_cli("convert", source, held, "--precision", "bfloat16")
        one_line_error(refused.stderr, f"another conversion (process {os.getpid()}) is writing")
    assert entries(tmp_path) == ["out"]
