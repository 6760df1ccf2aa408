"""One writer per output directory, and the clean-up of what interrupted writers left behind.

A conversion holds a lock on its output path from before it checks the output until the new model is in place, so
two runs cannot interleave their renames. The lock is an `flock` on a small file next to the output; the kernel
drops it when its process dies, however it dies, so a lock can never be left stale. Its holder removes the file
before letting go; a SIGKILLed holder cannot, and the next run into the directory removes the file it left.

Writers name their temporary directories `.mpr-<pid>-<kind>-<random>` (short, so an output name near the file
system's limit still fits): kind "n" is a new model being written, kind "o" holds an existing output set aside
during an overwrite (its `target` file names the output). A process killed with SIGKILL cannot clean up; the next
run into the same directory does: it removes the "n" directories of processes that are gone, and restores (or, when
the new model made it into place, removes) their "o" directories, and says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
from pathlib import Path

from ..errors import ModelError

log = logging.getLogger("mp_rewrite")

PREFIX = ".mpr-"
NEW, OLD = "n", "o"  # kinds of temporary directory: a new model being written, an old one set aside
TARGET_FILE = "target"  # in an OLD directory: the name of the output it was moved away from
PREVIOUS_DIR = "previous"  # in an OLD directory: the output itself
_LEFTOVER = re.compile(r"\.mpr-(\d+)-([no])-[A-Za-z0-9_]+")
_LOCK_FILE = re.compile(r"\.mpr-lock-[0-9a-f]{16}")


def temporary_prefix(kind: str) -> str:
    """The name prefix of this process's temporary directories of one kind (for tempfile.mkdtemp)."""
    return f"{PREFIX}{os.getpid()}-{kind}-"


def lock_path(output: Path) -> Path:
    """The lock file of an output path: a hash of its name, so that a long output name still fits."""
    digest = hashlib.sha1(os.fsencode(output.name)).hexdigest()[:16]
    return output.parent / f"{PREFIX}lock-{digest}"


@contextlib.contextmanager
def output_lock(output, on_note=None):
    """Hold the lock on `output` (an absolute path) for the duration of the block, after cleaning up what
    interrupted runs left in its directory. Parent directories created for it are removed again if the block
    leaves no output behind.

    Args:
        output: the output directory path.
        on_note: callable(str) told of each clean-up; default: a warning on the "mp_rewrite" logger.

    Raises:
        ModelError: another process holds the lock, or the output's directory cannot be written.
    """
    output = Path(output)
    note = on_note or log.warning
    created = _make_parents(output.parent)
    try:
        fd = _acquire(lock_path(output), output)
        try:
            recover_leftovers(output.parent, note, holding=output)
            yield output
        finally:
            _release(fd, lock_path(output))
    finally:
        if not os.path.lexists(output):
            for directory in reversed(created):
                with contextlib.suppress(OSError):
                    directory.rmdir()


def _make_parents(parent: Path) -> list[Path]:
    missing = []
    for directory in [parent, *parent.parents]:
        if os.path.lexists(directory):
            break
        missing.append(directory)
    created = []
    try:
        for directory in reversed(missing):
            try:
                directory.mkdir()
                created.append(directory)
            except FileExistsError:  # another run made it meanwhile: it is not ours to remove
                pass
    except OSError as e:
        raise ModelError(f"cannot create the output directory '{parent}': {e.strerror}") from None
    return created


def _acquire(path: Path, output: Path) -> int:
    """Lock `path` (created if needed) and return its descriptor. Retries when the file it locked was removed by
    the previous holder in between (it unlinks the file before letting go)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ModelError(f"cannot create the output directory '{output}': {e.strerror} ({output.parent}); "
                             "choose an output in a directory you can write to") from None
        try:
            locked = _lock_still_named(fd, path)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ModelError(f"cannot lock '{path}': {e.strerror}") from None
            raise ModelError(f"another conversion (process {holder}) is writing '{output}'; wait for it to "
                             "finish, or choose another output path") from None
        if locked:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def _lock_still_named(fd: int, path: Path) -> bool:
    """flock `fd` (a file opened at `path`) without waiting; return whether `path` still names the locked file.

    Every remover of a lock file unlinks it while holding its flock (_release, _remove_if_stale), so once this
    returns True no other process can remove or replace `path` until this one lets go. False: the file was removed
    after it was opened (its flock is then held but guards nothing; close it).

    Raises:
        OSError: EWOULDBLOCK when a live process holds the lock; another errno when it cannot be locked.
    """
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _release(fd: int, path: Path) -> None:
    # Unlink while still holding the lock: a waiter that opened the old file sees it is gone and retries.
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


def _remove_if_stale(path: Path) -> None:
    """Remove a lock file no live process holds: the file of a writer killed with SIGKILL (its flock went with
    it). Taken over as a writer takes it, then released as a writer releases it, so a file a live run holds is left
    alone, and a run that opened this file meanwhile finds it gone and makes a new one (_acquire)."""
    try:
        fd = os.open(path, os.O_RDONLY)  # never O_CREAT: a file already gone is not to be made again
    except OSError:
        return
    try:
        locked = _lock_still_named(fd, path)
    except OSError:  # held by a live run, or not ours to lock
        locked = False
    if locked:
        _release(fd, path)
    else:
        os.close(fd)


def _is_running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def recover_leftovers(directory: Path, note, holding: Path | None = None) -> None:
    """Clean up after writers in `directory` whose process is gone: remove their unfinished models, restore (or
    remove) the outputs they had set aside, each told to `note`, and remove the lock files they left (silently: a
    lock file holds nothing of the user's).

    Args:
        directory: the directory to scan.
        note: callable(str).
        holding: the output whose lock the caller holds; set-aside copies of other outputs are restored only when
            their lock is free.
    """
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return
    own_lock = lock_path(holding) if holding is not None else None
    for entry in entries:
        if _LOCK_FILE.fullmatch(entry.name) and Path(entry.path) != own_lock:
            _remove_if_stale(Path(entry.path))
            continue
        match = _LEFTOVER.fullmatch(entry.name)
        if not match or _is_running(int(match.group(1))):
            continue
        pid, path = match.group(1), Path(entry.path)
        if match.group(2) == NEW:
            shutil.rmtree(path, ignore_errors=True)
            note(f"removed '{path}', the unfinished output of an interrupted conversion (process {pid} is gone)")
        else:
            _recover_set_aside(path, pid, note, holding)


def _recover_set_aside(aside: Path, pid: str, note, holding: Path | None) -> None:
    """An OLD directory of a dead writer: put the output back if it is missing, else drop the old copy."""
    try:
        target = aside.parent / os.fsdecode((aside / TARGET_FILE).read_bytes())
    except OSError:  # killed before it moved anything aside
        shutil.rmtree(aside, ignore_errors=True)
        return
    previous = aside / PREVIOUS_DIR
    if not previous.exists():
        shutil.rmtree(aside, ignore_errors=True)
        return
    with _lock_if_free(target, holding) as locked:
        if not locked:
            return  # another run is writing that output; it recovers its own leftovers
        if os.path.lexists(target):
            shutil.rmtree(aside, ignore_errors=True)
            note(f"removed '{aside}', the previous copy of '{target}' set aside by an overwrite that was "
                 f"interrupted after the new model was in place (process {pid} is gone)")
            return
        try:
            os.rename(previous, target)
        except OSError as e:
            note(f"'{target}' was moved to '{previous}' by an interrupted overwrite (process {pid}) and cannot be "
                 f"restored ({e.strerror}); move it back yourself")
            return
        shutil.rmtree(aside, ignore_errors=True)
        note(f"restored '{target}' from '{previous}', where an interrupted overwrite (process {pid}) had "
             "moved it")


@contextlib.contextmanager
def _lock_if_free(target: Path, holding: Path | None):
    if holding is not None and target == holding:
        yield True
        return
    try:
        fd = _acquire(lock_path(target), target)
    except ModelError:
        yield False
        return
    try:
        yield True
    finally:
        _release(fd, lock_path(target))
