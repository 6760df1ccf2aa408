"""The frozen strategy of `convert` (`--freeze`): an inference SavedModel whose signatures run frozen, folded,
mixed precision graphs.

For each signature (frozen_signature.py): TensorFlow's variable folding turns the variables it reads into
constants; Grappler's constant folding and arithmetic optimizer fold what that makes foldable; per-channel scales
and shifts after a convolution or matmul (BatchNormalization) are folded into its filter and bias, and the patterns
TensorFlow's remapper fuses (MatMul/Conv + BiasAdd + activation, GELU) are written the way it sees them (rules/); the
pass rewrites the frozen graph with the conversion's Options (patterns widened to the inlined names); the Casts it
puts after constants are folded, so a weight consumed only in low precision is stored in low precision (cast
offline, not at every run; the file is about half the size). Each signature is written back with its name, input
names, output keys, dtypes and shapes, as a `tf.function` of a module that holds no variables, only the lookup
tables the signatures read (frozen_function.py). The output keeps the source's other files (assets.extra, with TF
Serving's warm-up requests) and its MetaGraph's tags.

What freezing drops, by design (an inference artifact): variables (and so training and fine-tuning), the restored
Keras objects and any other function or attribute of the original object graph; only the signatures remain.
"""

from __future__ import annotations

import dataclasses
import gc
import pathlib
import shutil
import tempfile

from ..analysis.grappler import FOLDING, optimize_graph
from ..analysis.graph_profile import PROFILE_LIMIT
from ..core.assignment import SOURCE
from ..core.rewrite import rewrite_graph_def
from ..core.stand_ins import with_effects_restored
from ..errors import ModelError, OptionError
from ..model.files import MODEL_FILES, read_saved_model
from ..model.runtime import load_saved_model
from ..model.signatures import require_signatures
from ..model.tags import load_tags, single_meta_graph
from ..rules import canonicalize, check_weights_low, fold_constant_casts
from .batch_dispatch import dispatched
from .batch_split import split_lines, split_signature
from .function_names import canonical_names
from .frozen_function import compact, prune, remove_tree
from .frozen_signature import freeze_signature, inlined_patterns, name_suffixes, traced_identity
from .keras_metadata import METADATA_FILE
from .loadable_copy import loadable_copy
from .inputs import DEFAULT_DIM
from .measured_costs import frozen_costs
from .model_dir import FINGERPRINT_FILE
from .result import Rewritten
from .variable_weights import lower_variable_reads, stored_variables

DROPPED = ("trainable variables (the model can no longer be trained or fine-tuned)",
           "the restored Keras objects and every function or attribute of the object graph other than the signatures")
# protobuf refuses to serialize a message over 2 GB, and the frozen float32 graph goes through Grappler (serialized)
# before its weights are halved: weights above this size cannot be frozen into graph constants.
GRAPH_LIMIT = 2**31 - 2**26
WEIGHT_FORMS = ("auto", "constants", "variables")
# What the saver writes for the frozen module; everything else of the source's directory is copied over.
WRITTEN = (*MODEL_FILES, "variables", "assets", FINGERPRINT_FILE, METADATA_FILE)


def freeze_saved_model(source_dir, saved_model, options, keys=None, tag_set=None, progress=None, *,
                       weights: str = "keep", freeze_weights: str = "auto", output=None, split="off",
                       dim: int = DEFAULT_DIM) -> Rewritten:
    """Freeze, fold and rewrite every signature (or `keys`) of the MetaGraph tagged `tag_set` (else the only one,
    or the only "serve" one) into a new SavedModel in a temporary directory.

    Raises:
        ModelError: several MetaGraphs and no tag_set; the model does not load; it has no signature; a signature
            changes state or cannot be frozen; TensorFlow cannot save the result.

    `split` ("off", "auto" or N: split_option.parse_split) runs each signature's batch in N concurrent branches
    where that is proven equal (and, for "auto", measured faster, an unknown length timed at `dim`: --seq-len); a
    note per signature says what was chosen.
    """
    import tensorflow as tf

    _, meta_graph = single_meta_graph(saved_model, tag_set, "--freeze")
    tags = load_tags(meta_graph)
    form, why = weights_form(source_dir, freeze_weights)
    staging = loadable_copy(source_dir, saved_model)
    try:  # kept until saved: the assets of a restored table are copied from where it was loaded
        # What is traced here is written: only what loading runs is stood in for, and given back once saved.
        loaded = load_saved_model(staging or source_dir, "source", tags, shown_as=source_dir, to_write=True)
        module, functions, graphs, names = _frozen_module(loaded, source_dir, keys, options, progress, weights,
                                                          form == "variables", split, dim)
        frozen_keys = tuple(functions)
        directory = tempfile.mkdtemp(prefix="mp_rewrite-frozen-")
        # An inference artifact needs no gradients; saving custom gradients (Keras' swish) fails on frozen graphs.
        save_options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
        try:
            tf.saved_model.save(module, directory, options=save_options,
                                signatures={k: f.get_concrete_function() for k, f in functions.items()})
            new = with_effects_restored(_with_source_files(directory, source_dir, tags))
            canonical_names(new)  # the same conversion writes the same bytes, whatever this process traced before
        except (ValueError, TypeError, OSError, tf.errors.OpError) as e:
            remove_tree(directory)
            raise ModelError(f"TensorFlow cannot save the frozen signatures: {str(e).splitlines()[0]}") from None
    finally:
        remove_tree(staging)
        # The source's weights go before the written copy is loaded to be checked: peak memory is the source and
        # its low-precision copy, not both models and a third.
        loaded = module = functions = None
        gc.collect()
    note = (f"frozen inference model, {why}: every signature is kept; dropped: {'; '.join(DROPPED)}. Load it with "
            f"tf.saved_model.load('{output}'{f', tags={tags}' if tags and tags != ['serve'] else ''})")
    return Rewritten(new, pathlib.Path(directory), graphs, {}, names, frozen_keys, notes=[note, *split_lines(graphs)],
                     staging=directory)


def weights_form(source_dir, form: str = "auto", limit: int | None = None) -> tuple[str, str]:
    """How the frozen model keeps its weights: ("constants" | "variables", why), before any work is done.

    "auto" keeps them as graph constants unless the source's weights pass protobuf's 2 GB limit on one graph;
    then (and with "variables") they stay variables of the output, stored in low precision where only read so.

    Raises:
        OptionError: an unknown form.
    """
    if form not in WEIGHT_FORMS:
        raise OptionError(f"unknown frozen weights form {form!r}: use one of {', '.join(WEIGHT_FORMS)}")
    data = pathlib.Path(source_dir) / "variables"
    size = sum(f.stat().st_size for f in data.glob("variables.data-*")) if data.is_dir() else 0
    too_big = size > (GRAPH_LIMIT if limit is None else limit)
    if form == "constants" and too_big:
        raise ModelError(f"--freeze-weights constants cannot hold this model's {size / 1e9:.1f} GB of weights in "
                         "one graph (protobuf's 2 GB limit); use --freeze-weights variables (or auto); nothing was "
                         "written")
    if form == "variables" or (form == "auto" and too_big):
        why = "as asked" if form == "variables" else f"{size / 1e9:.1f} GB of weights pass protobuf's 2 GB limit"
        return "variables", f"weights kept as variables of the output ({why})"
    return "constants", "weights folded into graph constants"


def _with_source_files(directory: str, source_dir, tags) -> object:
    """Give the saved model the source's other files (assets.extra, ...) and its MetaGraph's tags; return its
    proto."""
    source = pathlib.Path(source_dir)
    for entry in source.iterdir():
        if entry.name not in WRITTEN:
            target = pathlib.Path(directory) / entry.name
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, target)
    new = read_saved_model(directory)
    if tags:
        del new.meta_graphs[0].meta_info_def.tags[:]
        new.meta_graphs[0].meta_info_def.tags.extend(tags)
    return new


def _frozen_module(loaded, source_dir, keys, options, progress, weights: str, keep_variables: bool, split="off",
                   dim: int = DEFAULT_DIM):
    """(a module tracking the frozen functions and the tables they read, {key: function}, {label: RewriteResult},
    the names of the frozen graphs' nodes and every suffix of them)."""
    import tensorflow as tf

    chosen = list(keys or require_signatures(loaded.signatures.keys(), source_dir))
    options = dataclasses.replace(options, keep_fp32=inlined_patterns(options.keep_fp32),
                                  force_low=inlined_patterns(options.force_low))
    module, results, names = tf.Module(), {}, set()
    functions, seen, traced, module.resources = {}, {}, {}, []
    for done, key in enumerate(chosen, 1):
        signature = loaded.signatures[key]
        # Signatures of one function (Keras exports "serve" and "serving_default") are frozen once and share one
        # graph, so the work is done and the weights are stored once.
        same = traced.setdefault(traced_identity(signature), key)
        if same != key:
            functions[key] = functions[same]
            results[f"signature {key} (frozen)"] = results[f"signature {same} (frozen)"]
        else:
            def say(what, done=done, key=key):  # a stage of this signature's split, on the progress bar
                if progress is not None:
                    progress(done - 1, len(chosen), f"{key}: {what}")
            function, result, identity = _frozen_signature(loaded, key, options, weights, module.resources, names,
                                                           keep_variables, split, say, dim)
            functions[key] = seen.setdefault(identity, function)
            results[f"signature {key} (frozen)"] = result
        if progress is not None:
            progress(done, len(chosen), key)
    module.frozen = functions  # tracked, so the functions' graphs (and constants) are saved with the module
    return module, functions, results, name_suffixes(names)


def _keep_fused(options, records, present: set, names: set):
    """The options with what is left of every rewrite whose covered nodes a keep_fp32 pattern names kept in float32
    too: a LayerNorm the accuracy guard keeps is one `_MklLayerNorm` after the rules, under its output's name. The
    covered nodes join `names` (the names a conversion reports as converted)."""
    from ..core.pass_context import compile_patterns
    applied = [r for r in records if r.applied]
    names.update(node for r in applied for node in r.nodes)
    if not options.keep_fp32 or not applied:
        return options
    keeps = compile_patterns(options.keep_fp32, "keep_fp32")
    # What a rewrite covered and left under its name (a LayerNorm's output, a residual's sum, the contraction).
    left = dict.fromkeys(node for r in applied if any(map(keeps, r.nodes)) for node in r.nodes
                         if node in present and not keeps(node))
    if not left:
        return options
    return dataclasses.replace(options, keep_fp32=tuple(options.keep_fp32) + tuple(f"={node}" for node in left))


def _frozen_signature(loaded, key: str, options, weights: str, resources: list, names: set, keep_variables: bool,
                      split="off", say=lambda what: None, dim: int = DEFAULT_DIM):
    """(a tf.function with the signature's interface running the rewritten frozen graph, its RewriteResult, a key
    equal for signatures whose frozen graphs and interfaces are the same). The resources it captures (tables, and
    kept variables) are appended to `resources`, which the saved module tracks; its node names to `names`; what
    its batch split became (split_verdict.SplitChoice) to the result, as `split`; `say` is told each stage of it;
    `dim` is the length its timing gives an unknown input dimension after the batch."""
    frozen = freeze_signature(loaded, key, keep_variables)
    fetches = frozen.fetches
    # BatchNorms folded into their convolutions, and the patterns TF's remapper fuses written the way it sees them.
    shapes = {name: variable.shape.as_list() for name, variable in frozen.variables.items()}
    given = optimize_graph(frozen.graph_def, fetches, FOLDING)
    folded, records = canonicalize(given, fetches, shapes=shapes)
    folded = prune(folded, fetches)
    # Without the rules, raced beside them where the graph is measured (a copy of the weights held meanwhile).
    given = prune(given, fetches) if given.ByteSize() <= PROFILE_LIMIT else None
    # The placeholders the signature's arguments (and captures) feed keep their dtypes, like Grappler's feeds.
    fed = {name.split(":")[0]: "fed by the signature" for name in [*(n for _, n in frozen.inputs),
                                                                   *(n for n, _ in frozen.captured), *frozen.variables]}
    covered = set()
    options = _keep_fused(options, records, {node.name for node in folded.node}, covered)
    machine = options  # the machine's costs (--batch-size, --seq-len), before this graph's replace them
    options = frozen_costs(options, folded, frozen, fetches, fed, source=given)
    if getattr(options.costs, "keep", "") == SOURCE:  # the graph as folded, without the rules, ran fastest
        folded, records, covered = given, [], set()
    del given
    names.update(node.name for node in folded.node)
    names.update(covered)
    result = rewrite_graph_def(folded, fetches=fetches, preserve=fed, options=options)
    result.rules = records
    captured = list(frozen.captured)
    if frozen.variables:
        lowered = lower_variable_reads(result.graph_def, frozen.variables, key, weights)
        captured += [(f"{name}:0", variable) for name, variable in stored_variables(frozen.variables, lowered).items()]
    elif weights == "low":
        check_weights_low(result.graph_def, key)
    resources.extend(owner for _, owner in captured if all(owner is not r for r in resources))
    result.graph_def = compact(fold_constant_casts(result.graph_def, fetches)[0], fetches)
    function, result.split = split_signature(result.graph_def, frozen, captured, split, exact=not result.retyped,
                                             say=say, dim=dim)
    # Where float32 and the low precision each won at some batch: both, dispatched on the batch (batch_dispatch.py).
    function, result = dispatched(function, result, folded, frozen, captured, options, machine, weights, split)
    kept = result.dispatch.segments if result.dispatch is not None and result.dispatch.kept else ()
    identity = (result.graph_def.SerializeToString(deterministic=True), repr(frozen.inputs),
                repr(sorted(frozen.outputs.items())), result.split.branches, result.split.least, result.split.rows,
                kept, *(id(owner) for _, owner in captured))
    return function, result, identity
