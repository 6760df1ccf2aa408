"""`convert --split auto|N` in place, and the split of a written model (`--tune --split`): each TF2 signature's wrapper
function calls its body once per slice of the batch (split_wrapper.py), where that is proven and checked as the
frozen split is (batch_split.py):

1. proven: the batch-rows analysis (analysis/batch_rows.py) runs on the frozen, folded graph of the same signature
   of the converted model (frozen here only to be analysed; the written model keeps its functions and variables);
2. checked: the converted model and its split copy (both loaded, as written) are called on the same random inputs,
   at an odd batch split unevenly and at a batch smaller than N (run whole), as batch_split.mixed_samples checks
   the frozen split;
3. for "auto", timed: the whole and the split signature interleaved at batch 8 and 32, in this process and in the
   other serving setting (split_timing.py), kept only if faster beyond the noise at both batches in one setting
   and not slower in the other (split_verdict.split_verdict).

Batch 1 is decided apart (in `convert`, not in `--tune --split`): the wrapper routes one sample to the token rows of
the function it calls (rows_in_place.py), where the plan exists, the copy equals the whole call at batch 1 and 3 but
for round-off and, for "auto", it measured faster at batch 1 (batch_split.decided_rows, as frozen).

A refusal or a failed check leaves the signature whole, with the reason in the line. Every function the pass
rewrote is written as it was (the split only wraps the signature, and adds the rows' copy of the function beside
it): `--assign lists` stays Grappler's, node for node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path

from ..analysis.grappler import FOLDING, optimize_graph
from ..analysis.profile_cache import graph_bytes
from ..errors import GraphError, ModelError, tf_reason
from ..model.files import read_saved_model
from ..model.runtime import LINKED, load_saved_model
from ..model.signatures import signature_keys
from ..model.tags import load_tags, select_meta_graphs
from .batch_split import (SHAPE_OTHER, analysed, chosen_split, decided_rows, failed_check, mixed_samples,
                          split_candidates)
from .row_choice import ROW_PARTS, RowChoice, rows_least, with_rows
from .rows_in_place import rows_body
from .frozen_function import remove_tree
from .freeze import weights_form
from .frozen_signature import freeze_signature
from .model_dir import serialize, write_model_dir
from .inputs import DEFAULT_DIM
from .split_option import SERVE
from .split_timing import SETTINGS, learned_specs
from .split_verdict import SplitChoice
from .split_wrapper import output_shapes, signature_wrapper, split_wrapper


WHOLE_AS_CHOSEN = "as chosen for the function it calls"


def split_in_place(rewritten, split, tag_set=None, dim: int = DEFAULT_DIM, progress=None):
    """The in-place strategy's Rewritten with its signatures split (split_signatures; `dim`: the length "auto"
    times an unknown input dimension after the batch at, --seq-len; `progress`: told each wrapper's stages, as
    convert_saved_model's), the lines in its notes and in `split`."""
    if split == "off":
        return rewritten
    exact = not any(r.retyped or r.emulated for graph in rewritten.graphs.values()
                    for r in (graph, *graph.functions.values()))  # batch 1's rows then agree to float32's round-off
    saved_model, lines = split_signatures(rewritten.files, rewritten.saved_model, rewritten.keys, split, tag_set,
                                          dim, exact, progress)
    return dataclasses.replace(rewritten, saved_model=saved_model, notes=[*rewritten.notes, *lines],
                               split=tuple(lines))


def split_written(directory, target, split, tag_set=None, exact: bool | None = None,
                  rows=None) -> tuple[bool, list[str]]:
    """Split the signatures of the SavedModel at `directory` (a converted model) into a new one at `target`
    (`exact` and `rows` as split_signatures takes them).

    Returns:
        (whether any signature was split -- else nothing is written --, the lines saying what each became).
    """
    saved_model = read_saved_model(directory)
    new, lines = split_signatures(Path(directory), saved_model, None, split, tag_set, exact=exact, rows=rows)
    if new is saved_model:
        return False, lines
    write_model_dir(Path(directory), Path(target), new)
    return True, lines


def split_signatures(files, saved_model, keys, split, tag_set=None, dim: int = DEFAULT_DIM,
                     exact: bool | None = None, progress=None, rows=None) -> tuple[object, list]:
    """(the SavedModel with each signature of `keys` (None: all) split where proven, checked and, for "auto",
    measured faster; one line per signature wrapper: what it became and why). The proto is returned as given where
    nothing is split; else a copy.

    Args:
        files: the directory whose variables and assets go with `saved_model` (it is loaded from a copy linking them).
        split: "auto" or N (split_option.parse_split).
        dim: the length "auto" times an unknown input dimension after the batch at.
        exact: the model computes in float32 (its token rows at batch 1 are then checked to float32's round-off);
            None: batch 1 runs whole.
        progress: None, or a callable (done, total, what) told each wrapper's stages (the timing, on a progress bar).
        rows: batch 1's token rows asked apart from the batch ("auto" or N), `split` then being the branches the
            batch was already chosen to run in (1: whole; `--tune --split` races the batch split itself); None: as
            `split`.
    """
    rows = split if rows is None else rows
    chosen = select_meta_graphs(saved_model, tag_set)
    if len(chosen) != 1:
        return saved_model, [f"not split: the SavedModel has {len(chosen)} MetaGraphs; choose one with --tag-set"]
    index, meta_graph = chosen[0]
    wrappers, lines = {}, []
    for key in keys or signature_keys([meta_graph]):
        try:
            wrapper, positions = signature_wrapper(meta_graph, key)
        except ModelError as e:
            lines.append(f"signature {key}: not split: {e}")
            continue
        wrappers.setdefault(wrapper, []).append((key, positions))
    if not wrappers:
        return saved_model, lines
    split_any, said, decided = False, {}, {}
    with contextlib.ExitStack() as stack:
        original = stack.enter_context(_staged(files, saved_model))  # loaded here, timed as the whole model
        loaded = load_saved_model(original, "converted", load_tags(meta_graph))
        for done, (wrapper, entries) in enumerate(wrappers.items()):
            def say(what, done=done, key=entries[0][0]):  # a stage of this wrapper's split, on the progress bar
                if progress is not None:
                    progress(done, len(wrappers), f"{key}: {what}")

            # Wrappers of one body (Keras' "serve" and "serving_default") are analysed and timed once, split alike
            # (each split copy still checked).
            earlier = decided.get(_callees(meta_graph, wrapper))
            if earlier is not None and earlier.branches == earlier.rows == 1:
                made, choice = meta_graph, earlier
            else:
                asked = (earlier.branches, earlier.least, earlier.rows) if earlier else (split, 0, 0)
                made, choice = _split_one(files, saved_model, index, meta_graph, (original, loaded), wrapper,
                                          entries, asked, stack, dim, (exact, rows_least(rows, dim), rows), say)
                same = earlier is not None and (choice.branches, choice.rows) == (earlier.branches, earlier.rows)
                choice = earlier if same else choice
            decided.setdefault(_callees(meta_graph, wrapper), choice)
            meta_graph, split_any = made, split_any or choice.branches > 1 or choice.rows > 1
            said.setdefault(choice.why, []).extend(key for key, _ in entries)
    lines += [f"{', '.join(f'signature {key}' for key in keys)}: {why}" for why, keys in said.items()]
    return (_with_meta_graph(saved_model, index, meta_graph) if split_any else saved_model), lines


def _split_one(files, saved_model, index, meta_graph, staged_original, wrapper, entries, asked, stack, dim: int,
               rows_asked: tuple, say=lambda what: None):
    """(the MetaGraph with `wrapper` split or as it was, the SplitChoice) for the signatures `entries` [(key,
    {input: argument position})] that call it; `staged_original` is (the directory `saved_model` was staged in, its
    loaded copy); `asked` is (split: "auto" or N, the smallest batch split where N is given: SplitChoice.least,
    batch 1's token-row branches where an earlier wrapper of the same body chose them, else 0: decided here);
    `dim` the length "auto" times at; `rows_asked` (the model computes in float32, None: batch 1 is not split; the
    fewest tokens a sample of an unknown length needs to run in rows, row_choice.rows_least; what batch 1's rows
    ask, "auto" or N); `say` is told each stage that takes a while."""
    import tensorflow as tf

    original, loaded = staged_original
    key, positions = entries[0]
    signature = loaded.signatures[key]
    given = signature.structured_input_signature[1]
    names = sorted(given)
    whole = _positional(signature, names)
    specs = learned_specs(whole, [tf.TensorSpec(given[name].shape, given[name].dtype, name=name) for name in names],
                          dim)
    carried, why = _carried(loaded, key, positions, files, meta_graph, wrapper)
    # Refused, or its batch whole as chosen before: by an earlier wrapper of the same body, or by --tune's race.
    if why or asked[0] == 1:
        made, choice = meta_graph, SplitChoice(1, f"not split: {why or WHOLE_AS_CHOSEN}")
    else:
        made, choice = _batches(files, saved_model, index, meta_graph, (original, whole, specs, names), wrapper,
                                (key, carried), asked[:2], stack, dim, say)
    exact, least, rows = rows_asked
    if exact is None or asked[2] == 1:
        return made, choice
    return _rows(files, saved_model, index, meta_graph, (original, whole, specs, names), wrapper, entries[0],
                 (made, choice, carried or []), (asked[2] or rows, exact, least), stack, dim, say)


def _batches(files, saved_model, index, meta_graph, called, wrapper, signature, asked, stack, dim: int, say):
    """(the MetaGraph with `wrapper`'s batch split or as it was, the SplitChoice): `called` is (the directory the
    converted model was staged in, its signature called whole, its TensorSpecs, their names in order), `signature`
    (its key, per wrapper argument whether it carries the batch), `asked` (split, least) as _split_one's."""
    import tensorflow as tf

    original, whole, specs, names = called
    key, carried = signature
    split, least = asked
    candidates, functions, staged = {}, {}, {}
    for n in split_candidates(split):
        candidates[n] = split_wrapper(meta_graph, wrapper, carried, n, output_shapes(meta_graph, key))
        staged[n] = stack.enter_context(_staged(files, _with_meta_graph(saved_model, index, candidates[n])))
        try:
            functions[n] = _positional(load_saved_model(staged[n], f"split in {n}", load_tags(meta_graph))
                                       .signatures[key], names)
            unequal = mixed_samples(whole, functions[n], specs, n)
        except ModelError as e:  # our bug, said in the line rather than failing the conversion
            unequal = (f"the copy split in {n} did not load ({tf_reason(e)}); this is a bug of mp-rewrite, please "
                       "report it with the model")
        except tf.errors.OpError as e:  # the model's own failure on the made-up inputs, or the split's
            unequal = failed_check(whole, specs, dim, e)
        if unequal:
            return meta_graph, SplitChoice(1, f"not split: {unequal}")
    if split != "auto":
        written = split_wrapper(meta_graph, wrapper, carried, split, output_shapes(meta_graph, key), least) \
            if least else candidates[split]
        return written, SplitChoice(split, f"split in {split} branches, as asked; {SERVE}", least=least)
    tags = load_tags(meta_graph)
    places = {1: (original, key, tags), **{n: (staged[n], key, tags) for n in candidates}}
    graph = graph_bytes(meta_graph.graph_def) + f"\0{key}\0{wrapper}".encode()  # what the times are kept under
    say(f"timing the split, {SETTINGS}")
    choice = chosen_split(whole, functions, specs, lambda: contextlib.nullcontext(places), graph, dim)
    if choice.branches == 1:
        return meta_graph, choice
    return (split_wrapper(meta_graph, wrapper, carried, choice.branches, output_shapes(meta_graph, key), choice.least)
            if choice.least else candidates[choice.branches]), choice


def _rows(files, saved_model, index, meta_graph, called, wrapper, entry, batches, asked, stack, dim: int, say):
    """(the MetaGraph `batches` made, with batch 1 routed to the token rows of the function `wrapper` calls where
    they are proven, checked and, for "auto", measured faster; the SplitChoice saying both): `called` and `entry`
    (key, {input: argument position}) as _split_one's, `batches` (the MetaGraph and SplitChoice of the batch split,
    the wrapper's carried arguments), `asked` (split for batch 1: "auto" or N, exact, the fewest tokens a sample
    of an unknown length needs to run in rows)."""
    import tensorflow as tf

    original, whole, specs, names = called
    key, positions = entry
    made, choice, carried = batches
    split, exact, least = asked
    try:
        rows, why = rows_body(meta_graph, wrapper, positions, ROW_PARTS, SHAPE_OTHER)
    except (GraphError, KeyError, IndexError, ValueError) as e:  # a graph our surgery does not expect: ours to fix
        rows, why = None, (f"the row split could not be made ({type(e).__name__}: {e}); this is a bug of mp-rewrite, "
                           "please report it with the model")
    if rows is None:
        return made, with_rows(choice, RowChoice(1, f"runs whole: {why}"))
    candidate = split_wrapper(meta_graph, wrapper, carried, choice.branches, output_shapes(meta_graph, key),
                              choice.least, rows, least)
    tags = load_tags(meta_graph)
    staged = stack.enter_context(_staged(files, _with_meta_graph(saved_model, index, candidate)))
    places = {1: (original, key, tags), ROW_PARTS: (staged, key, tags)}
    graph = graph_bytes(candidate.graph_def) + f"\0{key}\0{wrapper}".encode()
    try:
        function = _positional(load_saved_model(staged, "token rows", tags).signatures[key], names)
        row = decided_rows(whole, function, specs, (split, exact, dim, least, rows.unknown_length),
                           lambda: contextlib.nullcontext(places), graph, say)
    except ModelError as e:
        row = RowChoice(1, f"runs whole: the copy with its token rows did not load ({tf_reason(e)}); this is a bug "
                           "of mp-rewrite, please report it with the model")
    except tf.errors.OpError as e:
        row = RowChoice(1, f"runs whole: {failed_check(whole, specs, dim, e)}")
    return (candidate if row.rows > 1 else made), with_rows(choice, row)


def _carried(loaded, key: str, positions: dict, files, meta_graph, wrapper: str) -> tuple[list | None, str]:
    """(per argument of the wrapper, whether it carries the batch; "") where the batch-rows analysis accepts the
    signature's frozen, folded graph; else (None, why)."""
    try:  # weights over protobuf's limit stay variables of the frozen graph (the analysis reads them as weights)
        frozen = freeze_signature(loaded, key, keep_variables=weights_form(files, "auto")[0] == "variables")
    except ModelError as e:
        return None, str(e).split("; convert without --freeze")[0]
    found = analysed(optimize_graph(frozen.graph_def, frozen.fetches, FOLDING), frozen)
    if not found.splittable:
        return None, found.reason
    if set(frozen.feeds) != set(positions):
        return None, f"its inputs ({', '.join(sorted(positions))}) are not its function's ({', '.join(frozen.feeds)})"
    function = next(f for f in meta_graph.graph_def.library.function if f.signature.name == wrapper)
    carried = [False] * len(function.signature.input_arg)
    for name, tensor in frozen.feeds.items():
        carried[positions[name]] = tensor in found.batch_inputs
    return carried, ""


def _callees(meta_graph, wrapper: str) -> tuple:
    """The functions a wrapper calls: equal for the wrappers of one traced body."""
    function = next(f for f in meta_graph.graph_def.library.function if f.signature.name == wrapper)
    return tuple(sorted(n.attr["f"].func.name for n in function.node_def if "f" in n.attr))


def _positional(signature, names: list):
    """The loaded signature called with its inputs in `names`' order (what batch_split's check and race call)."""
    return lambda *tensors: signature(**dict(zip(names, tensors)))


def _with_meta_graph(saved_model, index: int, meta_graph):
    new = type(saved_model)()
    new.CopyFrom(saved_model)
    new.meta_graphs[index].CopyFrom(meta_graph)
    return new


@contextlib.contextmanager
def _staged(files, saved_model):
    """A temporary SavedModel directory holding `saved_model` with the variables and assets of `files` linked."""
    directory = tempfile.mkdtemp(prefix="mp_rewrite-split-")
    try:
        Path(directory, "saved_model.pb").write_bytes(serialize(saved_model))
        for name in LINKED:
            if os.path.exists(os.path.join(files, name)):
                os.symlink(os.path.realpath(os.path.join(files, name)), os.path.join(directory, name))
        yield directory
    finally:
        remove_tree(directory)
