"""Verification: run an original and a converted model on the same inputs and compare their outputs.

It is a front end: it loads both SavedModels in TensorFlow, makes inputs (random ones from the signature
with a fixed seed, or arrays from an .npz file), runs every signature on both and compares.

The comparison itself is mp_rewrite.analysis.compare (pure numpy).
"""

from __future__ import annotations

import dataclasses
import time

from ..analysis.compare import OutputCheck, compare_outputs, default_tolerance
from ..analysis.graph_runs import tf_reason
from ..errors import ModelError
from ..model.files import read_saved_model
from ..model.runtime import load_saved_model
from ..model.signatures import check_signature_keys, require_signatures
from ..model.tags import load_tags, parse_tag_set, single_meta_graph
from .inputs import (DEFAULT_DIM, DEFAULT_ID_LIMIT, check_given_keys, check_input_options, id_limit_from_error,
                     load_inputs, missing_inputs, parse_input_shapes, signature_inputs)

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
        signatures = len({c.signature for c in self.checks})  # those that could not run count too
        return (f"verification {verdict}: {_count(len(self.checks), 'output')} of "
                f"{_count(signatures, 'signature')} compared at rtol={self.rtol:g}, atol={self.atol:g} ({where})")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def detect_precision(path) -> str:
    """The low precision a converted SavedModel uses: "bfloat16" if any node attr is bfloat16, else "float16"."""
    from tensorflow.core.framework import types_pb2

    seen = set()
    for meta_graph in read_saved_model(path).meta_graphs:
        bodies = [meta_graph.graph_def.node] + [f.node_def for f in meta_graph.graph_def.library.function]
        for nodes in bodies:
            for node in nodes:
                for value in node.attr.values():
                    seen.add(value.type)
                    seen.update(value.list.type)
    return "bfloat16" if types_pb2.DT_BFLOAT16 in seen else "float16"


def _run(function, inputs: dict, which: str, signature: str, precision: str) -> dict:
    import tensorflow as tf
    try:
        outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
    except (tf.errors.OpError, ValueError, TypeError) as e:
        message = tf_reason(e)
        hint = ""
        if "OpKernel" in message and precision == "float16":
            hint = " (a float16 model converted for --device gpu needs a GPU; convert with --device cpu to run here)"
        raise ModelError(f"the {which} model failed to run signature '{signature}': {message}{hint}") from None
    return {k: v.numpy() for k, v in outputs.items()}


def _interface(function) -> tuple:
    """(input specs, output specs) of a loaded signature, for comparing two models' signatures."""
    outputs = {k: (v.dtype, tuple(v.shape.as_list()) if v.shape.rank is not None else None)
               for k, v in function.structured_outputs.items()}
    return function.structured_input_signature[1], outputs


def verify_saved_models(original, converted, *, signatures=None, inputs=None, batch_size: int = 2, seed: int = 0,
                        rtol: float | None = None, atol: float | None = None, precision: str | None = None,
                        input_shapes: str | dict | None = None, dim: int = DEFAULT_DIM, tag_set=None,
                        progress=None) -> VerifyReport:
    """Run every (or the given) signature of both SavedModels on the same inputs and compare the outputs.

    Args:
        original, converted: SavedModel directories.
        signatures: signature keys to verify (a str or several); None: all of the original's.
        inputs: a dict or an .npz path of arrays keyed by input name (or "SIGNATURE/name"); inputs not given are
            made from the signature's TensorSpec with `seed` (see mp_rewrite.savedmodel.inputs).
        batch_size, dim: undefined batch and other dimensions of made-up inputs.
        input_shapes: "name=2x128,..." (or a dict name -> shape) for made-up inputs.
        rtol, atol: the tolerance; None takes the default of the precision.
        precision: "float16" or "bfloat16" for the default tolerance; None detects it from the converted model.
        tag_set: the MetaGraph to load from both ("serve,gpu"); None: the only one, or the only "serve" one.
        progress: optional callable (done, total, step name), after each model run.

    Returns:
        A VerifyReport (report.passed tells whether every output is within the tolerance).

    Raises:
        ModelError: a model cannot be loaded or run, an unknown signature, unusable or missing inputs (every
            input that needs data is named).
        OptionError: a bad precision, tolerance, seed, shape or inputs file.
    """
    start = time.perf_counter()
    _, meta_graph = single_meta_graph(read_saved_model(original), parse_tag_set(tag_set), "verifying")
    tags = load_tags(meta_graph)
    converted_graphs = read_saved_model(converted).meta_graphs
    if len(converted_graphs) == 1:  # a frozen conversion keeps one MetaGraph, with the tags it was made from
        converted_tags = load_tags(converted_graphs[0])
    else:
        converted_tags = tags
    shapes = input_shapes if isinstance(input_shapes, dict) else parse_input_shapes(input_shapes)
    check_input_options(seed=seed, batch_size=batch_size, dim=dim, rtol=rtol, atol=atol)
    precision = precision or detect_precision(converted)
    default_rtol, default_atol = default_tolerance(precision)
    defaults = rtol is None and atol is None
    rtol, atol = (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)
    given = load_inputs(inputs) if isinstance(inputs, (str, bytes)) or hasattr(inputs, "__fspath__") else inputs
    given = dict(given or {})
    models = load_saved_model(original, "original", tags), load_saved_model(converted, "converted", converted_tags)
    keys = check_signature_keys(signatures, models[0].signatures.keys(), "the original SavedModel") or \
        require_signatures(list(models[0].signatures.keys()), original)
    specs = {k: models[0].signatures[k].structured_input_signature[1] for k in keys}
    check_given_keys(given, specs)
    missing = missing_inputs(specs, given)
    if missing:
        raise ModelError(f"{len(missing)} input(s) need data that cannot be made up: {', '.join(missing)}; give "
                         "them in --inputs FILE.npz (keys: input names)")
    checks, sources, total = [], {}, 2 * len(keys)
    for i, key in enumerate(keys):
        if key not in models[1].signatures:
            checks.append(OutputCheck(key, "*", (), "", passed=False, problem="signature missing in converted model"))
            continue
        ref_fn, got_fn = models[0].signatures[key], models[1].signatures[key]
        if _interface(ref_fn) != _interface(got_fn):
            checks.append(OutputCheck(key, "*", (), "", passed=False, problem="signature inputs/outputs differ"))
            continue
        made = lambda limit: signature_inputs(key, specs[key], given, batch_size, seed, shapes=shapes,  # noqa: E731
                                              dim=dim, id_limit=limit)
        arrays, sources[key], reference = _run_learning_id_range(ref_fn, made, key, precision)
        if progress is not None:
            progress(2 * i + 1, total, f"{key} (original)")
        outputs = [reference, _run(got_fn, arrays, "converted", key, precision)]
        if progress is not None:
            progress(2 * i + 2, total, f"{key} (converted)")
        checks += compare_outputs(outputs[0], outputs[1], rtol, atol, signature=key)
    return VerifyReport(str(original), str(converted), precision, rtol, atol, defaults, checks, sources,
                        time.perf_counter() - start)


def signature_feeds(function, key: str, given: dict, batch_size: int, seed: int, precision: str, *,
                    shapes: dict | None = None, dim: int = DEFAULT_DIM, which: str = "original") -> dict:
    """The inputs a signature runs on (as verify makes them): given, else made up, with integer ids inside the
    tables they index (learned by running `function`, the `which` model's signature: the original's, or the
    written copy's for the run check of convert).

    Raises:
        ModelError: an input cannot be made up, or `function` fails on every try.
    """
    specs = function.structured_input_signature[1]
    made = lambda limit: signature_inputs(key, specs, given, batch_size, seed, shapes=shapes,  # noqa: E731
                                          dim=dim, id_limit=limit)
    return _run_learning_id_range(function, made, key, precision, which)[0]


def _run_learning_id_range(function, made, key: str, precision: str, which: str = "original", tries: int = 4):
    """Run `function` (the `which` model's) on made-up inputs; when an id indexes past a table ("... is not in
    [0, N)"), draw the ids below N and run again. Returns (arrays, how they were made, outputs)."""
    limit = DEFAULT_ID_LIMIT
    for _ in range(tries):
        arrays, sources = made(limit)
        try:
            return arrays, sources, _run(function, arrays, which, key, precision)
        except ModelError as e:
            smaller = id_limit_from_error(str(e))
            if smaller is None or smaller >= limit:
                raise
            limit = smaller
    raise ModelError(f"signature '{key}': could not find ids inside every table the inputs index; give the "
                     "integer inputs with --inputs FILE.npz")
