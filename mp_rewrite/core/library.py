"""Rewriting a function library: every reachable function body on its own, as Grappler's meta-optimizer does."""

from __future__ import annotations

from tensorflow.core.framework import function_pb2

from .functions import (function_to_graph, graph_to_function, is_polymorphic, is_tf_data_function,
                        reachable_functions)
from .body import rewrite_body
from ..errors import MpRewriteError, StageError
from .op_support import Signatures


def skipped_functions(library: function_pb2.FunctionDefLibrary) -> dict:
    """name -> why Grappler would not rewrite it: parametrised, or a tf.data function (and what it calls)."""
    skipped = {}
    for fdef in library.function:
        if is_polymorphic(fdef):
            skipped[fdef.signature.name] = "parametrised function (type attrs in its signature)"
    data_roots = [f.signature.name for f in library.function if is_tf_data_function(f)]
    for name in reachable_functions(library, data_roots):
        skipped[name] = "tf.data function (or called by one)"
    return skipped


def rewrite_library(library: function_pb2.FunctionDefLibrary, opts, signatures: Signatures, names,
                    progress=None) -> dict:
    """Rewrite the named functions of `library` in place (it must be the caller's own copy).

    Args:
        progress: optional callable (done, total, function name), called after each function.

    Returns:
        name -> RewriteResult of each rewritten body.
    """
    skipped = skipped_functions(library)
    index = {f.signature.name: i for i, f in enumerate(library.function)}
    results = {}
    todo = [n for n in names if n not in skipped and n in index]
    for done, name in enumerate(todo, 1):
        fdef = library.function[index[name]]
        try:
            body = function_to_graph(fdef, signatures)
            result = rewrite_body(body.graph_def, opts, body.retvals, body.preserved(), signatures,
                                  preserve_stateful=True, label=name)
        except StageError as e:
            raise StageError(e.stage, e.node, e.op, f"{e.message} (in function '{name}')") from e
        except MpRewriteError as e:
            raise type(e)(f"cannot rewrite function '{name}': {e}") from e
        library.function[index[name]].CopyFrom(graph_to_function(result.graph_def, fdef, signatures))
        results[name] = result
        if progress is not None:
            progress(done, len(todo), name)
    return results
