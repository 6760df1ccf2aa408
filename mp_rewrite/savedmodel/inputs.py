"""Inputs for running a SavedModel's signatures without hand-made data: what `verify`, `--tune` and the guard feed.

Given arrays (an .npz file, keys "input" or "SIGNATURE/input") are used as they are. Every other input is made from
its TensorSpec with a fixed seed:

- undefined dimensions: the batch (first) dimension is `batch_size` (default 2), every other one `dim` (default
  16, `--seq-len`), unless `--input-shapes name=2x128,...` says otherwise;
- floats: standard normal;
- integers: ids drawn from [0, 1000), or from [0, N) once the model has said that a table it indexes has N rows
  (TF's "indices[...] = 37 is not in [0, 30)": `id_limit_from_error`); segment / type ids from {0, 1};
- masks (an integer or bool input whose name contains "mask") and other bools: true, with the rows after the first
  cut short (ragged), so both a full and a padded sequence are checked;
- strings cannot be made up: `missing_inputs` lists every one that needs data, before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import zlib

import numpy as np

from ..errors import ModelError, OptionError

# DataType enums random inputs are made for: floating, integer and bool (types_pb2 values).
FEEDABLE_DTYPES = frozenset({1, 2, 19, 14, 3, 4, 5, 6, 9, 17, 22, 23, 10})  # float double half bfloat16 int* uint* bool

DEFAULT_BATCH = 2  # an undefined batch dimension in made-up inputs, unless --batch-size says
DEFAULT_DIM = 16
DEFAULT_ID_LIMIT = 1000
_OUT_OF_RANGE = re.compile(r"is not in \[0, (\d+)\)")


def parse_input_shapes(text: str | None) -> dict:
    """`"ids=2x128,mask=2x128"` -> {"ids": (2, 128), "mask": (2, 128)}.

    Raises:
        OptionError: a part that is not NAME=DIMxDIM... with positive whole numbers.
    """
    shapes = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, _, dims = part.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            shape = ()
        if not name.strip() or not shape or min(shape) < 1:
            raise OptionError(f"--input-shapes: '{part}' is not NAME=DIMxDIM (e.g. token_ids=2x128)")
        shapes[name.strip()] = shape
    return shapes


def check_input_options(*, inputs=None, seed: int = 0, batch_size: int = DEFAULT_BATCH, dim: int = DEFAULT_DIM,
                        input_shapes: str | None = None, rtol=None, atol=None) -> None:
    """Check the options of verification before anything is converted or written.

    Raises:
        OptionError: a negative or non-finite tolerance, a negative seed, a batch size or dimension below 1, bad
            --input-shapes, or an inputs file that does not exist or is not a readable .npz.
    """
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise OptionError(f"{name} must be a finite number >= 0 (got {value})")
    if seed is not None and seed < 0:
        raise OptionError(f"--seed must be >= 0 (got {seed})")
    for name, value in (("--batch-size", batch_size), ("--seq-len", dim)):
        if value is not None and value < 1:
            raise OptionError(f"{name} must be at least 1 (got {value})")
    parse_input_shapes(input_shapes)
    if inputs is not None and not isinstance(inputs, dict):
        load_inputs(inputs)


@dataclasses.dataclass(frozen=True)
class InputRecipe:
    """How the inputs of a signature are made where no one hands them over (the run check of `convert`, verify):
    `given` arrays (keys "input" or "SIGNATURE/input"), else made from the TensorSpec with `seed`, undefined
    batch dimensions `batch_size`, other undefined ones `dim`, and `shapes` ({name: shape}) where given."""

    given: dict = dataclasses.field(default_factory=dict)
    batch_size: int = DEFAULT_BATCH
    dim: int = DEFAULT_DIM
    shapes: dict = dataclasses.field(default_factory=dict)
    seed: int = 0


def input_recipe(inputs=None, *, batch_size: int = DEFAULT_BATCH, dim: int = DEFAULT_DIM, input_shapes=None,
                 seed: int = 0) -> InputRecipe:
    """An InputRecipe from the options as the CLI and the API take them, checked once.

    Args:
        inputs: a dict of arrays, or the path of an .npz file of them; None: every input made up.
        batch_size, dim, seed: as check_input_options takes them.
        input_shapes: "name=2x128,..." or a dict name -> shape.

    Raises:
        OptionError: as check_input_options.
    """
    shapes = input_shapes if isinstance(input_shapes, dict) else None
    check_input_options(seed=seed, batch_size=batch_size, dim=dim, input_shapes=None if shapes else input_shapes)
    given = inputs if isinstance(inputs, dict) else load_inputs(inputs) if inputs is not None else {}
    return InputRecipe(dict(given), batch_size, dim, dict(shapes or parse_input_shapes(input_shapes)), seed)


def load_inputs(path) -> dict:
    """Read an .npz file of inputs: keys are input names, or "SIGNATURE/input" for one signature only.

    Raises:
        OptionError: the file does not exist, or is not an .npz written by numpy.savez (an .npy, a truncated or
            empty file).
    """
    if not os.path.isfile(path):
        raise OptionError(f"inputs file '{path}' does not exist; write one with numpy.savez(path, name=array, ...)")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError("it holds one array (.npy); save named arrays with numpy.savez")
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, Exception) as e:  # zipfile raises BadZipFile for truncated files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise OptionError(f"cannot read inputs file '{path}' as an .npz written by numpy.savez: {reason}") from None


def missing_inputs(specs_by_signature: dict, given: dict) -> list[str]:
    """"SIGNATURE/input (dtype)" for every input that has no given array and cannot be made up (strings, unknown
    rank, types random data does not cover)."""
    missing = []
    for signature, specs in specs_by_signature.items():
        for name, spec in specs.items():
            if f"{signature}/{name}" in given or name in given:
                continue
            kind = spec.dtype
            if spec.shape.rank is None or not (kind.is_floating or kind.is_integer or kind.is_bool):
                what = "unknown rank" if spec.shape.rank is None else kind.name
                missing.append(f"{signature}/{name} ({what})")
    return missing


def unfeedable_inputs(meta_graph, keys, given) -> list[str]:
    """missing_inputs from a MetaGraph's signature protos, before anything is loaded or written: "SIGNATURE/input
    (dtype)" for every input of the `keys` (None: every user signature) that is not in `given` (names or
    "SIGNATURE/name") and that random data cannot make."""
    from tensorflow.core.framework import types_pb2

    from ..core.meta_graph import INTERNAL_PREFIX
    missing = []
    for key, signature in sorted(meta_graph.signature_def.items()):
        if key.startswith(INTERNAL_PREFIX) or (keys and key not in keys):
            continue
        for name, info in sorted(signature.inputs.items()):
            if f"{key}/{name}" in given or name in given:
                continue
            if info.tensor_shape.unknown_rank or info.dtype not in FEEDABLE_DTYPES:
                what = "unknown rank" if info.tensor_shape.unknown_rank else types_pb2.DataType.Name(info.dtype)[3:]
                missing.append(f"{key}/{name} ({what.lower()})")
    return missing


def id_limit_from_error(message: str) -> int | None:
    """N from TF's "indices[...] = X is not in [0, N)" (a table with N rows), else None."""
    found = _OUT_OF_RANGE.search(message)
    return int(found.group(1)) if found else None


def run_learning_id_limit(run, errors, tries: int = 4) -> tuple:
    """Call `run(id_limit)` with ids below DEFAULT_ID_LIMIT and, while it fails with one of `errors` because an id
    indexes past a table (TF's "... is not in [0, N)"), again with ids below N, at most `tries` times.

    Returns:
        (the last limit tried, run's result, None), or (that limit, None, the error the last try raised).
    """
    limit = DEFAULT_ID_LIMIT
    for _ in range(tries):
        try:
            return limit, run(limit), None
        except errors as e:
            failed, smaller = e, id_limit_from_error(str(e))
            if smaller is None or smaller >= limit:
                break
            limit = smaller
    return limit, None, failed


def signature_inputs(signature: str, specs: dict, given: dict, batch_size: int, seed: int, *, shapes=None,
                     dim: int = DEFAULT_DIM, id_limit: int = DEFAULT_ID_LIMIT) -> tuple[dict, dict]:
    """Inputs for one signature: from `given` (keys "SIGNATURE/name" or "name"), else made from the TensorSpec.

    Returns:
        ({input name: array}, {input name: how it was made, e.g. "random 2x16 ids < 1000" or "file"}).

    Raises:
        ModelError: a given array does not fit, or an input cannot be made (strings, unknown rank).
    """
    arrays, sources = {}, {}
    for name, spec in specs.items():
        where = f"signature '{signature}' input '{name}'"
        key = next((k for k in (f"{signature}/{name}", name) if k in given), None)
        if key is not None:
            arrays[name], sources[name] = _given_array(given[key], spec, where, key), "file"
            continue
        rng = np.random.default_rng([seed, zlib.crc32(f"{signature}/{name}".encode())])
        dims = _dims(spec, (shapes or {}).get(name), batch_size, dim, where, name)
        arrays[name], sources[name] = _made_array(spec.dtype, name, dims, rng, id_limit, where)
    return arrays, sources


def made_tensors(specs, batch: int, seed: int = 0, dim: int = DEFAULT_DIM, label: str = "made up",
                 id_limit: int = DEFAULT_ID_LIMIT) -> list:
    """Made-up eager tensors for a function's input TensorSpecs, in order, an unknown batch of `batch` and other
    unknown dimensions of `dim`, ids below `id_limit` (what a conversion times and compares a frozen signature's
    functions on)."""
    import tensorflow as tf
    arrays, _ = signature_inputs(label, {spec.name: spec for spec in specs}, {}, batch, seed, dim=dim,
                                 id_limit=id_limit)
    return [tf.constant(arrays[spec.name]) for spec in specs]


def _dims(spec, wanted, batch_size: int, dim: int, where: str, name: str) -> list[int]:
    if spec.shape.rank is None:
        raise ModelError(f"{where} has an unknown rank; give its value with --inputs FILE.npz (key '{name}')")
    dims = spec.shape.as_list()
    if wanted is not None:
        if not spec.shape.is_compatible_with(wanted):
            raise OptionError(f"--input-shapes gives {name}={'x'.join(map(str, wanted))}, but {where} has shape "
                              f"{spec.shape}")
        return list(wanted)
    return [(batch_size if i == 0 else dim) if d is None else d for i, d in enumerate(dims)]


def _made_array(dtype, name: str, dims: list, rng, id_limit: int, where: str) -> tuple[np.ndarray, str]:
    shape = "x".join(map(str, dims)) or "scalar"
    lowered = name.lower()
    if "mask" in lowered and (dtype.is_integer or dtype.is_bool) or dtype.is_bool:
        return _ragged_mask(dims).astype(dtype.as_numpy_dtype), f"mask {shape} (first row full, later rows padded)"
    if dtype.is_floating:
        return rng.standard_normal(dims).astype(dtype.as_numpy_dtype), f"random {shape}"
    if dtype.is_integer:
        limit = 2 if ("segment" in lowered or "type_id" in lowered) else max(1, id_limit)
        limit = min(limit, int(dtype.max) + 1)
        return rng.integers(0, limit, dims).astype(dtype.as_numpy_dtype), f"random {shape} ids < {limit}"
    raise ModelError(f"{where} is of type {dtype.name}, which random inputs do not cover; give its value with "
                     f"--inputs FILE.npz (key '{name}')")


def _ragged_mask(dims: list) -> np.ndarray:
    mask = np.ones(dims, dtype=bool)
    if len(dims) >= 2 and dims[0] > 1 and dims[1] > 1:
        for row in range(1, dims[0]):
            keep = max(1, dims[1] - row * max(1, dims[1] // (2 * dims[0])))
            mask[row, keep:] = False
    return mask


def _given_array(value: np.ndarray, spec, where: str, key: str) -> np.ndarray:
    if not spec.shape.is_compatible_with(value.shape):
        raise ModelError(f"--inputs array '{key}' has shape {value.shape} but {where} needs {spec.shape}")
    if spec.dtype.name == "string":
        if value.dtype.kind not in "SUO":
            raise ModelError(f"--inputs array '{key}' is {value.dtype} but {where} is string")
        return value
    want = np.dtype(spec.dtype.as_numpy_dtype)
    floats = value.dtype.kind == "f" and want.kind in "fV"
    if value.dtype != want and value.dtype.kind != want.kind and not floats:
        raise ModelError(f"--inputs array '{key}' is {value.dtype} but {where} is {spec.dtype.name}")
    return value.astype(want)


def check_given_keys(given: dict, specs: dict) -> None:
    """Refuse .npz keys that name no input of the verified signatures (likely a typo)."""
    names = {n for s in specs.values() for n in s} | {f"{k}/{n}" for k, s in specs.items() for n in s}
    unknown = sorted(k for k in given if k not in names)
    if unknown:
        raise ModelError(f"--inputs has arrays that name no signature input: {', '.join(unknown)} (keys are input "
                         f"names, or SIGNATURE/input; inputs: {', '.join(sorted(names))})")


def check_finite(given: dict) -> None:
    """Refuse calibration arrays with NaN or Inf (a guard measuring on them would certify nothing).

    Raises:
        ModelError: naming every array with non-finite values.
    """
    bad = sorted(k for k, v in given.items() if np.asarray(v).dtype.kind == "f" and not np.isfinite(v).all())
    if bad:
        raise ModelError(f"--inputs arrays with NaN or Inf values: {', '.join(bad)}; calibration data must be finite")
