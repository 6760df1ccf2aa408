"""A SavedModel directory on disk: checking where a converted copy may go, and writing that copy
so that it appears only when complete.

The copy is built in a temporary sibling of the output (same file system, so the final move is a rename); an
existing output is replaced (with overwrite) only after the new one is complete and checked, and on any failure --
a full disk, a permission, an interrupt -- the temporary directory is removed and the source and any existing output
are left as they were. The source is only ever read. Writers hold the output's lock (output_lock.py), which also
cleans up after writers that were killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from google.protobuf import text_format

from ..errors import ModelError
from ..model.files import MODEL_FILES, saved_model_file
from .output_lock import NEW, OLD, PREVIOUS_DIR, TARGET_FILE, temporary_prefix

FINGERPRINT_FILE = "fingerprint.pb"


def absolute_output(output) -> Path:
    """The output path made absolute without resolving symbolic links (the link itself is what gets replaced)."""
    return Path(os.path.abspath(output))


def check_output(source, output, overwrite: bool = False) -> tuple[Path, Path]:
    """Check that a converted copy of `source` may be written at `output`, before any work is done.

    Returns:
        (source, output) as absolute paths.

    Raises:
        ModelError: the source is not a SavedModel; the output is the source, inside it or contains it; the output
            exists without overwrite; or it exists but is neither a SavedModel nor an empty directory (replacing it
            could lose someone's files).
    """
    saved_model_file(source)
    src, out = Path(source).resolve(), Path(output).resolve()
    if out == src:
        raise ModelError(f"output '{output}' is the source directory itself; the source is never replaced, write "
                         "the converted model to another directory")
    if src in out.parents:
        raise ModelError(f"output '{output}' is inside the source '{source}'; write the converted model outside "
                         "the source directory")
    if out in src.parents:
        raise ModelError(f"output '{output}' contains the source '{source}'; replacing it would delete the "
                         "source, choose another output path")
    target = absolute_output(output)
    if os.path.lexists(target):
        if not overwrite:
            raise ModelError(f"output '{output}' already exists; pass --overwrite (API: overwrite=True) to "
                             "replace it, or choose another path")
        if not target.is_dir() or not (any((target / f).is_file() for f in MODEL_FILES) or _is_empty(target)):
            raise ModelError(f"output '{output}' exists and is not a SavedModel; refusing to replace it, remove "
                             "it yourself or choose another path")
    return Path(os.path.abspath(source)), target


def _is_empty(directory: Path) -> bool:
    return not any(directory.iterdir())


def write_model_dir(source: Path, output: Path, saved_model, overwrite: bool = False, check=None,
                    drop=()) -> None:
    """Write a SavedModel proto, with every other file of `source` (variables, assets, ...), at `output`.

    The files are written to a temporary sibling directory (`.mpr-<pid>-n-*`), checked, and moved into place when
    complete. Call it holding `output_lock(output)`, so that no other run renames the output meanwhile.

    Args:
        source: the SavedModel directory the proto came from (only read).
        output: where the new SavedModel goes (checked with check_output first).
        saved_model: the new SavedModel proto; written as .pb or .pbtxt like the source's.
        overwrite: replace an existing output (only after the new one is complete).
        check: optional callable(directory) run on the complete copy before it is moved into place; it raises
            an MpRewriteError when the copy is unusable (nothing is then written).
        drop: top-level file names of the source not to copy (e.g. keras_metadata.pb).

    Raises:
        ModelError: the output cannot be written (full disk, permissions, a proto too large to serialize).
    """
    try:
        staging = Path(tempfile.mkdtemp(prefix=temporary_prefix(NEW), dir=output.parent))
    except OSError as e:
        raise ModelError(f"cannot create the output directory '{output}': {_reason(e)}") from None
    try:
        _fill(staging, source, saved_model, drop)
        if check is not None:
            check(staging)
        _move_into_place(staging, output, overwrite)
    except OSError as e:
        kept = "the existing output and the source are unchanged" if overwrite else "the source is unchanged"
        raise ModelError(f"cannot write the converted model to '{output}': {_reason(e)}; nothing was written "
                         f"({kept})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _reason(error: OSError) -> str:
    where = f" ({error.filename})" if error.filename else ""
    return f"{error.strerror or error}{where}"


def serialize(message) -> bytes:
    """A proto's bytes, the same on every run (map fields in key order), so that an identical model gets an
    identical file and fingerprint.

    Raises:
        ModelError: protobuf refuses to serialize it (over 2 GB).
    """
    try:
        return message.SerializeToString(deterministic=True)
    except ValueError as e:  # protobuf refuses messages over 2 GB
        raise ModelError(f"the converted SavedModel proto cannot be serialized: {e}") from None


def _fill(staging: Path, source: Path, saved_model, drop=()) -> None:
    """Copy the source's files except its proto, fingerprint and `drop`, then write the new proto and fingerprint."""
    proto = saved_model_file(source)
    _copy_tree(source, staging, skip={proto.name, FINGERPRINT_FILE, *drop})
    if proto.suffix == ".pbtxt":
        (staging / proto.name).write_text(text_format.MessageToString(saved_model), encoding="utf-8")
    else:
        (staging / proto.name).write_bytes(serialize(saved_model))
    if (source / FINGERPRINT_FILE).exists():
        _write_fingerprint(staging)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it 0700; the output should look like any new directory


def _copy_tree(source: Path, target: Path, skip: set) -> None:
    """Copy every file under `source` into `target` (existing), leaving out the top-level names in `skip`.
    Symbolic links are followed: the copy holds the files they point to (source_check refuses dangling ones)."""
    for root, dirs, files in os.walk(source, followlinks=True):
        rel = Path(root).relative_to(source)
        for name in dirs:
            (target / rel / name).mkdir(exist_ok=True)
        for name in files:
            if rel == Path(".") and name in skip:
                continue
            shutil.copy2(Path(root) / name, target / rel / name)


def _write_fingerprint(directory: Path) -> None:
    """Recompute fingerprint.pb for the new proto (TF's loader reads it for its metrics; it is optional)."""
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
    try:
        data = fingerprinting.CreateFingerprintDef(str(directory))
    except fingerprinting.FingerprintException:
        return
    (directory / FINGERPRINT_FILE).write_bytes(_content_uuid(data))


def _content_uuid(data: bytes) -> bytes:
    """The fingerprint with its `uuid` (random on every save) derived from its content hashes instead, so that the
    same model converted twice gets the same bytes, and different models still get different uuids."""
    from tensorflow.core.protobuf import fingerprint_pb2
    fingerprint = fingerprint_pb2.FingerprintDef.FromString(data)
    fingerprint.ClearField("uuid")
    digest = hashlib.sha256(serialize(fingerprint)).digest()[:16]
    fingerprint.uuid = str(int.from_bytes(digest, "big"))  # TF writes a 128-bit number in decimal
    return serialize(fingerprint)


def _move_into_place(staging: Path, output: Path, overwrite: bool) -> None:
    """Rename the complete staging directory to `output`. An existing output is first moved into a `.mpr-<pid>-o-*`
    directory that names it (so that the next run can restore it if this process is killed between the two
    renames), and is put back if the second rename fails or is interrupted."""
    if not os.path.lexists(output):
        os.rename(staging, output)
        return
    if not overwrite:
        raise FileExistsError(17, "the output appeared while converting", str(output))
    aside = Path(tempfile.mkdtemp(prefix=temporary_prefix(OLD), dir=output.parent))
    (aside / TARGET_FILE).write_bytes(os.fsencode(output.name))
    try:
        os.rename(output, aside / PREVIOUS_DIR)
        os.rename(staging, output)
    except BaseException:  # an OSError, or Ctrl-C / SIGTERM between (or just after) the two renames
        _settle(aside, output)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _settle(aside: Path, output: Path) -> None:
    """After a failed or interrupted swap: put the old output back if the new one is not in place; drop the old
    copy if the new one is. If even that fails, the next run restores it (output_lock.py)."""
    previous = aside / PREVIOUS_DIR
    with contextlib.suppress(OSError):
        if os.path.lexists(previous) and not os.path.lexists(output):
            os.rename(previous, output)
        shutil.rmtree(aside)
