"""Comparing two sets of outputs: pure numpy, shared by verification and the accuracy guard.

Pass/fail is numpy's `allclose` rule, element by element: |converted - original| <= atol + rtol * |original|.
NaN or Inf where the original has none fails; the same NaN/Inf in both passes. Integer, bool and string outputs
must match exactly.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import OptionError

# (rtol, atol) per precision, measured (TF 2.21 CPU, batch 4 of random normal inputs, seeds 0 and 1, outputs of
# magnitude 0.2-2 unless said) on Keras models with random weights converted by convert_saved_model:
#   largest |converted - original|   float16   bfloat16
#   CNN + BatchNorm (2 conv blocks)  1.4e-3    6.4e-3
#   Transformer encoder (2 blocks)   3.2e-3    1.6e-2
#   LSTM (20 steps)                  1.9e-4    1.6e-3
#   ResNet-50, MobileNetV2 (softmax) 1.7e-6    5.5e-6   (outputs ~1e-3)
# float16 keeps 11 significant bits, bfloat16 8: the defaults leave a 3x margin over the worst case above, so a
# correct conversion passes and a broken one (an overflow, a wrong cast) fails. Outputs far below atol (softmax
# probabilities) are judged by atol alone: look at the cosine similarity too, or pass a smaller --atol.
DEFAULT_TOLERANCES = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}
# Measured on keras-hub ViT/BERT/GPT-2 backbones (small configs, random weights) converted to bfloat16: a handful
# of elements (1 in 1088 for ViT) land just outside the element rule while the output's cosine is 0.9999 and its
# largest error 2% of its scale, as with TF's own pass. One percent of the elements may miss the element rule; the
# scale and cosine rules still catch a conversion that is broken everywhere.
MAX_BAD_FRACTION = 0.01
MIN_COSINE = 0.99


def default_tolerance(precision: str) -> tuple[float, float]:
    """Return the default (rtol, atol) for "float16" or "bfloat16".

    Raises:
        OptionError: an unknown precision.
    """
    try:
        return DEFAULT_TOLERANCES[precision]
    except KeyError:
        raise OptionError(f"unknown precision {precision!r}: use 'float16' or 'bfloat16'") from None


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """The comparison of one output.

    Attributes:
        signature, output: which output ("" signature for plain dicts).
        shape, dtype: of the original's output.
        max_abs: largest |converted - original| over elements finite in both (0 when none).
        max_rel: largest |converted - original| / |original| over elements with |original| > atol.
        cosine: cosine similarity of the flattened finite elements (None for non-numeric outputs).
        nan, inf: (count in the original, count in the converted output).
        bad: elements outside the tolerance (or different, for exact outputs).
        size: number of elements.
        scaled_error: max |converted - original| / max |original| (the error against the output's own scale).
        passed: the verdict (see compare_arrays).
        problem: why it failed, in a few words ("" when it passed).
        unvarying: how the original's output shows that it does not depend on the inputs fed ("0.001 everywhere",
            "the same in every row of the batch"), so that comparing it proves nothing; "" when it varies.
    """

    signature: str
    output: str
    shape: tuple
    dtype: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float | None = None
    nan: tuple = (0, 0)
    inf: tuple = (0, 0)
    bad: int = 0
    size: int = 0
    scaled_error: float = 0.0
    passed: bool = True
    problem: str = ""
    unvarying: str = ""


def compare_outputs(ref: dict, got: dict, rtol: float, atol: float, signature: str = "",
                    inputs: dict | None = None) -> list[OutputCheck]:
    """Compare two dicts of output arrays (name -> array-like), one OutputCheck per name in either.

    Args:
        ref: the original's outputs. got: the converted model's outputs.
        rtol, atol: the tolerance, numpy.allclose's rule per element.
        signature: a label copied into every check.
        inputs: the arrays both ran on ({name: array}); where their rows differ, an output whose rows are all
            alike is marked `unvarying` (without them only a constant output is).

    Returns:
        One OutputCheck per output, in `ref`'s order, then any output only `got` has (those fail).
    """
    checks = []
    rows = inputs is not None and rows_differ(inputs)
    for name, value in ref.items():
        reference = np.asarray(value)
        if name not in got:
            checks.append(_failed(signature, name, reference, "missing from the converted model's outputs"))
        else:
            check = compare_arrays(reference, np.asarray(got[name]), rtol, atol, signature, name)
            checks.append(dataclasses.replace(check, unvarying=unvarying(reference, rows, rtol, atol)))
    for name in got:
        if name not in ref:
            checks.append(_failed(signature, name, np.asarray(got[name]), "output the original does not have"))
    return checks


def _failed(signature: str, name: str, array: np.ndarray, problem: str) -> OutputCheck:
    return OutputCheck(signature, name, tuple(array.shape), str(array.dtype), size=int(array.size), passed=False,
                       problem=problem)


def compare_arrays(ref: np.ndarray, got: np.ndarray, rtol: float, atol: float, signature: str = "",
                   name: str = "", max_bad_fraction: float = MAX_BAD_FRACTION) -> OutputCheck:
    """Compare one output array with its reference (see compare_outputs).

    A float output passes when all of these hold, so that neither a few rounding outliers in a deep network fail
    it nor a collapsed output passes it:
    - no NaN/Inf where the original is finite;
    - it has not collapsed: not all zero, not constant, where the original varies (beyond rtol of its scale);
    - at most `max_bad_fraction` of its elements are outside numpy's allclose rule (|d| <= atol + rtol |ref|);
    - its largest error is within rtol of its own scale (max |d| / max |ref| <= rtol);
    - its cosine similarity to the original is at least MIN_COSINE.
    Integer, bool and string outputs must match exactly.
    """
    if ref.shape != got.shape:
        return _failed(signature, name, ref, f"shape {got.shape} instead of {ref.shape}")
    if ref.dtype != got.dtype:
        return _failed(signature, name, ref, f"dtype {got.dtype} instead of {ref.dtype}")
    if not is_float(ref.dtype):
        bad = int(np.count_nonzero(ref != got))
        return OutputCheck(signature, name, tuple(ref.shape), str(ref.dtype), bad=bad, size=int(ref.size),
                           passed=bad == 0, problem=f"{bad} of {ref.size} elements differ" if bad else "")
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    finite = np.isfinite(r) & np.isfinite(g)
    diff = np.abs(g[finite] - r[finite])
    within = diff <= atol + rtol * np.abs(r[finite])
    # A non-finite element passes only if both are the same NaN/Inf.
    same_special = (np.isnan(r) & np.isnan(g)) | (np.isinf(r) & (r == g))
    bad = int(np.count_nonzero(~within) + np.count_nonzero(~finite & ~same_special))
    big = np.abs(r[finite]) > atol
    nan = (int(np.isnan(r).sum()), int(np.isnan(g).sum()))
    inf = (int(np.isinf(r).sum()), int(np.isinf(g).sum()))
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[finite]).max()) if finite.any() else 0.0
    scaled = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    cosine = _cosine(r[finite], g[finite])
    problem = _problem(r[finite], g[finite], bad, int(ref.size), nan, inf, scaled, cosine, rtol, atol,
                       max_bad_fraction)
    return OutputCheck(signature, name, tuple(ref.shape), str(ref.dtype), max_abs=max_abs,
                       max_rel=float((diff[big] / np.abs(r[finite][big])).max()) if big.any() else 0.0,
                       cosine=cosine, nan=nan, inf=inf, bad=bad, size=int(ref.size), scaled_error=scaled,
                       passed=not problem, problem=problem)


def _problem(r, g, bad: int, size: int, nan, inf, scaled: float, cosine: float, rtol: float, atol: float,
             max_bad_fraction: float) -> str:
    """Why a float output fails (the first rule of compare_arrays it breaks), or "" when it passes."""
    if nan[1] > nan[0] or inf[1] > inf[0]:
        return f"NaN/Inf where the original is finite ({nan[1]} NaN, {inf[1]} Inf)"
    # An original that varies only within rtol of its own scale (a random-weight softmax at 0.1 +- 1e-4, below
    # bfloat16's resolution of 0.4%) rounds to a constant without anything having collapsed.
    varies = r.size > 1 and np.ptp(r) > rtol * np.abs(r).max()
    if varies and g.size and np.ptp(g) == 0:
        what = "all zero" if not g.any() else f"constant {g.flat[0]:.3g}"
        return f"collapsed: {what} where the original varies"
    if bad > max_bad_fraction * size:
        return f"{bad} of {size} elements outside rtol={rtol:g}, atol={atol:g} (more than {max_bad_fraction:.0%})"
    if scaled > rtol and scaled * np.abs(r).max() > atol:
        return f"largest error {scaled:.2g} of the output's scale (over rtol={rtol:g})"
    if cosine < MIN_COSINE:
        return f"cosine similarity {cosine:.4f} (under {MIN_COSINE})"
    return ""


def rows_differ(arrays: dict) -> bool:
    """Whether some input array has two or more rows (its first axis, the batch) that are not all alike."""
    for value in arrays.values():
        array = np.asarray(value)
        if array.ndim and array.shape[0] > 1 and not _rows_alike(array):
            return True
    return False


def unvarying(output: np.ndarray, inputs_differ: bool = False, rtol: float = 0.0, atol: float = 0.0) -> str:
    """How an output shows that it does not depend on the inputs it was computed from, or "" when it varies.

    A constant output ("0.001 everywhere": a model of random weights whose activations die out, a softmax of
    equal logits) says so whatever the inputs; with `inputs_differ` (the inputs' rows differ) so does an output
    whose rows are alike: the same, or within the tolerance (`rtol`, `atol`) of the first row, so that a converted
    model that ignored its inputs and gave the first row for every one would pass (MobileNetV2 of random weights
    without its softmax: logits that differ by 5e-11). Comparing such an output with a converted model's tells
    nothing about the conversion of the layers before it. An output of one element tells nothing either way ("").
    """
    output = np.asarray(output)
    if output.size < 2:
        return ""
    flat = output.ravel()
    if np.all(flat == flat[0]) or (is_float(output.dtype) and np.all(np.isnan(flat.astype(np.float64)))):
        return f"{_value(flat[0])} everywhere"
    if inputs_differ and output.ndim and output.shape[0] > 1:
        if _rows_alike(output):
            return "the same in every row of the batch"
        if (rtol or atol) and is_float(output.dtype) and _rows_within(output.astype(np.float64), rtol, atol):
            return "every row of the batch within the tolerance of the first"
    return ""


def _rows_alike(array: np.ndarray) -> bool:
    return bool(np.all(array == array[:1]))


def _rows_within(array: np.ndarray, rtol: float, atol: float) -> bool:
    """Whether the first row, given for every row, would meet numpy's allclose rule (NaN/Inf: never)."""
    if not np.all(np.isfinite(array)):
        return False
    return bool(np.all(np.abs(array - array[:1]) <= atol + rtol * np.abs(array)))


def _value(value) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return repr(value)


def is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))
