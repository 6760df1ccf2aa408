"""The in-place strategy of `convert`: rewrite the functions a SavedModel's signatures and restored objects run, and
keep everything else (variables, assets, object graph, other MetaGraphs) as it is.

A TF2 SavedModel computes in its function library: each signature's output is a StatefulPartitionedCall in the
MetaGraph's main graph into a signature wrapper, which calls the traced `__inference_*` function, which may call
more (While/If/Case bodies, nested tf.functions). Every function reachable from the selected signatures -- and,
when no signature is selected, from the concrete functions the object graph restores (what
`tf.saved_model.load(...).__call__` runs) -- is rewritten on its own by the core's one MetaGraph rewrite,
Grappler-style. The main graph is rewritten too, with what Grappler keeps for a MetaGraphDef preserved (it holds the
compute of TF1 SavedModels; in TF2 ones it only calls functions). Save/restore functions and variables are left
untouched. Only protos are read and written here.
"""

from __future__ import annotations

from pathlib import Path

from tensorflow.core.protobuf import saved_model_pb2

from ..core.assignment import SOURCE
from ..core.rewrite import rewrite_meta_graph_def
from ..model.signatures import signature_keys
from ..model.tags import select_meta_graphs, tag_text
from ..rules import FLOAT32_RULES, PLACEMENT_RULES, RULES
from ..rules.functions import canonicalize_library
from ..rules.main_graph import MAIN_GRAPH, canonicalize_main_graph
from .dispatch_in_place import dispatched_in_place
from .keras_metadata import METADATA_FILE, has_keras_metadata, metadata_note
from .measured_costs import in_place_costs
from .result import Rewritten
from .source_check import node_names


def rewrite_in_place(source_dir: Path, saved_model, options, keys=None, tag_set=None, progress=None, *,
                     keras_metadata: str = "keep", output=None) -> Rewritten:
    """Rewrite the MetaGraphs of `saved_model` (those tagged `tag_set`, else every one); the others are kept as they
    are.

    Args:
        source_dir: the SavedModel directory (its other files are copied with the new proto).
        saved_model: its proto (never modified).
        options: the rewrite Options.
        keys: signature keys whose functions to rewrite; None: every signature and the object graph's functions.
        tag_set: a frozenset of tags, or None for every MetaGraph.
        progress: optional callable (done, total, function name), after each function.
        keras_metadata: "keep" or "drop" a tf_keras model's keras_metadata.pb.
        output: the output path, for the notes.

    Raises:
        GraphError, StageError, ModelError, OptionError: a graph or function body the pass cannot rewrite.
    """
    chosen = dict(select_meta_graphs(saved_model, tag_set))
    new = saved_model_pb2.SavedModel(saved_model_schema_version=saved_model.saved_model_schema_version)
    graphs, skipped = {}, {}
    for index, meta_graph in enumerate(saved_model.meta_graphs):
        if index not in chosen:
            new.meta_graphs.add().CopyFrom(meta_graph)
            continue
        meta_graph, options_here, records = rules_and_costs(meta_graph, options, source_dir, keys)
        result = rewrite_meta_graph_def(meta_graph, options=options_here, signatures=keys, progress=progress)
        rules_after_pass(result, records, options_here, keys)
        dispatched_in_place(result, meta_graph, options_here, source_dir, keys, options)  # issue 39: batch dispatch
        new.meta_graphs.add().CopyFrom(result.meta_graph_def)
        label = tag_text(meta_graph) if meta_graph.meta_info_def.tags else f"metagraph {index}"
        graphs[label if label not in graphs else f"{label} ({index})"] = result
        skipped.update(result.skipped)
    names = node_names(new, {name for result in graphs.values() for name in result.functions})
    notes = [metadata_note(output, keras_metadata)] if has_keras_metadata(source_dir) else []
    drop = (METADATA_FILE,) if keras_metadata == "drop" else ()
    return Rewritten(new, source_dir, graphs, skipped, names,
                     keys or tuple(signature_keys(m for _, m in chosen.items())), drop, notes)


def rules_before_pass(meta_graph, options, keys=None) -> tuple[object, dict]:
    """With the cost assignment, the MetaGraph whose functions the rules have canonicalized (rules.functions), and
    {function name: [Record]}; with Grappler's lists, the MetaGraph as it is (node for node Grappler's rewrite).
    Where the costs say this machine has no low-precision units (the graph stays float32), a BatchNorm after a
    Conv2D becomes the FusedBatchNorm TF fuses into a float32 convolution (rules.FLOAT32_RULES)."""
    if options.assign != "cost" or not options.rules:
        return meta_graph, {}
    return _canonical(meta_graph, keys, RULES if getattr(options.costs, "low_units", True) else FLOAT32_RULES)


def rules_and_costs(meta_graph, options, source_dir, keys=None) -> tuple:
    """(the MetaGraph to rewrite, the options with its costs, {function name: [Record]}): the rules' canonical
    MetaGraph (rules_before_pass) with the costs measured in it (measured_costs.in_place_costs), the MetaGraph as
    given raced beside it -- or, where that ran fastest (the costs' keep is SOURCE), the MetaGraph as given, which
    the rewrite then leaves as it is (every candidate float32) and no rule touches."""
    canonical, records = rules_before_pass(meta_graph, options, keys)
    options = in_place_costs(options, source_dir, canonical, keys, source=meta_graph)
    if getattr(options.costs, "keep", "") == SOURCE:
        return meta_graph, options, {}
    return canonical, options, records


def rules_after_pass(result, records: dict, options, keys=None) -> None:
    """With the cost assignment, the rules that follow the pass (rules.PLACEMENT_RULES: Casts moved where they cost
    less, a BatchNorm of a Conv2D the pass left float32 as the FusedBatchNorm TF fuses into it) in
    `result.meta_graph_def`, and the main graph's and each function's RewriteResult given its rules' records (what
    convert prints)."""
    if options.assign != "cost" or not options.rules or getattr(options.costs, "keep", "") == SOURCE:
        return
    result.meta_graph_def, placed = _canonical(result.meta_graph_def, keys, PLACEMENT_RULES)
    for name, body in [(MAIN_GRAPH, result), *result.functions.items()]:
        body.rules = list(dict.fromkeys(records.get(name, []) + placed.get(name, [])))  # a decline said twice once


def _canonical(meta_graph, keys, rules) -> tuple[object, dict]:
    """The rules in the functions the signatures run (rules.functions) and in a TF1 main graph (rules.main_graph):
    (the MetaGraph, {function name, or MAIN_GRAPH: [Record]})."""
    meta_graph, records = canonicalize_library(meta_graph, keys, rules)
    meta_graph, main = canonicalize_main_graph(meta_graph, rules)
    return meta_graph, {**records, MAIN_GRAPH: main} if main else records
