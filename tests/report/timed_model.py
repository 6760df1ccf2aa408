"""A small Keras CNN rewritten by Grappler's lists, and a cost table for it written out as plain data (the time
view's tests must read the same numbers on every machine, with or without bfloat16 units; the measured path has
its own test)."""

from __future__ import annotations

from mp_rewrite.analysis.graph_costs import MAIN
from mp_rewrite.core.assignment import CostTable
from mp_rewrite.model.loaded import load_model, rewrite_model

CAST_MS = (0.01, 0.02)  # every Cast: to bfloat16, to float32


def small_cnn(path: str) -> str:
    """Export a conv/BN/relu/conv/pool/dense CNN to the SavedModel `path`; returns the path."""
    import keras
    keras.utils.clear_session()
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, name="conv_a")(inputs)
    x = keras.layers.BatchNormalization(name="bn_a")(x)
    x = keras.layers.ReLU(name="relu_a")(x)
    x = keras.layers.Conv2D(16, 3, name="conv_b")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    keras.Model(inputs, outputs).export(path, verbose=False)
    return path


def rewritten(path: str):
    """The model at `path` rewritten to bfloat16 by Grappler's lists."""
    return rewrite_model(load_model(path), "bfloat16")


def made_up_table(result) -> CostTable:
    """Every candidate of every graph timed (0.1 ms × its rank in float32, half that in bfloat16), every Cast the
    result inserted priced CAST_MS."""
    nodes, casts = {}, {}
    for name, sub in (("", result), *result.functions.items()):
        label = name or MAIN
        nodes[label] = {n: (0.1 * (k + 1), 0.05 * (k + 1)) for k, n in enumerate(sorted(sub.converted_nodes))}
        casts[label] = {(c.src, c.src_port): CAST_MS for c in sub.casts}
    return CostTable("bfloat16", nodes, casts, {}, True, "made up for the tests")
