"""Verification: run an original and a converted model on the same inputs and compare their outputs.

It is a front end: it loads both SavedModels in TensorFlow, makes inputs (random ones from the signature
with a fixed seed, or arrays from an .npz file), runs every signature on both and compares. After a conversion
(`convert --verify`) the converted side is what the run check already called on the same inputs (SignatureRun):
the written copy is neither loaded nor called a second time. The original is loaded without its saver's functions
(loadable_copy.py: half the load of ResNet-50); only its signatures are called.

The comparison itself is mp_rewrite.analysis.compare (pure numpy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np

from ..analysis.compare import OutputCheck, compare_outputs, default_tolerance
from ..errors import ModelError, tf_reason
from ..model.files import read_saved_model
from ..model.runtime import load_saved_model
from ..model.signatures import check_signature_keys, function_key, require_signatures
from ..model.tags import load_tags, parse_tag_set, single_meta_graph
from .inputs import (DEFAULT_BATCH, DEFAULT_DIM, InputRecipe, check_given_keys, check_input_options,
                     id_limit_from_error, load_inputs, missing_inputs, parse_input_shapes, run_learning_id_limit,
                     signature_inputs)

# --------------------------------------------------------------------------------------------- SavedModels


@dataclasses.dataclass(frozen=True)
class SignatureRun:
    """One call of a signature on the inputs verify makes (the run check's call of the written copy).

    Attributes:
        interface: (input specs, output specs) of the signature called.
        arrays: the inputs it ran on ({input name: array}); sources: how each was made ("random" or "file").
        outputs: {output name: array}.
    """

    interface: tuple
    arrays: dict
    sources: dict
    outputs: dict


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

    @property
    def unvarying(self) -> list[OutputCheck]:
        """The checks that passed on an output that does not depend on the inputs fed (proving nothing)."""
        return [c for c in self.checks if c.passed and c.unvarying]

    @property
    def proved_nothing(self) -> bool:
        """True when every output passed but none depends on the inputs fed: a broken conversion would pass too."""
        return bool(self.checks) and self.passed and len(self.unvarying) == len(self.checks)

    @property
    def tolerance(self) -> str:
        """The tolerance as the lines say it: "rtol=R, atol=A (the P defaults)" or "... (as given)"."""
        where = f"the {self.precision} defaults" if self.defaults else "as given"
        return f"rtol={self.rtol:g}, atol={self.atol:g} ({where})"

    def summary(self) -> str:
        """One line: passed, failed or proved nothing, how many outputs, at which tolerance; then, where outputs
        do not depend on the inputs fed, which and what to do."""
        verdict = "passed" if self.passed else f"FAILED ({len(self.failures)} of {len(self.checks)} outputs)"
        if self.proved_nothing:
            verdict = "proved nothing"
        signatures = len({c.signature for c in self.checks})  # those that could not run count too
        line = (f"verification {verdict}: {_count(len(self.checks), 'output')} of "
                f"{_count(signatures, 'signature')} compared at {self.tolerance}")
        return line + (f"\n{self.unvarying_note()}" if self.unvarying else "")

    def unvarying_note(self) -> str:
        """What the outputs that do not depend on the inputs fed mean for the verdict, and what to do."""
        same = self.unvarying
        named = "; ".join(f"{c.signature}/{c.output}: {c.unvarying}" for c in same[:3]) + \
            (f"; and {len(same) - 3} more" if len(same) > 3 else "")
        which = "no output depends" if self.proved_nothing else \
            f"{len(same)} of {_count(len(self.checks), 'output')} {'does' if len(same) == 1 else 'do'} not depend"
        return (f"  {which} on the inputs fed ({named}): comparing them proves nothing, a broken conversion "
                "would match as well (a model of random weights whose activations die out does this); verify on "
                "inputs it depends on (--inputs FILE.npz) or a model with trained weights")


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


def function_identity(function) -> tuple:
    """A loaded signature's function as written, but for its name and the names its captured inputs were given
    (ids that differ per trace), with the captured tensors themselves: two signatures of one function (a Keras
    export's "serve" and "serving_default") have one identity, and on the same inputs give the same outputs, so
    each is called once. Its first call costs the most (TF's graph optimizers run over the whole graph, a frozen
    one's weights included: ~3 s for ResNet-50), and a twin would pay it again. An attr with no value, or another
    variable captured, still tells them apart."""
    return function_key(function.function_def), tuple(id(t) for t in function.captured_inputs)


def verify_saved_models(original, converted, *, signatures=None, inputs=None, batch_size: int = DEFAULT_BATCH,
                        seed: int = 0, rtol: float | None = None, atol: float | None = None,
                        precision: str | None = None, input_shapes: str | dict | None = None, dim: int = DEFAULT_DIM,
                        tag_set=None,
                        progress=None, converted_runs: dict | None = None, loaded=None) -> VerifyReport:
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
        converted_runs: {(tags key, signature key): SignatureRun} of the converted model, made on these same
            inputs (the run check of convert, which fills it through `on_run`; tags key: `tags_key(tags)`): those
            signatures are compared with the original's outputs on the run's inputs, without loading or calling
            the converted model; the others are run as usual.
        loaded: the original as `loaded_original(original, tag_set)` loaded it, shared by several verifications
            against it (`--tune`'s candidates): loaded once, each of its signatures called once per inputs; None:
            loaded here.

    Returns:
        A VerifyReport (report.passed tells whether every output is within the tolerance).

    Raises:
        ModelError: a model cannot be loaded or run, an unknown signature, unusable or missing inputs (every
            input that needs data is named).
        OptionError: a bad precision, tolerance, seed, shape or inputs file.
    """
    start = time.perf_counter()
    shapes = input_shapes if isinstance(input_shapes, dict) else parse_input_shapes(input_shapes)
    check_input_options(seed=seed, batch_size=batch_size, dim=dim, rtol=rtol, atol=atol)
    with contextlib.nullcontext(loaded) if loaded is not None else loaded_original(original, tag_set) as loaded:
        converted_graphs = read_saved_model(converted).meta_graphs
        if len(converted_graphs) == 1:  # a frozen conversion keeps one MetaGraph, with the tags it was made from
            converted_tags = load_tags(converted_graphs[0])
        else:
            converted_tags = loaded.tags
        precision = precision or detect_precision(converted)
        default_rtol, default_atol = default_tolerance(precision)
        defaults = rtol is None and atol is None
        rtol, atol = (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)
        path = isinstance(inputs, (str, bytes)) or hasattr(inputs, "__fspath__")
        recipe = InputRecipe(dict((load_inputs(inputs) if path else inputs) or {}), batch_size, dim, shapes, seed)
        runs = {key: run for (at, key), run in (converted_runs or {}).items() if at == tags_key(converted_tags)}
        reference = loaded.model
        keys = check_signature_keys(signatures, reference.signatures.keys(), "the original SavedModel") or \
            require_signatures(list(reference.signatures.keys()), original)
        specs = {k: reference.signatures[k].structured_input_signature[1] for k in keys}
        check_given_keys(recipe.given, specs)
        missing = missing_inputs(specs, recipe.given)
        if missing:
            raise ModelError(f"{len(missing)} input(s) need data that cannot be made up: {', '.join(missing)}; "
                             "give them in --inputs FILE.npz (keys: input names)")
        the_converted = _Converted(converted, converted_tags, runs)
        checks, sources = _compare(loaded, the_converted, keys, recipe, precision, rtol, atol, progress)
    return VerifyReport(str(original), str(converted), precision, rtol, atol, defaults, checks, sources,
                        time.perf_counter() - start)


@dataclasses.dataclass
class LoadedOriginal:
    """The original SavedModel as verify loads it (loaded_original), and what its signatures computed.

    Attributes:
        model: the loaded SavedModel (its signatures only are called).
        tags: the MetaGraph's tags it was loaded with (model.tags.load_tags).
        called: [(function_identity, inputs, outputs)] of each call so far (_run_once: a call on the same inputs
            is not made again).
    """

    model: object
    tags: object
    called: list = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def loaded_original(original, tag_set=None):
    """The original SavedModel at `original` loaded for verify_saved_models (a LoadedOriginal): without its
    saver's functions (loadable_copy), from the MetaGraph `tag_set` chooses.

    Raises:
        ModelError: it cannot be loaded, or no single MetaGraph matches.
    """
    from .frozen_function import remove_tree  # it imports TensorFlow: not when the CLI imports this module
    from .loadable_copy import loadable_copy
    source_model = read_saved_model(original)
    _, meta_graph = single_meta_graph(source_model, parse_tag_set(tag_set), "verifying")
    tags = load_tags(meta_graph)
    staging = loadable_copy(original, source_model)  # only its signatures are called: its saver is not needed
    try:
        yield LoadedOriginal(load_saved_model(staging or original, "original", tags, shown_as=original), tags)
    finally:
        remove_tree(staging)


def tags_key(tags) -> frozenset | None:
    """The key of a MetaGraph's `tags=` (model.tags.load_tags) in verify's converted_runs."""
    return frozenset(tags) if tags else None


def keeping_runs(runs: dict):
    """convert's `on_run` callable that keeps each call of its run check in `runs`, as verify's converted_runs."""
    def keep(tags, key: str, run: SignatureRun) -> None:
        runs[tags_key(tags), key] = run
    return keep


class _Converted:
    """The converted model's side of verify: a signature the run check called is its SignatureRun; the model is
    loaded only when some signature was not called yet."""

    def __init__(self, path, tags, runs: dict):
        self.path, self.tags, self.runs, self.loaded = path, tags, runs, None

    def signature(self, key: str):
        """The run check's SignatureRun for `key`, else the loaded signature's function, else None."""
        if key in self.runs:
            return self.runs[key]
        if self.loaded is None:
            self.loaded = load_saved_model(self.path, "converted", self.tags)
        return self.loaded.signatures[key] if key in self.loaded.signatures else None


def _compare(original: LoadedOriginal, converted: _Converted, keys, recipe, precision: str, rtol: float,
             atol: float, progress) -> tuple[list, dict]:
    """Run each signature of both models on the same inputs (a converted run's own, where the run check called
    it) and compare: (OutputCheck list, {signature: how its inputs were made})."""
    checks, sources, total = [], {}, 2 * len(keys)
    for i, key in enumerate(keys):
        ref_fn, got = original.model.signatures[key], converted.signature(key)
        if got is None:
            checks.append(OutputCheck(key, "*", (), "", passed=False, problem="signature missing in converted model"))
            continue
        ran = isinstance(got, SignatureRun)
        if _interface(ref_fn) != (got.interface if ran else _interface(got)):
            checks.append(OutputCheck(key, "*", (), "", passed=False, problem="signature inputs/outputs differ"))
            continue
        if ran:
            arrays, sources[key] = got.arrays, got.sources
            expected = _run_once(ref_fn, arrays, key, precision, original.called)
        else:
            arrays, sources[key], expected = _run_learning_id_range(ref_fn, _maker(key, ref_fn, recipe), key,
                                                                    precision)
        if progress is not None:
            progress(2 * i + 1, total, f"{key} (original)")
        outputs = got.outputs if ran else _run(got, arrays, "converted", key, precision)
        if progress is not None:
            progress(2 * i + 2, total, f"{key} (converted)")
        checks += compare_outputs(expected, outputs, rtol, atol, signature=key, inputs=arrays)
    return checks, sources


def _run_once(function, arrays: dict, key: str, precision: str, called: list) -> dict:
    """The original's outputs on `arrays`: a twin's (function_identity) when one ran on the same arrays (the run
    check hands a converted twin its twin's run, inputs included), else `function`'s, remembered in `called`."""
    identity = function_identity(function)
    for twin, inputs, outputs in called:
        if twin == identity and inputs.keys() == arrays.keys() and \
                all(np.array_equal(inputs[k], arrays[k]) for k in arrays):
            return outputs
    outputs = _run(function, arrays, "original", key, precision)
    called.append((identity, arrays, outputs))
    return outputs


def _maker(key: str, function, recipe: InputRecipe):
    """make(id_limit) -> (arrays, sources): a signature's inputs as the recipe says."""
    specs = function.structured_input_signature[1]
    return lambda limit: signature_inputs(key, specs, recipe.given, recipe.batch_size, recipe.seed,
                                          shapes=recipe.shapes, dim=recipe.dim, id_limit=limit)


def signature_run(function, key: str, given: dict, batch_size: int, seed: int, precision: str, *,
                  shapes: dict | None = None, dim: int = DEFAULT_DIM, which: str = "original") -> SignatureRun:
    """Call a signature once on the inputs verify makes for it: given, else made up, with integer ids inside the
    tables they index (learned by running `function`, the `which` model's signature: the original's, or the
    written copy's for the run check of convert).

    Raises:
        ModelError: an input cannot be made up, or `function` fails on every try.
    """
    recipe = InputRecipe(given, batch_size, dim, shapes or {}, seed)
    arrays, sources, outputs = _run_learning_id_range(function, _maker(key, function, recipe), key, precision,
                                                      which)
    return SignatureRun(_interface(function), arrays, sources, outputs)


def signature_feeds(function, key: str, given: dict, batch_size: int, seed: int, precision: str, *,
                    shapes: dict | None = None, dim: int = DEFAULT_DIM, which: str = "original") -> dict:
    """The inputs a signature runs on (signature_run's arrays)."""
    return signature_run(function, key, given, batch_size, seed, precision, shapes=shapes, dim=dim,
                         which=which).arrays


def _run_learning_id_range(function, made, key: str, precision: str, which: str = "original", tries: int = 4):
    """Run `function` (the `which` model's) on made-up inputs; when an id indexes past a table ("... is not in
    [0, N)"), draw the ids below N and run again. Returns (arrays, how they were made, outputs)."""
    def attempt(limit: int) -> tuple:
        arrays, sources = made(limit)
        return arrays, sources, _run(function, arrays, which, key, precision)
    _, result, error = run_learning_id_limit(attempt, ModelError, tries)
    if error is None:
        return result
    if id_limit_from_error(str(error)) is None:
        raise error
    raise ModelError(f"signature '{key}': could not find ids inside every table the inputs index; give the "
                     "integer inputs with --inputs FILE.npz")
