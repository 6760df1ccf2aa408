"""Verification: run an original and a converted model on the same inputs and compare their outputs.

It is a front end: it loads both SavedModels in TensorFlow, makes inputs (random ones from the signature
with a fixed seed, or arrays from an .npz file), runs every signature on both and compares.

The comparison itself is mp_rewrite.analysis.compare (pure numpy).
"""

from __future__ import annotations

import dataclasses
import time
import zlib

import numpy as np

from ..analysis.compare import OutputCheck, compare_outputs, default_tolerance, is_float
from ..errors import ModelError, OptionError

# --------------------------------------------------------------------------------------------- SavedModels


@dataclasses.dataclass
class VerifyReport:
    """The outcome of verify_saved_models.

    Attributes:
        original, converted: the SavedModel paths.
        precision: the precision whose default tolerances apply.
        rtol, atol: the tolerance used.
        defaults: True when rtol and atol are the precision's defaults (neither was given).
        checks: one OutputCheck per signature output.
        inputs: signature -> {input name: "random" or "file"}.
        seconds: wall time.
    """

    original: str
    converted: str
    precision: str
    rtol: float
    atol: float
    defaults: bool
    checks: list
    inputs: dict
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when every output is within the tolerance."""
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[OutputCheck]:
        """The checks that failed."""
        return [c for c in self.checks if not c.passed]

    def summary(self) -> str:
        """One line: passed or failed, how many outputs, at which tolerance."""
        verdict = "passed" if self.passed else f"FAILED ({len(self.failures)} of {len(self.checks)} outputs)"
        where = f"the {self.precision} defaults" if self.defaults else "as given"
        return (f"verification {verdict}: {_count(len(self.checks), 'output')} of "
                f"{_count(len(self.inputs), 'signature')} compared at rtol={self.rtol:g}, atol={self.atol:g} ({where})")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def detect_precision(path) -> str:
    """The low precision a converted SavedModel uses: "bfloat16" if any node attr is bfloat16, else "float16"."""
    from tensorflow.core.framework import types_pb2

    from .convert import read_saved_model
    seen = set()
    for meta_graph in read_saved_model(path).meta_graphs:
        bodies = [meta_graph.graph_def.node] + [f.node_def for f in meta_graph.graph_def.library.function]
        for nodes in bodies:
            for node in nodes:
                for value in node.attr.values():
                    seen.add(value.type)
                    seen.update(value.list.type)
    return "bfloat16" if types_pb2.DT_BFLOAT16 in seen else "float16"


def load_inputs(path) -> dict:
    """Read an .npz file of inputs: keys are input names, or "SIGNATURE/input" for one signature only.

    Raises:
        ModelError: the file cannot be read as .npz.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read inputs file '{path}' (an .npz written by numpy.savez): {e}") from None


def load_saved_model(path, which: str = "original"):
    """`tf.saved_model.load(path)`, with a one-line ModelError naming the model (`which`) if TF cannot load it."""
    import tensorflow as tf
    try:
        return tf.saved_model.load(str(path))
    except Exception as e:  # TF raises OSError, ValueError, OpError, ... for unloadable models
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"TensorFlow cannot load the {which} SavedModel '{path}': {message}") from None


_load = load_saved_model  # the name mp_rewrite.guard_saved_model imports


def _random_array(spec, rng, batch_size: int, where: str, name: str) -> np.ndarray:
    """A random array for a TensorSpec: normal floats, integers 0/1, random bools; batch dim = batch_size."""
    ask = f"give its value with --inputs FILE.npz (key '{name}')"
    if spec.shape.rank is None:
        raise ModelError(f"{where} has an unknown rank; {ask}")
    dims = spec.shape.as_list()
    if dims and dims[0] is None:
        dims[0] = batch_size
    if None in dims:
        raise ModelError(f"{where} has shape {spec.shape} with an undefined dimension {dims.index(None)}; random "
                         f"inputs only fill the batch dimension (--batch-size), so {ask}")
    dtype = spec.dtype
    if dtype.is_floating:
        return rng.standard_normal(dims).astype(dtype.as_numpy_dtype)
    if dtype.is_integer:
        return rng.integers(0, 2, dims).astype(dtype.as_numpy_dtype)  # 0/1 are valid ids for any lookup
    if dtype.is_bool:
        return rng.random(dims) < 0.5
    raise ModelError(f"{where} is of type {dtype.name}, which random inputs do not cover; {ask}")


def _given_array(value: np.ndarray, spec, where: str, key: str) -> np.ndarray:
    if not spec.shape.is_compatible_with(value.shape):
        raise ModelError(f"--inputs array '{key}' has shape {value.shape} but {where} needs {spec.shape}")
    if spec.dtype.name == "string":
        if value.dtype.kind not in "SUO":
            raise ModelError(f"--inputs array '{key}' is {value.dtype} but {where} is string")
        return value
    want = np.dtype(spec.dtype.as_numpy_dtype)
    if value.dtype != want and value.dtype.kind != want.kind and not (is_float(value.dtype) and is_float(want)):
        raise ModelError(f"--inputs array '{key}' is {value.dtype} but {where} is {spec.dtype.name}")
    return value.astype(want)


def signature_inputs(signature: str, specs: dict, given: dict, batch_size: int, seed: int) -> tuple[dict, dict]:
    """Inputs for one signature: from `given` (keys "SIGNATURE/name" or "name"), else random from its TensorSpec.

    Returns:
        ({input name: array}, {input name: "file" or "random"}).

    Raises:
        ModelError: a given array does not fit, or an input cannot be made at random (undefined dims, strings).
    """
    arrays, sources = {}, {}
    for name, spec in specs.items():
        where = f"signature '{signature}' input '{name}'"
        key = next((k for k in (f"{signature}/{name}", name) if k in given), None)
        if key is not None:
            arrays[name], sources[name] = _given_array(given[key], spec, where, key), "file"
        else:
            rng = np.random.default_rng([seed, zlib.crc32(f"{signature}/{name}".encode())])
            arrays[name], sources[name] = _random_array(spec, rng, batch_size, where, name), "random"
    return arrays, sources


def _run(function, inputs: dict, which: str, signature: str, precision: str) -> dict:
    import tensorflow as tf
    try:
        outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
    except (tf.errors.OpError, ValueError, TypeError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if "OpKernel" in message and precision == "float16":
            hint = " (a float16 model converted for --device gpu needs a GPU; convert with --device cpu to run here)"
        raise ModelError(f"the {which} model failed to run signature '{signature}': {message}{hint}") from None
    return {k: v.numpy() for k, v in outputs.items()}


def _check_keys(loaded, signatures) -> list[str]:
    keys = sorted(loaded.signatures.keys())
    if not keys:
        raise ModelError("the original SavedModel has no signatures, so there is nothing to run and compare; save "
                         "it with signatures (tf.saved_model.save(obj, path, signatures=...) or model.export)")
    if not signatures:
        return keys
    wanted = [signatures] if isinstance(signatures, str) else list(signatures)
    for key in wanted:
        if key not in keys:
            raise ModelError(f"the SavedModel has no signature '{key}' (its signatures: {', '.join(keys) or 'none'})")
    return list(dict.fromkeys(wanted))


def _interface(function) -> tuple:
    """(input specs, output specs) of a loaded signature, for comparing two models' signatures."""
    outputs = {k: (v.dtype, tuple(v.shape.as_list()) if v.shape.rank is not None else None)
               for k, v in function.structured_outputs.items()}
    return function.structured_input_signature[1], outputs


def verify_saved_models(original, converted, *, signatures=None, inputs=None, batch_size: int = 2, seed: int = 0,
                        rtol: float | None = None, atol: float | None = None, precision: str | None = None,
                        progress=None) -> VerifyReport:
    """Run every (or the given) signature of both SavedModels on the same inputs and compare the outputs.

    Args:
        original, converted: SavedModel directories.
        signatures: signature keys to verify (a str or several); None: all of the original's.
        inputs: a dict or an .npz path of arrays keyed by input name (or "SIGNATURE/name"); inputs not given are
            random, from the signature's TensorSpec with `seed` (undefined batch dimension = batch_size).
        rtol, atol: the tolerance; None takes the default of the precision.
        precision: "float16" or "bfloat16" for the default tolerance; None detects it from the converted model.
        progress: optional callable (done, total, step name), after each model run.

    Returns:
        A VerifyReport (report.passed tells whether every output is within the tolerance).

    Raises:
        ModelError: a model cannot be loaded or run, an unknown signature, unusable inputs.
        OptionError: a bad precision or tolerance.
    """
    from .model_dir import model_file
    start = time.perf_counter()
    model_file(original)
    model_file(converted)
    precision = precision or detect_precision(converted)
    default_rtol, default_atol = default_tolerance(precision)
    defaults = rtol is None and atol is None
    rtol, atol = (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)
    if rtol < 0 or atol < 0:
        raise OptionError(f"tolerances must be >= 0 (got rtol={rtol}, atol={atol})")
    if batch_size < 1:
        raise OptionError(f"--batch-size must be at least 1 (got {batch_size})")
    given = load_inputs(inputs) if isinstance(inputs, (str, bytes)) or hasattr(inputs, "__fspath__") else inputs
    given = dict(given or {})
    models = load_saved_model(original, "original"), load_saved_model(converted, "converted")
    keys = _check_keys(models[0], signatures)
    _check_given(given, {k: models[0].signatures[k].structured_input_signature[1] for k in keys})
    checks, sources, total = [], {}, 2 * len(keys)
    for i, key in enumerate(keys):
        if key not in models[1].signatures:
            checks.append(OutputCheck(key, "*", (), "", passed=False, problem="signature missing in converted model"))
            continue
        ref_fn, got_fn = models[0].signatures[key], models[1].signatures[key]
        if _interface(ref_fn) != _interface(got_fn):
            checks.append(OutputCheck(key, "*", (), "", passed=False, problem="signature inputs/outputs differ"))
            continue
        arrays, sources[key] = signature_inputs(key, ref_fn.structured_input_signature[1], given, batch_size, seed)
        outputs = []
        for which, fn, step in (("original", ref_fn, 2 * i + 1), ("converted", got_fn, 2 * i + 2)):
            outputs.append(_run(fn, arrays, which, key, precision))
            if progress is not None:
                progress(step, total, f"{key} ({which})")
        checks += compare_outputs(outputs[0], outputs[1], rtol, atol, signature=key)
    return VerifyReport(str(original), str(converted), precision, rtol, atol, defaults, checks, sources,
                        time.perf_counter() - start)


def _check_given(given: dict, specs: dict) -> None:
    """Refuse .npz keys that name no input of the verified signatures (likely a typo)."""
    names = {n for s in specs.values() for n in s} | {f"{k}/{n}" for k, s in specs.items() for n in s}
    unknown = sorted(k for k in given if k not in names)
    if unknown:
        raise ModelError(f"--inputs has arrays that name no signature input: {', '.join(unknown)} (keys are input "
                         f"names, or SIGNATURE/input; inputs: {', '.join(sorted(names))})")
