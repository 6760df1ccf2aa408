"""Running Grappler's own optimizers on a GraphDef (only those named), the way TensorFlow runs them on a
function before it executes: constant folding for a frozen graph, the remapper to see what TF would fuse."""

from __future__ import annotations

from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2

from ..errors import ModelError

# Fold what freezing made foldable: constant folding, arithmetic simplification, constant folding again.
FOLDING = ("constfold", "arithmetic", "constfold")


def optimize_graph(graph_def, fetches, optimizers) -> object:
    """Run Grappler's named optimizers (only those) on a GraphDef whose `fetches` are preserved; return the result.

    Raises:
        ModelError: Grappler failed (its C++ error, first line).
    """
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(dict.fromkeys(f.split(":")[0] for f in fetches))
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(optimizers)
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    rewrite.use_plugin_optimizers = rewriter_config_pb2.RewriterConfig.OFF
    try:
        return tf_optimizer.OptimizeGraph(config, meta)
    except Exception as e:  # Grappler's C++ errors arrive as several exception types
        raise ModelError(f"TensorFlow's graph optimizer failed on the frozen graph: {e}") from None
