"""Comparing two sets of outputs: pure numpy, shared by verification and the accuracy guard.

Pass/fail is numpy's `allclose` rule, element by element: |converted - original| <= atol + rtol * |original|.
NaN or Inf where the original has none fails; the same NaN/Inf in both passes. Integer, bool and string outputs
must match exactly.
"""

from __future__ import annotations

import dataclasses

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
        passed: True if every element is within the tolerance.
        problem: why it failed, in a few words ("" when it passed).
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
    passed: bool = True
    problem: str = ""


def compare_outputs(ref: dict, got: dict, rtol: float, atol: float, signature: str = "") -> list[OutputCheck]:
    """Compare two dicts of output arrays (name -> array-like), one OutputCheck per name in either.

    Args:
        ref: the original's outputs. got: the converted model's outputs.
        rtol, atol: the tolerance, numpy.allclose's rule per element.
        signature: a label copied into every check.

    Returns:
        One OutputCheck per output, in `ref`'s order, then any output only `got` has (those fail).
    """
    checks = []
    for name, value in ref.items():
        reference = np.asarray(value)
        if name not in got:
            checks.append(_failed(signature, name, reference, "missing from the converted model's outputs"))
        else:
            checks.append(compare_arrays(reference, np.asarray(got[name]), rtol, atol, signature, name))
    for name in got:
        if name not in ref:
            checks.append(_failed(signature, name, np.asarray(got[name]), "output the original does not have"))
    return checks


def _failed(signature: str, name: str, array: np.ndarray, problem: str) -> OutputCheck:
    return OutputCheck(signature, name, tuple(array.shape), str(array.dtype), size=int(array.size), passed=False,
                       problem=problem)


def compare_arrays(ref: np.ndarray, got: np.ndarray, rtol: float, atol: float, signature: str = "",
                   name: str = "") -> OutputCheck:
    """Compare one output array with its reference (see compare_outputs)."""
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
    problem = ""
    if bad:
        problem = f"{bad} of {ref.size} elements outside rtol={rtol:g}, atol={atol:g}"
        if nan[1] > nan[0] or inf[1] > inf[0]:
            problem = f"NaN/Inf where the original is finite ({nan[1]} NaN, {inf[1]} Inf); " + problem
    return OutputCheck(signature, name, tuple(ref.shape), str(ref.dtype),
                       max_abs=float(diff.max()) if diff.size else 0.0,
                       max_rel=float((diff[big] / np.abs(r[finite][big])).max()) if big.any() else 0.0,
                       cosine=_cosine(r[finite], g[finite]), nan=nan, inf=inf, bad=bad, size=int(ref.size),
                       passed=bad == 0, problem=problem)


def is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))
