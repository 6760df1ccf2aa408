"""`residual_bias`: a sum of a contraction, a per-channel constant and a residual, however Grappler grouped it,
becomes `AddV2(BiasAdd(contraction, constant), residual)`: TF's remapper's Conv2D + BiasAdd + Add (+ Relu), run as
one `_FusedConv2D`.

Where a BatchNormalization follows a residual block's projection convolution, `--freeze`'s Grappler folds its scale
into the filter and its arithmetic optimizer regroups `(conv + shift) + residual` as `AddN(conv, residual) + shift`
(MobileNetV2's 10 blocks, EfficientNet's 9): a Conv2D, an AddN and an AddV2, three kernels and two passes over the
activation, where the remapper fuses one. Exact up to float32 round-off: the same terms, added in another order.

(TF fuses the residual add in a SavedModel's call, where the input's batch is one symbol; a Session, where a fed
Placeholder's unknown batch makes the addends' shapes unknown, does not.)
"""

from __future__ import annotations

import numpy as np

from .bias import CONTRACTIONS, contraction_channels
from .graph import FLOAT_TYPES, EditableGraph, node_name
from .record import Match

SUMS = ("Add", "AddV2", "AddN")
FLOAT32 = 1  # types_pb2.DT_FLOAT


def match_residual_bias(graph: EditableGraph, root) -> Match | None:
    """The top of a sum tree with a contraction and a per-channel constant among its terms; None when the node is
    inside a larger sum, or there is no constant or no contraction to move it to."""
    if _inner(graph, root):
        return None
    terms, members = _terms(graph, root)
    constants = [t for t in terms if graph.constant(t) is not None]
    contractions = [t for t in terms if _contraction(graph, t, members) is not None]
    if not constants or not contractions:
        return None
    if root.attr["T"].type != FLOAT32:
        return Match().fail(f"'{root.name}' is not float32 (the rules run before a precision is chosen)")
    contraction = _contraction(graph, contractions[0], members)
    channels = contraction_channels(graph, contraction)
    bias = np.zeros(channels, np.float64)
    for tensor in constants:
        value = graph.constant(tensor)
        if value.size not in (1, channels) or value.size == channels and value.shape[-1] != channels or \
                value.ndim > CONTRACTIONS[contraction.op]:  # a constant of higher rank would broadcast the sum
            return Match().fail(f"the constant '{tensor}' of shape {tuple(value.shape)} is not one value per "
                                f"channel of {channels}")
        bias += value.astype(np.float64).reshape(-1)
    others = [t for t in terms if t not in constants]
    others.remove(contractions[0])
    if len(others) > 1:
        return Match().fail(f"'{root.name}' adds {len(others)} tensors besides the contraction and its bias; "
                            "the remapper fuses one")
    if len(terms) == 2 and root.op != "AddN":
        return None  # contraction + constant alone: rules/bias.py's
    return Match(nodes={"root": root, "contraction": contraction},
                 values={"bias": bias, "residual": others[0] if others else None, "members": members})


def _inner(graph: EditableGraph, node) -> bool:
    """Whether the node is a term of the one sum that reads it (that sum is the tree's top, not this node)."""
    reader = graph.only_reader(node.name)
    return reader is not None and reader.op in SUMS and not graph.is_kept(node) and \
        reader.attr["T"].type == node.attr["T"].type


def _terms(graph: EditableGraph, root) -> tuple[list, list]:
    """(the tensors the tree adds, the sum nodes inside it other than the root)."""
    terms, members, stack = [], [], list(graph.data_inputs(root))
    while stack:
        tensor = stack.pop(0)
        producer = graph.producer(tensor)
        if producer is not None and producer.op in SUMS and _inner(graph, producer):
            members.append(producer)
            stack += graph.data_inputs(producer)
        else:
            terms.append(tensor)
    return terms, members


def _contraction(graph: EditableGraph, tensor: str, members: list):
    """The MatMul or NHWC Conv2D (constant weight) producing `tensor` when only the tree reads it, else None."""
    node = graph.producer(tensor)
    if node is None or node.op not in CONTRACTIONS or graph.is_kept(node) or \
            node.attr["T"].type not in FLOAT_TYPES or contraction_channels(graph, node) is None:
        return None
    readers = graph.readers(node.name)
    inside = {m.name for m in members}
    return node if len(readers) == 1 and (readers[0].name in inside or _inner(graph, node)) else None


def rewrite_residual_bias(graph: EditableGraph, match: Match) -> str:
    """The root becomes `AddV2(BiasAdd(contraction, bias), residual)` (or the BiasAdd itself) under its name."""
    root, contraction = match.nodes["root"], match.nodes["contraction"]
    dtype = root.attr["T"].type
    bias = graph.add_constant(f"{root.name}/bias", match.values["bias"].astype(np.float32), root.device)
    graph.remove([m.name for m in match.values["members"]])
    residual = match.values["residual"]
    root.attr.clear()
    root.attr["T"].type = dtype
    if residual is None:
        root.op = "BiasAdd"
        root.attr["data_format"].s = b"NHWC"
        graph.set_inputs(root, [contraction.name, bias.name])
        return f"'{root.name}' is now the BiasAdd of '{contraction.name}'"
    bias_add = graph.add_node(f"{root.name}/bias_add", "BiasAdd", [contraction.name, bias.name], root.device)
    bias_add.attr["T"].type = dtype
    bias_add.attr["data_format"].s = b"NHWC"
    root.op = "AddV2"
    graph.set_inputs(root, [bias_add.name, residual])
    return (f"'{root.name}' adds '{node_name(residual)}' to the BiasAdd of '{contraction.name}' "
            f"({len(match.values['members'])} inner sums gone)")
