"""Constants in low precision: the Casts of float32 constants folded offline (fold_constant_casts), and the check that a
weight stored in low precision only is read only in low precision (check_weights_low, `--weights low`)."""

from __future__ import annotations

from ..core.dtypes import FLOAT, LOW


def _producer(name: str, nodes: dict):
    """The node whose first output the input `name` reads, or None (a control input, another output port)."""
    node, _, port = name.partition(":")
    return None if name.startswith("^") or port not in ("", "0") else nodes.get(node)


def fold_constant_casts(graph_def, fetches) -> tuple[object, int]:
    """Replace every Cast of a float constant to float16 or bfloat16 by a constant of the cast value.

    What Grappler's constant folding does for these Casts, without sending the whole graph (every weight) through
    it again: on ResNet-50 1.7 s, and 0.5 s more to turn Grappler's one-varint-per-value constants into raw bytes.
    The value is TensorFlow's own Cast kernel's (round to nearest even), stored as raw bytes.

    Args:
        graph_def: a GraphDef; not modified.
        fetches: tensor or node names whose nodes must keep their op.

    Returns:
        (a new GraphDef, how many Casts became constants).
    """
    import tensorflow as tf

    out = type(graph_def)()
    out.CopyFrom(graph_def)
    nodes = {node.name: node for node in out.node}
    kept = {f.split(":")[0].lstrip("^") for f in fetches}
    count = 0
    for node in out.node:
        source = _producer(node.input[0], nodes) if node.op == "Cast" and node.input else None
        # `in` first: reading an absent attr of a protobuf map inserts an empty one, which TF refuses to run
        if (source is None or source.op != "Const" or node.name in kept
                or "Truncate" in node.attr and node.attr["Truncate"].b
                or node.attr["DstT"].type not in LOW or node.attr["SrcT"].type != FLOAT):
            continue
        target = tf.dtypes.as_dtype(node.attr["DstT"].type)
        value = tf.cast(tf.make_ndarray(source.attr["value"].tensor), target).numpy()
        node.op = "Const"
        del node.input[:]
        node.attr.clear()
        node.attr["dtype"].type = target.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=target))
        count += 1
    return out, count


def check_weights_low(graph_def, key: str) -> None:
    """Refuse a weight (a float32 constant of more than one value) that is read both in low precision (through a
    Cast) and in float32: it cannot be stored in low precision only. Freezing makes one constant per read of a
    variable, so the constants of one weight are found by their equal values.

    Raises:
        ModelError: naming the weight and its float32 reader.
    """
    import hashlib

    from ..errors import ModelError

    weight_of = {}
    for node in graph_def.node:
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is not None and tensor.dtype == FLOAT and _elements(tensor.tensor_shape) > 1:
            weight_of[node.name] = hashlib.sha1(tensor.SerializeToString(deterministic=True)).digest()
    low, other, names = {}, {}, {}
    for node in graph_def.node:
        for name in node.input:
            weight = weight_of.get(name.split(":")[0]) if not name.startswith("^") else None
            if weight is not None:
                names.setdefault(weight, name.split(":")[0])
                is_low = node.op == "Cast" and node.attr["DstT"].type in LOW
                (low if is_low else other).setdefault(weight, node)
    for weight, reader in other.items():
        if weight in low:
            raise ModelError(f"--weights low: weight '{names[weight]}' of signature '{key}' is read in low precision "
                             f"and in float32 (by '{reader.name}', {reader.op}), so it cannot be stored in low "
                             "precision only; convert without --weights low (--freeze then stores it in both)")


def _elements(shape) -> int:
    count = 1
    for dim in shape.dim:
        count *= max(dim.size, 0)
    return count
