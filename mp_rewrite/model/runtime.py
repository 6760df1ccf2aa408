"""Loading a SavedModel in TensorFlow (`tf.saved_model.load`) for what has to run it -- freezing, verifying, the
accuracy guard -- with the MetaGraph chosen by tag-set and a one-line error when TensorFlow cannot load it.

What runs a model to measure or check it loads `runnable_directory`: the model itself, or, where its signatures or
its loading would write files, save checkpoints or write summaries (core.effects), a temporary copy in which those
ops do nothing (core.stand_ins; variables and assets linked, nothing of the model written) -- unless the effects
policy in force says to run the model as it is (`--run-effects`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref

from ..errors import ModelError, tf_reason
from .files import read_saved_model

LINKED = ("variables", "assets", "assets.extra")  # what a copy links to; saved_model.pb is its own


class EffectsNotRun(ModelError):
    """The model has effects, and no copy without them stands for it: it is not run."""


def load_saved_model(path, which: str = "original", tags=None, shown_as=None, *, saved_model=None,
                     to_write: bool = False):
    """`tf.saved_model.load(path, tags=tags)`, with a one-line ModelError naming the model (`which`, at `shown_as`,
    default `path`: the user's path where a temporary copy is loaded) if TF cannot load it: runnable_directory's
    copy, or with `to_write` (the loaded functions are traced into a model to be written: freezing) one in which
    only what loading runs does nothing (core.stand_ins.with_effects_restored gives the written model its ops back).

    Raises:
        ModelError: TensorFlow cannot load it (the line says why and which model). EffectsNotRun: as
            runnable_directory.
    """
    import tensorflow as tf
    directory = runnable_copy(path, saved_model, loading_only=to_write)
    try:
        loaded = tf.saved_model.load(directory or str(path), tags=tags)
    except Exception as e:  # TF raises OSError, ValueError, OpError, RuntimeError, ... for unloadable models
        _remove(directory)
        raise ModelError(f"TensorFlow cannot load the {which} SavedModel '{shown_as or path}': {tf_reason(e)}; "
                         "export the model again") from None
    if directory:  # kept while the model lives: its restored assets (a table's vocabulary) name files of the copy
        weakref.finalize(loaded, _remove, directory)
    return loaded


@contextlib.contextmanager
def runnable_directory(path, saved_model=None, loading_only: bool = False):
    """Yield a SavedModel directory that runs as `path` does but performs none of its effects: runnable_copy's
    copy, removed afterwards (load it inside the block), or `path` itself where no copy is needed.

    Raises:
        as runnable_copy.
    """
    directory = runnable_copy(path, saved_model, loading_only)
    try:
        yield directory or str(path)
    finally:
        _remove(directory)


def _remove(directory) -> None:
    if directory:
        shutil.rmtree(directory, ignore_errors=True)  # removes the links, never what they point to


def runnable_copy(path, saved_model=None, loading_only: bool = False) -> str | None:
    """A temporary SavedModel directory that runs as `path` does but performs none of its effects: a copy whose ops
    with effects are stand-ins (the caller removes it); None where `path` has none or the effects policy runs them.
    The policy's observer is told, once, what stood in.

    Args:
        saved_model: the SavedModel proto at `path`, if already read.
        loading_only: stand in only for what loading the model runs (its resources' initializers).

    Raises:
        EffectsNotRun: an op with an effect has outputs that are read, so no copy without it stands for the model.
        ModelError: the directory holds no readable SavedModel.
    """
    from ..core.effects import effect_line, effects_policy  # the core reads TF's op registry: not before it starts
    from ..core.stand_ins import saved_model_without_effects
    policy = effects_policy()
    if policy.run:
        return None
    copy, stand_ins = saved_model_without_effects(saved_model or read_saved_model(path), loading_only)
    if not stand_ins.effects:
        return None
    line = effect_line(stand_ins.effects)
    if not stand_ins.stands:
        raise EffectsNotRun(f"{line}: not run, and no copy without them stands for the model "
                            f"({stand_ins.blocked[0]}); --run-effects runs the model as it is")
    policy.tell(f"{line}: not run here; what runs the model runs a copy in which these ops do nothing "
                "(--run-effects runs them)")
    directory = tempfile.mkdtemp(prefix="mp_rewrite-run-")
    try:
        with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
            f.write(copy.SerializeToString())
        for name in LINKED:
            if os.path.exists(os.path.join(path, name)):
                os.symlink(os.path.realpath(os.path.join(path, name)), os.path.join(directory, name))
    except OSError as e:
        _remove(directory)
        raise ModelError(f"cannot make a copy of '{path}' without its effects to run ({e}); free space in the "
                         "temporary directory, or give --run-effects to run the model as it is") from None
    return directory
