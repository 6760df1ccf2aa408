"""`residual_bias`: a sum of a contraction, a per-channel constant and a residual, however Grappler grouped it,
becomes `AddV2(BiasAdd(contraction, constant), residual)`: TF's remapper's Conv2D + BiasAdd + Add (+ Relu), run as
one `_FusedConv2D`.

Where a BatchNormalization follows a residual block's projection convolution, `--freeze`'s Grappler folds its scale
into the filter and its arithmetic optimizer regroups `(conv + shift) + residual` as `AddN(conv, residual) + shift`
(MobileNetV2's 10 blocks, EfficientNet's 9): a Conv2D, an AddN and an AddV2, three kernels and two passes over the
activation, where the remapper fuses one. Exact up to float32 round-off: the same terms, added in another order.

(TF fuses the residual add in a SavedModel's call, where the input's batch is one symbol; a Session, where a fed
Placeholder's unknown batch makes the addends' shapes unknown, does not.)

`residual_rows`: a Dense on 3-D inputs plus a residual, `AddV2(Reshape(BiasAdd(MatMul(rows, W), b), [-1, T, C]),
residual)` (every residual add of a Transformer), becomes

    Reshape(AddV2(BiasAdd(MatMul(rows, W), b), Reshape(residual, [rows' first dimension, C])), [-1, T, C])

which the remapper runs as one `_FusedMatMul [BiasAdd, Add]`. It fuses only where the two addends' shapes are
symbolically equal, so the residual's rows are counted from the MatMul's input (`Shape(rows)[:1]`, which Grappler
follows), not given a -1 of their own. Exact: the same sums, row by row; and only where `row_origin` proves the two
addends have the same first dimension at every call (no add that broadcasts over the batch is rewritten).
On 2-D rows (TF1 BERT's `dense(context) + layer_input`, the context reshaped to `[-1, C]`) the add stays where it is
and the context's Reshape counts its rows from the residual's Shape, `[Shape(residual)[:1], C]`: the same symbol for
both addends. (Reshaping the residual to the context's rows instead is a no-op to Grappler, which removes it.)
"""

from __future__ import annotations

import numpy as np

from .bias import CONTRACTIONS, contraction_channels
from .graph import FLOAT_TYPES, EditableGraph, node_name
from .record import Match
from .rows import ROWS_MARK, row_origin

SUMS = ("Add", "AddV2", "AddN")
FLOAT32 = 1  # types_pb2.DT_FLOAT
INT32 = 3  # types_pb2.DT_INT32


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


def match_residual_rows(graph: EditableGraph, add) -> Match | None:
    """`AddV2(Reshape(contraction rows), residual)` of equal shapes; None when no input is a Dense's rows reshaped
    back, declined when the residual's first dimension cannot be proven the Dense's."""
    inputs = graph.data_inputs(add)
    if len(inputs) != 2 or graph.is_kept(add) or add.attr["T"].type != FLOAT32:
        return None
    for dense, residual in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        chain = _forwarding(graph, dense, add)  # Identities between (a zero bias folded away leaves one)
        last = chain[-1] if chain else None
        if last is None or last.op not in ("Reshape", "BiasAdd"):
            continue
        # A MatMul without a bias is not fused with an Add (and Grappler folds a BiasAdd of zeros away).
        back, rows = (last, graph.producer(last.input[0])) if last.op == "Reshape" else (None, last)
        matmul = graph.producer(rows.input[0]) if rows is not None and rows.op == "BiasAdd" else None
        if matmul is None or matmul.op != "MatMul" or matmul.attr["transpose_a"].b or graph.is_kept(rows) or \
                graph.is_kept(matmul) or len(graph.readers(rows.name)) != 1 or len(graph.readers(matmul.name)) != 1:
            continue
        shape, other, flat = (graph.inferred_shape(dense), graph.inferred_shape(residual),
                              graph.inferred_shape(rows.name))
        if shape is None or shape != other or len(shape) < 2 or None in shape[1:] or flat is None or \
                len(flat) != 2 or flat[1] != shape[-1] or graph.constant(residual) is not None:
            continue
        if ROWS_MARK in residual:
            continue  # the rows this rule added up
        if len(shape) == 2 and (back is not None or not _new_rows(graph, matmul)):
            continue  # on rows: only a Reshape's -1 rows differ from the residual's (and not once counted here)
        if len(shape) > 2 and back is None:
            continue
        if row_origin(graph, dense) != row_origin(graph, residual):
            return Match().fail(f"the first dimension of '{node_name(residual)}' is not proven that of "
                                f"'{node_name(dense)}' at every call (one may broadcast over the other)")
        return Match(nodes={"add": add, "rows": rows, "contraction": matmul},
                     values={"residual": residual, "channels": shape[-1], "chain": chain, "back": back})
    return None


def _new_rows(graph: EditableGraph, matmul) -> bool:
    """Whether a 2-D MatMul's rows are a Reshape's `-1` (TF1 BERT's attention output: its context reshaped to
    rows), which Grappler gives a symbol of its own, so the remapper does not fuse the residual add after it.
    Other rows (a LayerNorm's, a previous Dense's) keep the symbol the residual's rows already have."""
    source = graph.producer(matmul.input[0])
    if source is None or source.op != "Reshape" or graph.is_kept(source) or ROWS_MARK in source.input[1]:
        return False
    shape = graph.inferred_shape(source.name)
    return shape is not None and len(shape) == 2 and shape[1] is not None


def _forwarding(graph: EditableGraph, tensor: str, reader) -> list:
    """[the Identities from `tensor` back, then the node they forward]: each read by the next alone and not
    kept; [] when one is read by more."""
    chain, node = [], graph.producer(tensor)
    while node is not None and not graph.is_kept(node) and graph.only_reader(node.name) is reader:
        chain.append(node)
        if node.op != "Identity" or graph.forwarded(node.name) == node.name:
            return chain
        reader, node = node, graph.producer(node.input[0])
    return []


def rewrite_residual_rows(graph: EditableGraph, match: Match) -> str:
    """The add happens on the rows, under a name of its own; the add's node becomes the Reshape back. On 2-D
    inputs the add stays, and the Reshape that made the MatMul's rows counts them from the residual's Shape (a
    Reshape of the residual to the MatMul's rows, the other way round, is one Grappler removes as a no-op)."""
    add, rows, matmul = (match.nodes[k] for k in ("add", "rows", "contraction"))
    dtype, device, base = add.attr["T"].type, add.device, f"{add.name}{ROWS_MARK.rstrip('/')}"
    back = match.values["back"]
    if back is None:
        source = graph.producer(matmul.input[0])
        width = graph.inferred_shape(source.name)[1]
        target = _rows_of(graph, match.values["residual"], dtype, width, base, device)
        graph.set_inputs(source, [source.input[0], target])
        graph.set_inputs(add, [rows.name, match.values["residual"]])
        graph.remove([node.name for node in match.values["chain"][:-1]])
        return (f"'{source.name}' counts its rows from '{node_name(match.values['residual'])}', which '{add.name}' "
                "adds to them")
    target = _rows_of(graph, matmul.input[0], dtype, match.values["channels"], base, device)
    residual = graph.add_node(f"{base}/residual", "Reshape", [match.values["residual"], target], device)
    residual.attr["T"].type, residual.attr["Tshape"].type = dtype, INT32
    total = graph.add_node(base, "AddV2", [rows.name, residual.name], device)
    total.attr["T"].type = dtype
    target_3d = back.input[1]
    add.op = "Reshape"
    add.attr.clear()
    add.attr["T"].type, add.attr["Tshape"].type = dtype, back.attr["Tshape"].type or INT32
    graph.set_inputs(add, [total.name, target_3d])
    graph.remove([node.name for node in match.values["chain"]])
    return (f"'{add.name}' adds '{node_name(match.values['residual'])}' to '{rows.name}' as rows, then reshapes "
            "back")


def _rows_of(graph: EditableGraph, tensor: str, dtype: int, width: int, base: str, device: str) -> str:
    """A Reshape target `[Shape(tensor)[:1], width]` (under `base`, which holds ROWS_MARK; `dtype` is the
    tensor's): Grappler follows a Shape through StridedSlice and ConcatV2, so what it shapes has `tensor`'s first
    dimension as its symbol."""
    shape = graph.add_node(f"{base}/shape", "Shape", [tensor], device)
    shape.attr["T"].type, shape.attr["out_type"].type = dtype, INT32
    zero, one = (graph.add_constant(f"{base}/{name}", np.array([value], np.int32), device)
                 for name, value in (("zero", 0), ("one", 1)))
    count = graph.add_node(f"{base}/count", "StridedSlice", [shape.name, zero.name, one.name, one.name], device)
    count.attr["T"].type, count.attr["Index"].type = INT32, INT32
    size = graph.add_constant(f"{base}/width", np.array([width], np.int32), device)
    axis = graph.add_constant(f"{base}/axis", np.array(0, np.int32), device)
    target = graph.add_node(f"{base}/target", "ConcatV2", [count.name, size.name, axis.name], device)
    target.attr["T"].type, target.attr["N"].i, target.attr["Tidx"].type = INT32, 2, INT32
    return target.name
