"""`convert_saved_model`: one orchestrator over two strategies -- rewrite in place (in_place.py) or freeze
(freeze.py) -- with the same named steps for both:

    check (options, source, output, tag-set, signatures) -> lock -> rewrite -> check patterns -> estimate -> write

Everything is checked before the first byte is written; the output appears only when complete and loadable
(model_dir.py); a failure says which step failed. The strategies do not import this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from ..analysis.flops import estimate_flops
from ..core.effects import effect_line, effects_policy, running_effects
from ..core.meta_graph import functions_to_rewrite
from ..core.options import Options, given_or_made
from ..core.pass_context import check_patterns_match, unmatched_patterns
from ..core.stand_ins import StandIns, meta_graph_without_effects
from ..errors import ModelError, MpRewriteError, OptionError, StageError
from ..model.files import read_saved_model
from ..model.keras_file import saved_model_of
from ..model.signatures import check_signature_keys, signature_keys
from ..model.tags import parse_tag_set, select_meta_graphs, single_meta_graph
from ..model.xla_modules import opaque_line, summary, xla_modules
from .freeze import freeze_saved_model, weights_form
from .frozen_function import remove_tree
from .in_place import rewrite_in_place
from .inputs import InputRecipe
from .keras_metadata import check_mode
from .measured_costs import measured_dim
from .model_dir import absolute_output, check_output, write_model_dir
from .output_lock import output_lock
from .result import ConversionResult, low_precision_counts
from .run_check import RunCheck, RunFailure
from .batch_split import split_lines
from .split_in_place import split_in_place
from .split_option import parse_split
from .source_check import check_source, check_written, check_written_attrs, node_names

WEIGHTS = ("keep", "low")


def convert_saved_model(source, output, precision: str = "float16", *, options: Options | None = None,
                        tag_set=None, signatures=None, device: str | None = None, lists=None,
                        lists_file: str | None = None, allow=(), infer=(), deny=(), clear=(), remove=(),
                        keep_fp32=(), force_low=(), level: str | None = None, emulate: bool | None = None,
                        assign: str = "lists", costs=None, weights: str = "keep", freeze: bool = False,
                        freeze_weights: str = "auto", split="off", keras_metadata: str = "keep",
                        overwrite: bool = False,
                        flops: bool = True, run_check: bool = True, run_inputs: InputRecipe | None = None,
                        allow_opaque_xla: bool = False, run_effects: bool | None = None, progress=None, on_note=None,
                        on_run=None) -> ConversionResult:
    """Convert a SavedModel to mixed precision: a new SavedModel with the same signatures (names, inputs, outputs,
    dtypes, shapes), variables, assets and object graph, whose functions compute in float16 or bfloat16.

    Args:
        source: the SavedModel directory (only read), or a Keras .keras / .h5 file (exported as model.export does).
        output: the new SavedModel directory; it appears only when complete.
        precision, device, lists, lists_file, allow, infer, deny, clear, remove, keep_fp32, force_low, level,
            emulate, assign, costs: the rewrite options (mp_rewrite.make_options; node-name patterns match nodes
            of function bodies); or
        options: an Options made once with make_options.
        tag_set: the MetaGraph to convert ("serve,gpu" or a set of tags); None: every MetaGraph (with freeze: the
            only one, or the only one tagged "serve").
        signatures: signature keys to convert (a str or several); None converts every signature and every function
            the object graph restores (what `tf.saved_model.load(...)` calls).
        weights: "keep" stores variables as they are (with freeze=True: every weight consumed only in low precision
            in low precision, one read in both precisions in both); "low" needs freeze=True and refuses a weight
            that is also read in float32 (ModelError naming it).
        freeze: an inference artifact (savedmodel/freeze.py): variables folded into constants, Grappler's constant
            folding and arithmetic optimizer, then the pass; only the signatures are kept.
        freeze_weights: with freeze, "constants" (weights folded into the graph), "variables" (weights kept as
            variables of the output, in low precision where only read so: models of any size) or "auto" (constants
            unless they pass protobuf's 2 GB limit).
        split: "off" (default), "auto" or a number of branches N >= 2: each signature's batch runs in N concurrent
            branches where that is proven to equal the whole call (with freeze, the frozen graph is called per slice:
            batch_split.py; in place, the signature's wrapper calls its rewritten body per slice, every function
            body unchanged: split_in_place.py); "auto" keeps it only where it measured faster here. A note per
            signature says what was chosen and how to serve it (also in the result's `split`).
        keras_metadata: "keep" or "drop" a tf_keras model's keras_metadata.pb (see keras_metadata.py).
        overwrite: replace an existing output (a SavedModel or an empty directory), once the new one is complete.
        flops: estimate the share of matmul/conv FLOPs in low precision (result.flops).
        run_check: call every signature of the written copy once before it is moved into place (run_check.py);
            False skips it (the copy is still loaded).
        run_inputs: how the run check makes inputs (inputs.input_recipe: --inputs, --batch-size, --seq-len,
            --input-shapes, --seed); None: every input made up with the defaults.
        allow_opaque_xla: write a model that computes in XlaCallModule ops (a jax2tf / Keras 3 JAX export), whose
            StableHLO the pass cannot see into, with those ops unchanged (a note says so); False refuses it.
        run_effects: what the conversion runs to measure and check the model (the costs, the run check) performs
            the ops of its signatures that write files, save checkpoints or write summaries (core.effects); False
            runs copies in which they do nothing (a note names them); None: as the effects policy in force says
            (core.effects.running_effects; default False). The written model keeps them either way.
        progress: optional callable (done, total, name), after each function body (or frozen signature).
        on_note: optional callable(str) for one-line notes made before the result (a Keras file was exported).
        on_run: optional callable(tags, key, verify.SignatureRun) for each signature the run check called (what
            `convert --verify` compares, instead of loading and calling the written copy again).

    Returns:
        A ConversionResult.

    Raises:
        OptionError, ListError: bad options. ModelError: bad source or output, unknown tag-set or signature, a
        model TensorFlow cannot load (freeze), a written copy that does not load or whose signature fails to run
        (the line says whether the source runs it), write failure, XlaCallModule ops without allow_opaque_xla.
        GraphError, StageError: a graph the pass cannot
        handle. Nothing is written on any error.
    """
    start = time.perf_counter()
    options = given_or_made(options, precision, device=device, lists=lists, keep_fp32=keep_fp32,
                            force_low=force_low, level=level, emulate=emulate, lists_file=lists_file, allow=allow,
                            infer=infer, deny=deny, clear=clear, remove=remove, assign=assign, costs=costs)
    check_modes(weights, freeze, keras_metadata)
    split = parse_split(split)
    tags = parse_tag_set(tag_set)
    run = effects_policy().run if run_effects is None else run_effects
    with saved_model_of(source, on_note) as source_path, running_effects(run, effects_policy().on_note):
        # The lock is held from the output check to the rename, so that no other run interleaves with this one.
        with output_lock(absolute_output(output)):
            source_dir, output_dir, saved_model, keys = check_conversion(source_path, output, tags, signatures,
                                                                         freeze, overwrite, options, freeze_weights,
                                                                         allow_opaque_xla)
            opaque = opaque_modules(saved_model, tags, keys, freeze)
            effects = conversion_effects(saved_model, tags, keys, freeze)
            fallback = []
            for with_rules in (True, False):  # a copy the rules broke is written again without them
                here = options if with_rules else dataclasses.replace(options, rules=False)
                with _step("rewrite"):
                    if freeze:
                        rewritten = freeze_saved_model(source_dir, saved_model, here, keys, tags, progress,
                                                       weights=weights, freeze_weights=freeze_weights, output=output,
                                                       split=split, dim=measured_dim(here, run_inputs))
                    else:
                        rewritten = rewrite_in_place(source_dir, saved_model, here, keys, tags, progress,
                                                     keras_metadata=keras_metadata, output=output)
                        rewritten = split_in_place(rewritten, split, tags, measured_dim(here, run_inputs),
                                                   progress=progress)
                try:
                    _say_vanished(here, rewritten.node_names, on_note)
                    check_written_attrs(rewritten.saved_model)  # what TF would load, then fail to run
                    with _step("estimate"):
                        share, per_function, per_graph = estimate_flops(rewritten.graphs) if flops else (None, {}, {})
                    runs = RunCheck(source_dir, saved_model, run_inputs, here.precision, here.device, on_run=on_run)
                    counted = []

                    def check(written):  # on the complete copy, before it is moved into place
                        if effects.stands or run:  # else no copy without its effects can be loaded and run
                            check_written(source_dir, saved_model, written, rewritten.saved_model,
                                          runs if run_check else None)
                        counted.append(low_precision_counts(read_saved_model(written), here.precision))
                    write_model_dir(rewritten.files, output_dir, rewritten.saved_model, overwrite,
                                    drop=rewritten.drop, check=check)
                    break
                except RunFailure as failure:
                    if not (with_rules and failure.ours and not freeze and _rules_applied(rewritten)):
                        raise
                    fallback.append(f"the graph rules were left out of this conversion: with them the written copy "
                                    f"failed where the source runs ({failure.what}); converted without them")
                finally:
                    remove_tree(rewritten.staging)
    # The summary says what the copy holds, not what the rewrite recorded: a save that drops something shows.
    own = low_precision_counts(saved_model, options.precision)
    return ConversionResult(str(source), str(output), options.precision, options.device, rewritten.keys,
                            rewritten.graphs, rewritten.skipped, share, per_function, per_graph,
                            time.perf_counter() - start, frozen=freeze,
                            notes=fallback + rewritten.notes + runs.notes + _opaque_notes(opaque) +
                            effects_note(effects, run),
                            ran=tuple(runs.ran) if run_check else None,
                            written=tuple(max(0, w - o) for w, o in zip(counted[0], own)), opaque=tuple(opaque),
                            split=rewritten.split or tuple(split_lines(rewritten.graphs)))


def _rules_applied(rewritten) -> bool:
    """Whether a graph rule rewrote any graph of the conversion."""
    return any(record.applied for graph in rewritten.graphs.values()
               for body in [graph, *graph.functions.values()] for record in getattr(body, "rules", []))


def check_modes(weights: str, freeze: bool, keras_metadata: str) -> None:
    """The conversion's own options (the rewrite's are checked by make_options).

    Raises:
        OptionError: an unknown weights or keras_metadata mode; weights="low" without freeze.
    """
    if weights not in WEIGHTS:
        raise OptionError(f"unknown weights mode {weights!r}: use 'keep' or 'low'")
    if weights == "low" and not freeze:
        raise OptionError("--weights low needs --freeze: variables stay float32 in a SavedModel that keeps them; "
                          "with --freeze, weights consumed only in low precision are stored in low precision")
    check_mode(keras_metadata)


def check_conversion(source, output, tag_set=None, signatures=None, freeze: bool = False, overwrite: bool = False,
                     options: Options | None = None, freeze_weights: str = "auto", allow_opaque_xla: bool = False):
    """The check step: the source (files, variables, references), the output path, the tag-set, the signature
    keys, that no XlaCallModule hides the computation (unless `allow_opaque_xla`) and (given `options`) that every
    keep_fp32/force_low pattern names a node of what would be rewritten, without rewriting anything. Front ends with
    slow work of their own (the guard, --tune) call it first.

    Returns:
        (source directory, output directory, the source's SavedModel proto, the signature keys or None).

    Raises:
        ModelError, GraphError: as convert_saved_model would, before it writes.
    """
    source_dir, output_dir = check_output(source, output, overwrite)
    saved_model = read_saved_model(source_dir)
    check_source(source_dir, saved_model)
    tags = parse_tag_set(tag_set) if not isinstance(tag_set, frozenset) else tag_set
    chosen = [single_meta_graph(saved_model, tags, "--freeze")] if freeze else select_meta_graphs(saved_model, tags)
    keys = check_signature_keys(signatures, signature_keys(m for _, m in chosen))
    if freeze:
        weights_form(source_dir, freeze_weights)  # a form that cannot hold the weights is refused now
    opaque = [] if allow_opaque_xla else opaque_modules(saved_model, tags, keys, freeze)
    if opaque:
        precision = options.precision if options is not None else "float16"
        raise ModelError(f"{opaque_line(opaque, precision)}. Nothing was written; --allow-opaque-xla writes the "
                         "model with these ops unchanged")
    if options is not None:
        functions = {name for _, m in chosen for name in functions_to_rewrite(m, keys)}
        names = node_names(saved_model, functions)
        for option in ("keep_fp32", "force_low"):
            check_patterns_match(getattr(options, option), option, names)
    return source_dir, output_dir, saved_model, keys


def _say_vanished(options, names, on_note) -> None:
    """One note per option for the keep_fp32/force_low patterns (checked against the source before anything was
    done) that match nothing in what was written: freezing folded their nodes into constants, or a rule fused them
    (the accuracy guard's patterns name nodes of the graph before either). Nothing of them is left to keep."""
    if on_note is None:
        return
    names = list(names)
    for option in ("keep_fp32", "force_low"):
        gone = unmatched_patterns(getattr(options, option), option, names)
        if gone:
            more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
            on_note(f"--{option.replace('_', '-')} {gone[0]!r}{more}: their nodes were folded into constants or "
                    "fused by the conversion, so nothing of them is left to keep")


def opaque_modules(saved_model, tags, keys, freeze: bool) -> list:
    """The XlaCallModule ops (model/xla_modules.py) of the main graphs and the functions a conversion rewrites."""
    chosen = [single_meta_graph(saved_model, tags, "--freeze")] if freeze else select_meta_graphs(saved_model, tags)
    return [m for _, meta_graph in chosen
            for m in xla_modules(meta_graph.graph_def, functions_to_rewrite(meta_graph, keys))]


def conversion_effects(saved_model, tags, keys, freeze: bool):
    """The StandIns of the MetaGraphs a conversion reads (core.stand_ins): the effects of what their signatures
    (`keys`, else all) and their loading run, and whether a copy without them stands for the model."""
    chosen = [single_meta_graph(saved_model, tags, "--freeze")] if freeze else select_meta_graphs(saved_model, tags)
    found = [meta_graph_without_effects(meta_graph, keys)[1] for _, meta_graph in chosen]
    return StandIns(sum((s.effects for s in found), ()), sum((s.blocked for s in found), ()))


def effects_note(stand_ins, run: bool) -> list[str]:
    """The line that names the model's effects and says how the conversion decided without performing them."""
    if not stand_ins.effects:
        return []
    line = effect_line(stand_ins.effects)
    if run:
        return [f"{line}: run during conversion, as asked (--run-effects)"]
    if not stand_ins.stands:
        return [f"{line}: not run during conversion: {stand_ins.blocked[0]}, so no copy without them stands for the "
                "model; the costs came from the op table and the written copy was not loaded or run before it was "
                "moved into place (--run-effects runs the model as it is)"]
    return [f"{line}: not run during conversion: what it ran to measure and check the model (the costs, the run "
            "check, --verify, --guard, --tune) was a copy in which these ops do nothing; the written model keeps them "
            "(--run-effects runs them)"]


def _opaque_notes(modules) -> list[str]:
    if not modules:
        return []
    return [f"written unchanged (--allow-opaque-xla): {summary(modules)}, serialized StableHLO this pass cannot "
            "see into; their work stays in the precision it was exported in"]


@contextlib.contextmanager
def _step(name: str):
    """Name the step in an error that does not already say where it happened."""
    try:
        yield
    except StageError:
        raise  # names its stage and node
    except MpRewriteError as e:
        raise type(e)(f"{name} step: {e}") from e
