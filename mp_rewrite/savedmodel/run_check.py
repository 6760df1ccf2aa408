"""The written copy runs: before a converted SavedModel is moved into place, every signature whose inputs can be
made is called once on it, on the inputs `--verify` makes (verify.signature_feeds), so that a conversion never
exits 0 with a model that loads but fails when called (an attr with no value: "Failed to bind all placeholders";
a kernel oneDNN cannot create for this CPU: "could not create a primitive descriptor").

When a signature fails, the source's same signature is called on the same inputs, to say whose fault it is: a
source that fails too is the user's to fix; a copy that fails where the source runs is a bug of mp_rewrite. A
signature whose inputs cannot be made (strings, unknown rank, without --inputs) is not run, and said so.

What it costs is the model's first call (ResNet-50 in place: ~0.65 s of CPU, of which TensorFlow's graph
optimizers take ~0.45 s and instantiating the function, creating its oneDNN primitives and computing the rest); the
copy is loaded once, for the load check, and nothing is traced. Each call is handed to `on_run`, so that `convert
--verify` compares these outputs with the source's instead of loading and calling the written copy again.
"""

from __future__ import annotations

import dataclasses

from ..analysis.graph_runs import onednn_cap
from ..errors import ModelError, tf_reason
from ..model.runtime import load_saved_model
from .frozen_function import remove_tree
from .inputs import InputRecipe, missing_inputs
from .loadable_copy import loadable_copy
from .verify import SignatureRun, function_identity, signature_run


BUG = "this is an mp_rewrite bug, please report it with the model"


class RunFailure(ModelError):
    """The written copy failed to run a signature that the conversion was to write (nothing was written).

    Attributes:
        what: the copy's error; ours: whether the source runs the signature (the fault is the conversion's).
    """

    def __init__(self, message: str, what: str = "", ours: bool = False):
        super().__init__(message)
        self.what, self.ours = what or message, ours


@dataclasses.dataclass
class RunCheck:
    """Calls every signature of each loaded MetaGraph of a written copy once (source_check.check_written's `run`),
    and keeps what it did.

    Attributes:
        source, source_model: the source SavedModel directory and its proto (only read, only on a failure).
        recipe: how inputs are made (None: every input made up with the defaults).
        precision, device: the conversion's (a float16 model made for a GPU may lack CPU kernels here).
        ran: the keys of the signatures that ran, in order (a signature whose function is identical to one called
            before, but for its name, with the same captured tensors, is not called again: verify.function_identity).
        notes: one line per signature not run, saying why.
        on_run: optional callable(tags, key, SignatureRun) for every signature that ran (a twin gets its twin's
            run): what verify needs to compare the copy's outputs without calling it again.
    """

    source: object
    source_model: object
    recipe: InputRecipe | None = None
    precision: str = "float16"
    device: str | None = None
    ran: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    on_run: object = None

    def __call__(self, loaded, tags) -> None:
        """Call every signature of `loaded` (the written copy, loaded with `tags`) once.

        Raises:
            ModelError: a signature fails; the line names it, gives TensorFlow's first line and says whether the
                source runs it.
        """
        recipe = self.recipe or InputRecipe()
        called = {}
        for key in sorted(loaded.signatures.keys()):
            function = loaded.signatures[key]
            identity = function_identity(function)
            if identity in called:  # a twin ("serve" and "serving_default" of a frozen Keras export): it ran
                self._ran(tags, key, called[identity])
                continue
            missing = missing_inputs({key: function.structured_input_signature[1]}, recipe.given)
            if missing:
                self.notes.append(f"signature '{key}' was not run before writing: {', '.join(missing)} cannot be "
                                  "made up; give them in --inputs FILE.npz (keys: input names) to have it run")
                continue
            try:
                run = _call(function, key, recipe, self.precision, "converted")
            except ModelError as e:
                if self.device == "gpu" and "OpKernel" in str(e) and not _has_gpu():
                    self.notes.append(f"signature '{key}' was not run before writing: {e}")
                    continue
                fault = _whose_fault(self.source, self.source_model, tags, key, recipe, self.precision, str(e))
                raise RunFailure(f"{e}; {fault}; nothing was written", str(e), fault.endswith(BUG)) from None
            self._ran(tags, key, run)
            called[identity] = run

    def _ran(self, tags, key: str, run: SignatureRun) -> None:
        self.ran.append(key)
        if self.on_run is not None:
            self.on_run(tags, key, run)


def _call(function, key: str, recipe: InputRecipe, precision: str, which: str) -> SignatureRun:
    """Call a loaded signature once on the inputs verify makes for it (ModelError naming `which` if it fails)."""
    try:
        return signature_run(function, key, recipe.given, recipe.batch_size, recipe.seed, precision,
                             shapes=recipe.shapes, dim=recipe.dim, which=which)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 -- TF raises more than OpError (InternalError, RuntimeError, ...)
        raise ModelError(f"the {which} model failed to run signature '{key}': {tf_reason(e)}") from None


def _whose_fault(source, source_model, tags, key: str, recipe: InputRecipe, precision: str, failure: str) -> str:
    """Call the source's signature `key` on the same inputs: what the copy's `failure` (its error) means."""
    staging = loadable_copy(source, source_model)  # skips the saver's functions: loads in half the time
    try:
        loaded = load_saved_model(staging or source, "source", tags, shown_as=source)
        if key not in loaded.signatures:  # a signature the conversion made cannot be the source's fault
            return "the source has no such signature: this is an mp_rewrite bug, please report it with the model"
        _call(loaded.signatures[key], key, recipe, precision, "source")
    except ModelError as e:
        same = str(e).replace("the source model", "the converted model", 1) == failure
        how = "the same way" if same else f"too ({e})"
        if recipe.given:
            return f"the source '{source}' fails {how}: fix or export the source again, or convert with --no-run-check"
        return (f"the source '{source}' fails {how} on these made-up inputs: give inputs it runs on (--inputs "
                "FILE.npz, --input-shapes NAME=AxB, --seq-len N), or convert with --no-run-check")
    finally:
        remove_tree(staging)
    if "could not create a primitive descriptor" in failure:  # oneDNN has no such kernel for this CPU
        return (f"the source runs it: oneDNN has no {precision} kernel for that op on this CPU as configured"
                f"{onednn_cap()}; convert with the default --assign cost (it keeps what runs), or where the model "
                "will run")
    return f"the source runs it: {BUG}"


def _has_gpu() -> bool:
    import tensorflow as tf
    return bool(tf.config.list_physical_devices("GPU"))
