"""Mixed precision training by graph rewrite: `enable_mixed_precision_graph_rewrite(opt)`.

The counterpart of TF's `tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite`, for TF2 code and
Keras 3: it wraps the optimizer in a `LossScaleOptimizer` and makes every `tf.function` traced from then on (the
user's own, Keras's train/test/predict functions, nested functions, cond/while bodies, gradient functions) run
the mixed precision rewrite of its traced graph -- forward, backward and update together, as Grappler sees a
training step. The model and its variables stay float32: variable reads and updates are stateful ops, which the
pass preserves inside function bodies, so casts go to the low precision after each read and back before each update.

Choices, where TF left them open:

* No GPU (float16): Grappler's CUDA pass silently does nothing without a GPU. Here `device=None` with float16
  and no GPU logs a one-time warning and does not rewrite (the optimizer is still wrapped, so the training code
  runs unchanged). `device="cpu"` rewrites anyway, checking kernels against TF's CPU kernels (a warning says
  float16 on CPU is slow: most CPU kernels have no native float16 path). Prefer `precision="bfloat16"` on CPU.
  `device="any"` converts all nodes but checks unplaced ones against GPU kernels; use it only where a GPU runs
  them.
* bfloat16 on a CPU is assigned by measured cost (`assign="cost"`, as `mp-rewrite convert` does there): Keras 3's
  BatchNorm fused in the step (and with MP_REWRITE_STEP_RULES=1 the graph rules valid in training: Dense on 3-D
  inputs and attention projections as MatMul + BiasAdd, training.step_rules), each op's precision by its time in
  the step on this machine, the choice raced against float32 and the lists as the step runs. The step runs
  Grappler's lists from its first call and is measured across its next calls (training.deferred), once per
  machine; a distributed step is measured once for the job (training.job_decision), so every worker runs the same
  graph. A GPU, float16 and `assign="lists"` get Grappler's lists.
* bfloat16 has float32's exponent range, so it needs no loss scaling: by default the optimizer is wrapped with a
  fixed scale of 1 (exact, and `get_scaled_loss`/`get_unscaled_gradients`/`scale_loss` keep working, so the same
  training code runs in both precisions). An explicit `loss_scale` is honoured.
* `disable_mixed_precision_graph_rewrite()` stops rewriting new traces and, by default, puts the traced float32
  definitions back for every function rewritten so far, so functions run as they were traced before enabling.
  Pass `restore=False` to keep them rewritten. Optimizers are not unwrapped (as in TF).
* Functions traced before enabling keep running float32; a warning names them. `rewrite_existing=True` rewrites
  them too. A Keras model picks up the rewrite when its train function is next traced (`model.compile(...)`
  again, or `model.make_train_function(force=True)`).

Limits (details in `function_hook`):

* `tf.saved_model.save` while the rewrite is on saves the rewritten bodies (they are what TF holds). Disable
  first for a float32 SavedModel; for a deliberate mixed precision export, the SavedModel converter is the tool.
* `concrete_function.graph` stays the traced float32 FuncGraph; what runs is `rewritten_functions()` / the eager
  context's FunctionDef.
* A function differentiated from outside (called under a tape that is outside it) gets a forward and a backward
  function, rewritten separately: the tensors passed between them stay float32, so there are casts at that
  boundary which a single-function step (tape inside the tf.function, as in Keras) does not have.
* The hook checks dtypes against OpDefs and kernels before swapping a body in; other failures that TF only
  reports when the function first runs cannot fall back to float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re

import tensorflow as tf

from . import cost_hook, deferred, function_hook
from .loss_scale.optimizer import LossScaleOptimizer
from .loss_scale.settings import LossScaleError, _optimizer_family, is_loss_scale_optimizer, settings_from_loss_scale

logger = logging.getLogger("mp_rewrite")

class _DefaultLossScale:
    """The loss_scale default: "dynamic" for float16, no scaling (a fixed scale of 1) for bfloat16."""

    def __repr__(self):
        return "'dynamic' (float16) / None (bfloat16)"


_DEFAULT = _DefaultLossScale()
_MAX_NAMED = 5  # function names listed in a warning


@dataclasses.dataclass(frozen=True)
class _Enabled:
    precision: str
    device: str
    options: object  # core.options.Options, or None when no rewrite runs (float16 without a GPU, device=None)


_STATE = {"enabled": None, "warned": set()}


def enable_mixed_precision_graph_rewrite(opt, loss_scale=_DEFAULT, precision: str = "float16", device=None, *,
                                         rewrite_existing: bool = False, **rewrite_options):
    """Wrap `opt` with loss scaling and make every tf.function traced from now on run mixed precision.

    Args:
        opt: a Keras 3, tf_keras or TF v1 optimizer (see `wrap_optimizer`). As in TF, it is required; to rewrite
            without an optimizer (inference), call `enable_graph_rewrite`.
        loss_scale: "dynamic" (the float16 default: start at 2**15, halve and skip the step on inf/nan, double
            after 2000 finite steps); a number (a fixed scale); a dict of LossScaleOptimizer settings
            (`dynamic`, `initial_scale`, `dynamic_growth_steps`); None for no scaling. The bfloat16 default is
            no scaling (a fixed scale of 1).
        precision: "float16" or "bfloat16".
        device: "gpu", "cpu" or "any" (see `rewrite_graph_def`); None picks "gpu" for float16 and "cpu" for
            bfloat16. float16 on "gpu" without a GPU does not rewrite (warning); pass "cpu" to rewrite on CPU.
        rewrite_existing: also rewrite functions already traced (otherwise a warning names them).
        **rewrite_options: `keep_fp32`, `force_low`, `lists`, `level`, `assign`, `costs`, as for
            `rewrite_graph_def`. `assign` defaults to "cost" for bfloat16 on a CPU (MP_REWRITE_ASSIGN=lists|cost
            overrides that) and to Grappler's "lists" on a GPU and for float16. With assign="cost", Keras 3's
            training BatchNormalization layers are fused into FusedBatchNormV3 and its gradient
            (rules.batchnorm_training), with MP_REWRITE_STEP_RULES=1 the rewrite rules valid in a training step
            run on it (`step_rules`), and without `costs` each traced step is measured on this machine across
            its first calls, running the lists meanwhile (cached per machine: `cost_hook`, `deferred`); under
            tf.distribute the step is measured once for the job (one process: for every replica; several workers:
            by the leader, whose decision every worker swaps in before the same call, `job_decision`). On a CPU
            without bfloat16 units the steps stay float32 (a warning says so once).

    Returns:
        The wrapped optimizer (a `mp_rewrite.LossScaleOptimizer`; TF's own wrapper for a v1 optimizer).

    Raises:
        ValueError: `opt` is None, not a supported optimizer or a loss scale optimizer already, a Keras mixed
            precision dtype policy is set (the model would be cast twice), or `loss_scale` is invalid.
        TypeError: `loss_scale` is a TF v1 LossScale other than Fixed/DynamicLossScale.
        OptionError: a bad precision, device, level or pattern.
    """
    if opt is None:
        raise ValueError('"opt" must be an instance of a tf.train.Optimizer or a tf.keras.optimizers.Optimizer, but '
                         "got: None (to rewrite without an optimizer, call mp_rewrite.enable_graph_rewrite)")
    return _enable(opt, loss_scale, precision, device, rewrite_existing, rewrite_options)


def enable_graph_rewrite(precision: str = "float16", device=None, *, rewrite_existing: bool = False,
                         **rewrite_options) -> None:
    """Make every tf.function traced from now on run mixed precision, without an optimizer (e.g. inference).

    Arguments are those of `enable_mixed_precision_graph_rewrite`; `disable_mixed_precision_graph_rewrite` undoes it.
    """
    _enable(None, _DEFAULT, precision, device, rewrite_existing, rewrite_options)


def _enable(opt, loss_scale, precision, device, rewrite_existing, rewrite_options):
    _check_no_mixed_policy()
    options, resolved = _rewrite_options(precision, device, rewrite_options)
    wrapped = None if opt is None else wrap_optimizer(opt, _loss_scale_for(precision, loss_scale))
    # Nothing changed state before this point, so a failed call leaves the rewrite as it was (as TF does).
    options = _check_device_available(options, precision, resolved)
    _STATE["enabled"] = _Enabled(precision, resolved, options)
    if options is None:
        function_hook.uninstall()
        return wrapped
    function_hook.install(options, veto=_mixed_policy_veto)
    existing = function_hook.existing_candidates(options)
    if rewrite_existing:
        for name in existing:
            function_hook.rewrite_registered(name, options)
    elif existing:
        _warn_existing(existing)
    return wrapped


def disable_mixed_precision_graph_rewrite(restore: bool = True) -> list[str]:
    """Stop rewriting newly traced functions.

    Args:
        restore: also put the traced float32 definitions back for every function rewritten so far.

    Returns:
        The names of the functions restored.
    """
    if _STATE["enabled"] is None:
        logger.warning("disable_mixed_precision_graph_rewrite() called when mixed precision is already disabled.")
    _STATE["enabled"] = None
    function_hook.uninstall()
    deferred.drop()  # steps still being measured keep what they run (the lists' rewrite, or restored below)
    return function_hook.restore() if restore else []


@contextlib.contextmanager
def mixed_precision_graph_rewrite(opt=None, loss_scale=_DEFAULT, precision: str = "float16", device=None, *,
                                  restore: bool = True, rewrite_existing: bool = False, **rewrite_options):
    """Enable the rewrite inside a `with` block; yields the wrapped optimizer (None without `opt`).

    On exit the previous state comes back: the rewrite is disabled (or the enclosing block's settings
    reinstalled), and with `restore` every function rewritten inside the block gets its traced definition back.
    Arguments are those of `enable_mixed_precision_graph_rewrite`.
    """
    previous = _STATE["enabled"]
    previous_options = function_hook.active_options()
    since = function_hook.mark()
    wrapped = _enable(opt, loss_scale, precision, device, rewrite_existing, rewrite_options)
    try:
        yield wrapped
    finally:
        _STATE["enabled"] = previous
        if previous_options is not None:
            function_hook.install(previous_options, veto=_mixed_policy_veto)
        else:
            function_hook.uninstall()
        if restore:
            function_hook.restore(since=since)


def is_enabled() -> bool:
    """True while `enable_mixed_precision_graph_rewrite` is in effect (even when it found no device to rewrite for)."""
    return _STATE["enabled"] is not None


def rewritten_functions() -> dict:
    """Return {function name: RewriteResult} for every tf.function body running rewritten, in rewrite order.

    `result.summary()` says what was converted; `result.coloring` why. Failed rewrites are in `rewrite_failures()`.
    """
    return function_hook.rewritten()


def finish_measuring() -> dict:
    """Measure now every step the cost assignment is still measuring across its first calls, and swap in what it
    decides (otherwise a piece is measured before each of the step's next calls, training.deferred).

    Returns:
        {function name: RewriteResult} of the steps whose measured rewrite was swapped in.
    """
    return deferred.finish()


def rewrite_failures() -> dict:
    """Return {function name: error} for functions the rewrite failed on (they run float32, as traced)."""
    return function_hook.failures()


def _rewrite_options(precision, device, rewrite_options):
    from .loss_scale.optimizer import UNSCALE_SCOPE
    from ..core.options import make_options

    unknown = sorted(set(rewrite_options) - {"keep_fp32", "force_low", "lists", "level", "assign", "costs"})
    if unknown:
        raise TypeError(f"enable_mixed_precision_graph_rewrite() got unexpected keyword argument(s) {unknown}; "
                        "rewrite options are keep_fp32, force_low, lists, level, assign and costs")
    rewrite_options = {**rewrite_options, "assign": _assign_for(precision, device, rewrite_options)}
    if rewrite_options["assign"] == "cost" and rewrite_options.get("costs") is None:
        _warn_if_no_units(precision)
        from ..analysis.op_costs import this_machine  # measured on first use per traced function, cached
        rewrite_options["costs"] = cost_hook.HookSafeCosts(this_machine(precision))
    # Gradients are unscaled in float32 (see dynamic_scale.multiply), whatever the user keeps besides.
    keep = rewrite_options.pop("keep_fp32", ())
    keep = ([keep] if isinstance(keep, str) else list(keep)) + [f"*{UNSCALE_SCOPE}*"]
    options = make_options(precision, device, keep_fp32=keep, **rewrite_options)
    return options, options.device


def _assign_for(precision, device, rewrite_options) -> str:
    """The precision assignment: the one asked for (`assign=`, or a `costs` table: "cost"); else MP_REWRITE_ASSIGN
    (lists|cost, as for the CLI); else "cost" for bfloat16 on a CPU (no GPU, device None or "cpu": precision by
    measured cost, BatchNorm fused in the step, never slower than float32) and Grappler's "lists" otherwise (a GPU,
    whose Tensor Cores the lists were written for, and float16, which a CPU emulates)."""
    from ..core.assign_env import assign_from_env
    if rewrite_options.get("assign") is not None:
        return rewrite_options["assign"]
    if rewrite_options.get("costs") is not None:
        return "cost"
    chosen = assign_from_env()
    if chosen:
        return chosen
    on_cpu = device in (None, "cpu") and not tf.config.list_physical_devices("GPU")
    return "cost" if precision == "bfloat16" and on_cpu else "lists"


def _warn_if_no_units(precision):
    from ..analysis.op_costs import MachineCosts, machine_facts
    note = MachineCosts(precision, machine_facts()).no_units_note()
    if note:
        _warn_once("no_units", f"mixed precision graph rewrite: {note}, and training steps run float32 (Keras 3's "
                   "BatchNormalization still fused). Pass assign='lists' to rewrite by Grappler's lists anyway.")


def _loss_scale_for(precision, loss_scale):
    if loss_scale is _DEFAULT:
        return "dynamic" if precision == "float16" else None
    return loss_scale


def _check_device_available(options, precision, device):
    """Return the options to install, or None when there is nothing to rewrite for; warn once about CPU float16."""
    import tensorflow as tf

    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if device == "gpu" and not has_gpu:
        slow = "" if precision == "bfloat16" else " (slow: most CPU kernels emulate float16)"
        _warn_once("no_gpu", f"mixed precision graph rewrite: no GPU found, so {precision} graphs are not "
                   "rewritten (as Grappler's pass does without a GPU); loss scaling stays on. To rewrite anyway, "
                   f"pass device='cpu'{slow}.")
        return None
    if precision == "float16" and not has_gpu:
        _warn_once("cpu_float16", "mixed precision graph rewrite: float16 on CPU (no GPU found). The rewrite runs, "
                   "but most CPU kernels have no native float16 path and emulate it through float32, so training "
                   "is usually slower than float32. Use precision='bfloat16' for speed on CPU.")
    return options


def _warn_once(key, message):
    if key not in _STATE["warned"]:
        _STATE["warned"].add(key)
        logger.warning(message)


def _keras_mixed_policy():
    """The name of a mixed global dtype policy of Keras 3 or tf_keras (TF_USE_LEGACY_KERAS), if one is set."""
    import sys

    for module in ("keras", "tf_keras"):
        keras = sys.modules.get(module)
        if keras is not None and hasattr(keras, "mixed_precision"):
            name = keras.mixed_precision.global_policy().name
            if name.startswith("mixed_"):
                return name
    return None


def _check_no_mixed_policy():
    policy = _keras_mixed_policy()
    if policy:
        raise ValueError(
            "The mixed precision graph rewrite cannot be enabled, because the global Keras dtype Policy has been set "
            f"to a mixed precision policy ('{policy}'). At most one of set_global_policy() with a mixed precision "
            "policy and enable_mixed_precision_graph_rewrite() can be called: both cast the model, and it would be "
            "cast twice. Call keras.mixed_precision.set_global_policy('float32') first to use the graph rewrite.")


def _mixed_policy_veto():
    policy = _keras_mixed_policy()
    if not policy:
        return None
    _warn_once("policy", f"mixed precision graph rewrite: the global Keras dtype policy was set to '{policy}' after "
               "the rewrite was enabled; functions traced under it are not rewritten (they would be cast twice).")
    return f"the global Keras dtype policy is '{policy}'"


def _warn_existing(names):
    # Newest first (TF numbers traced functions in order): the ones the user just traced are the likely culprits.
    names = sorted(names, key=lambda n: -int(re.search(r"(\d+)$", n).group(1)) if re.search(r"\d+$", n) else 0)
    shown = [n for n in names if n.startswith("__inference_")] or names
    more = len(names) - min(len(shown), _MAX_NAMED)
    listed = ", ".join(shown[:_MAX_NAMED]) + (f" and {more} more" if more > 0 else "")
    logger.warning("mixed precision graph rewrite: %d function(s) traced before enabling keep running in float32: "
                   "%s. Retrace them (a Keras model: compile it again or make_train_function(force=True)) or pass "
                   "rewrite_existing=True.", len(names), listed)


def wrap_optimizer(opt, loss_scale="dynamic"):
    """Wraps `opt` in a LossScaleOptimizer, as `enable_mixed_precision_graph_rewrite(opt, loss_scale)` does.

    Args:
        opt: a Keras 3 or tf_keras optimizer (not already a loss scale optimizer). A TF v1 `tf.compat.v1.train.
            Optimizer` gets TF's own `MixedPrecisionLossScaleOptimizer`, as in TF (None then means the fixed scale
            1; dicts are not accepted).
        loss_scale: "dynamic" (default: dynamic scaling from 2**15, doubling after 2000 finite steps); an int or
            float (a fixed scale); a dict of LossScaleOptimizer settings (`dynamic`, `initial_scale`,
            `dynamic_growth_steps`); a TF v1 `FixedLossScale`/`DynamicLossScale`; or None for no loss scaling, which
            returns a LossScaleOptimizer with the fixed scale 1 (exact, and `get_scaled_loss` etc. keep working).

    Returns:
        The new LossScaleOptimizer (a `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` for v1 `opt`).

    Raises:
        ValueError: `opt` is a loss scale optimizer already or not a supported optimizer, or `loss_scale` is invalid.
        TypeError: `loss_scale` is a LossScale subclass other than FixedLossScale and DynamicLossScale.
    """
    if is_loss_scale_optimizer(opt):
        raise LossScaleError(f'"opt" must not already be an instance of a {type(opt).__name__}. '
                             "`enable_mixed_precision_graph_rewrite` will automatically wrap the optimizer with a "
                             "LossScaleOptimizer.")
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        # TF 2.21 still ships the wrapper enable_mixed_precision_graph_rewrite used for v1 optimizers.
        v1_loss_scale = 1 if loss_scale is None else loss_scale
        return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, v1_loss_scale)
    if _optimizer_family(opt) is None:
        raise LossScaleError(
            '"opt" must be an instance of a tf.compat.v1.train.Optimizer, a keras.optimizers.Optimizer '
            f"(Keras 3) or a tf_keras optimizer, but got: {opt}")
    return LossScaleOptimizer(opt, **settings_from_loss_scale(loss_scale))

