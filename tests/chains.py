"""Tiny graph builders for stage-rule tests: linear chains of real TF ops, and dtype strings of the result."""

import tensorflow as tf

from mp_rewrite.core import dtypes

# How each op consumes the previous tensor x.
_APPLY = {
    "MatMul": lambda x, n: tf.raw_ops.MatMul(a=x, b=x, name=n),
    "Relu": lambda x, n: tf.raw_ops.Relu(features=x, name=n),
    "Exp": lambda x, n: tf.raw_ops.Exp(x=x, name=n),
    "Log": lambda x, n: tf.raw_ops.Log(x=x, name=n),
    "Sqrt": lambda x, n: tf.raw_ops.Sqrt(x=x, name=n),
    "Tanh": lambda x, n: tf.raw_ops.Tanh(x=x, name=n),
    "Add": lambda x, n: tf.raw_ops.AddV2(x=x, y=x, name=n),
    "Identity": lambda x, n: tf.raw_ops.Identity(input=x, name=n),
    "Sum": lambda x, n: tf.raw_ops.Sum(input=x, axis=[1], keep_dims=True, name=n),
    "Softmax": lambda x, n: tf.raw_ops.Softmax(logits=x, name=n),
    "Transpose": lambda x, n: tf.raw_ops.Transpose(x=x, perm=[1, 0], name=n),
}


def chain(*ops, device=None):
    """Build input Const -> ops[0] -> ops[1] ... -> fetch Identity; nodes are named n0, n1, ...

    Returns (graph_def, fetches, names).
    """
    g = tf.Graph()
    with g.as_default(), tf.device(device):
        x = tf.constant(0.25, shape=[8, 8], name="input")
        names = []
        for i, op in enumerate(ops):
            x = _APPLY[op](x, f"n{i}")
            names.append(f"n{i}")
        tf.raw_ops.Identity(input=x, name="fetch")
    return g.as_graph_def(), ["fetch"], names


def dtype_string(graph_def, names, attr="T"):
    """'h' (half), 'b' (bfloat16), 'f' (float) or '?' per node, read from the GraphDef's attrs."""
    letters = {dtypes.HALF: "h", dtypes.BFLOAT16: "b", dtypes.FLOAT: "f"}
    nodes = {n.name: n for n in graph_def.node}
    return "".join(letters.get(nodes[name].attr[attr].type, "?") for name in names)


def casts(graph_def):
    """Names of the Cast nodes the rewrite added."""
    return [n.name for n in graph_def.node if n.op == "Cast" and n.name.endswith("-AutoMixedPrecision")]
