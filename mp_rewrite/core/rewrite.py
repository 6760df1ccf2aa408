"""`rewrite_graph_def`: the pass from GraphDef (and the function library it reaches) to mixed precision GraphDef."""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from ..errors import GraphError
from .body import RewriteResult, gc_paused, rewrite_body
from .functions import graph_functions
from .library import rewrite_library, skipped_functions
from .meta_graph import functions_to_rewrite, nodes_to_preserve, signature_nodes
from .oplists import OpLists
from .options import Options, given_or_made
from .op_support import Signatures


def rewrite_graph_def(graph_def: graph_pb2.GraphDef, precision: str = "float16", fetches=(), *,
                      device: str | None = None, lists: OpLists | None = None, keep_fp32=(), force_low=(),
                      preserve=(), level: str | None = None, functions: bool = True, function_names=None,
                      progress=None, emulate: bool | None = None, assign: str = "lists", costs=None,
                      options: Options | None = None) -> RewriteResult:
    """Rewrite a GraphDef (and the functions it calls) to mixed precision, as Grappler's pass does.

    Args:
        graph_def: a tf GraphDef; never modified.
        precision: "float16" (TF's CUDA lists) or "bfloat16" (TF's oneDNN lists).
        fetches: node or tensor names whose nodes are preserved (they keep float32 and their outputs' dtypes).
        device: "gpu", "cpu" or "any": which placed nodes to convert (unplaced nodes always count). None means
            "gpu" for float16 and "cpu" for bfloat16, like Grappler's CUDA and oneDNN modes.
        lists: the op lists; None loads the built-in lists with TF's environment overrides.
        keep_fp32: node-name patterns (globs, names, name scopes) kept in float32; they act as deny seeds.
        force_low: node-name patterns treated as allow-list nodes (converted where the op supports it).
        preserve: more node names to preserve, like Grappler's NodesToPreserve.
        level: None, "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL" or "TENSOR_CORES_ONLY"; None reads TF's
            TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL.
        functions: also rewrite every library function the graph reaches, each on its own as Grappler does
            (arguments and return values keep their dtypes; stateful and dataset ops are preserved).
        function_names: the library functions to rewrite instead of those the graph's nodes reach, e.g. what a
            SavedModel's signatures and object graph run (core.meta_graph.functions_to_rewrite, as `convert` does).
        progress: optional callable (done, total, function name) called after each function body is rewritten.
        emulate: TF's CPU emulation of float16 (auto_mixed_precision_cpu): allow nodes keep float32 and every
            tensor they read or write makes a round trip float32 -> float16 -> float32 through Casts, named as
            TF 2.21 names them (result.emulated lists those attributes; result.retyped is empty). For checking
            float16 numerics on a CPU; nothing gets faster. None reads TF's variable
            TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16 (1/true or 0/false) where TF reads it, float16 with
            device="cpu"; unset means False (TF's CPU mode defaults to emulating; ours to the real rewrite).
        options: an Options made once with make_options (mp_rewrite.make_options), instead of precision, device,
            lists, keep_fp32, force_low, level and emulate.
        assign: "lists" colors by Grappler's op lists; "cost" then lets an exact minimum cut over measured op costs
            move allow nodes back to float32 where that is faster, casts and broken fusions counted
            (core.assignment; every candidate's Reason carries its numbers, result.assignment the totals).
        costs: with assign="cost", a core.assignment.CostTable, or a machine table with a
            `for_graph(graph_def, precision)` method (mp_rewrite.analysis.op_costs.MachineCosts) that makes one.

    Returns:
        A RewriteResult; `result.functions` maps each rewritten function's name to its own RewriteResult.

    Raises:
        OptionError: a bad precision, device, level, pattern or lists; emulate with bfloat16; a value of
            TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16 that is not a boolean.
        GraphError: a malformed graph (unknown op, missing input, unknown fetch).
        StageError: a stage failed on a node (e.g. a NextIteration that does not feed a Merge).
    """
    opts = given_or_made(options, precision, device=device, lists=lists, keep_fp32=keep_fp32, force_low=force_low,
                         level=level, emulate=emulate, assign=assign, costs=costs)
    if not isinstance(graph_def, graph_pb2.GraphDef):
        raise GraphError(f"expected a tf GraphDef, got {type(graph_def).__name__}; pass graph.as_graph_def()")
    # A machine's table becomes this graph's, made once for the graph and every function it reaches (one label per
    # function; a function body alone would miss signatures measured on the whole model). rewrite_body makes one
    # itself only when called directly (the training hook, one traced function at a time).
    if opts.assign == "cost" and hasattr(opts.costs, "for_graph"):
        opts = dataclasses.replace(opts, costs=opts.costs.for_graph(graph_def, opts.precision, fetches=fetches))
    with gc_paused():
        signatures = Signatures(graph_def.library)
        result = rewrite_body(graph_def, opts, fetches, preserve, signatures)
        if functions and graph_def.library.function:
            names = graph_functions(graph_def) if function_names is None else list(function_names)
            result.functions = rewrite_library(result.graph_def.library, opts, signatures, names, progress)
    return result


def rewrite_meta_graph_def(meta_graph: meta_graph_pb2.MetaGraphDef, precision: str = "float16", fetches=None, *,
                           options: Options | None = None, signatures=None, progress=None,
                           **rewrite_options) -> RewriteResult:
    """Rewrite a MetaGraphDef as Grappler does when it is handed one (tf_optimizer.OptimizeGraph, a GrapplerItem):
    every node Grappler keeps for it is preserved (core.meta_graph.nodes_to_preserve: collections' node lists such
    as "train_op", signature inputs and outputs, placeholders, initializers, saver and queue-runner ops, and the
    asset tensors a SavedModel loader feeds), and the library functions rewritten are those its signatures and
    object graph run (with no signatures, those its nodes call). The one MetaGraph rewrite: `convert`, `inspect`,
    `explain` and this API all go through it, so what inspect shows is what convert writes.

    Args:
        meta_graph: the MetaGraphDef; never modified.
        precision, **rewrite_options: as for rewrite_graph_def (device, lists, keep_fp32, emulate, ...); or
        options: an Options made with make_options.
        fetches: more node or tensor names to preserve as fetched; None fetches the signatures' outputs.
        signatures: signature keys whose functions to rewrite; None: every signature and the object graph's
            functions.
        progress: optional callable (done, total, function name), after each function body.

    Returns:
        The RewriteResult of the main graph, `.functions` holding every rewritten function body, `.skipped` the
        functions reached but not rewritten (parametrised, tf.data) with why, and `.meta_graph_def` a new
        MetaGraphDef holding the rewritten graph.

    Raises:
        As rewrite_graph_def; GraphError also for a MetaGraphDef without a graph; a failing function body is named.
    """
    if not isinstance(meta_graph, meta_graph_pb2.MetaGraphDef) or not meta_graph.graph_def.node:
        raise GraphError("expected a tf MetaGraphDef with a graph_def; pass tf.compat.v1.train.export_meta_graph()")
    preserve = nodes_to_preserve(meta_graph)
    extra = rewrite_options.pop("preserve", ())
    preserve.update(extra if isinstance(extra, dict) else {n: "preserved by the caller" for n in extra})
    fetches = signature_nodes(meta_graph, outputs_only=True) if fetches is None else fetches
    names = rewrite_options.pop("function_names", None)
    if names is None and (meta_graph.signature_def or meta_graph.object_graph_def.concrete_functions):
        names = functions_to_rewrite(meta_graph, signatures)
    result = rewrite_graph_def(meta_graph.graph_def, precision, fetches, preserve=preserve, function_names=names,
                               progress=progress, options=options, **rewrite_options)
    reached = set(names if names is not None else graph_functions(meta_graph.graph_def))
    result.skipped = {n: why for n, why in skipped_functions(meta_graph.graph_def.library).items() if n in reached}
    result.meta_graph_def = meta_graph_pb2.MetaGraphDef()
    result.meta_graph_def.CopyFrom(meta_graph)
    result.meta_graph_def.graph_def.CopyFrom(result.graph_def)
    return result
