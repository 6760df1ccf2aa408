"""Training: enable_mixed_precision_graph_rewrite, the tf.function hook and LossScaleOptimizer."""
