"""The states of the batch-rows analysis (batch_rows.py says what each means: `same`, `rows(k)`, `size(k)`,
`shape(k)`), the walk's context, and the helpers its per-op rules (batch_row_rules.py, batch_row_layout.py) share,
the elementwise rule `unary` among them."""

from __future__ import annotations

import dataclasses
import math
import struct

from ..core.graph_view import parse_input

SAME, ROWS, SIZE, SHAPE = "same", "rows", "size", "shape"
# The rules' LayerNorm in FusedBatchNorm's spelling (rules/layer_norm.py, its variable form) reshapes N rows of C
# values to [1, N, C, 1] and normalizes them as N channels (NCHW): the rows move to axis 1 behind an axis of size 1.
CHANNELS, CHANNEL_SHAPE = "channels", "channel_shape"


@dataclasses.dataclass(frozen=True)
class State:
    """A tensor's state; k is the rows per sample (1 for `same`); a shape's known values after its first."""

    kind: str
    k: int = 1
    rest: tuple | None = None  # shape(k): the values after the first, where known

    def __str__(self) -> str:
        return self.kind if self.kind == SAME else f"{self.kind}({self.k})"


SAME_STATE = State(SAME)
# Ops that normalize over the last axis: a 1-D input would be normalized over the batch.
LAST_AXIS = frozenset({"Softmax", "LogSoftmax", "_MklLayerNorm"})


class Refused(Exception):
    """A node does not keep the samples of a batch apart (the message says which and why)."""


class Context:
    """The walk's state: nodes by name, static shapes ({node: [shape per output]}), states by node name."""

    def __init__(self, nodes: dict, shapes: dict):
        self.nodes, self.shapes, self.states = nodes, shapes, {}

    def state(self, tensor: str) -> State:
        name, port = parse_input(tensor)
        found = self.states[name]
        return found[min(port, len(found) - 1)]

    def shape(self, tensor: str):
        name, port = parse_input(tensor)
        found = self.shapes.get(name) or []
        return found[port] if port < len(found) else None

    def rank(self, tensor: str, node) -> int:
        shape = self.shape(tensor)
        if shape is None:
            raise Refused(where(node, f"the rank of {tensor} is unknown, so whether axis 0 stays the batch is not "
                                      "known"))
        return len(shape)

    def value(self, tensor: str, node) -> list:
        """The integer values of a Const input, flattened, or refuse."""
        found = const_ints(self.nodes.get(parse_input(tensor)[0]))
        if found is None:
            raise Refused(where(node, f"its input {tensor} is not a constant, so the axes it touches are unknown"))
        return found


def where(node, why: str) -> str:
    """The reason a node refuses, naming it and its op."""
    return f"node '{node.name}' ({node.op}): {why}"


def const_ints(node) -> list | None:
    """A Const node's int32/int64 values, flattened; None for anything else."""
    if node is None or node.op != "Const":
        return None
    tensor = node.attr["value"].tensor
    if tensor.dtype not in (3, 9):  # DT_INT32, DT_INT64
        return None
    count = math.prod(dim.size for dim in tensor.tensor_shape.dim)
    if tensor.tensor_content:
        width, code = (4, "i") if tensor.dtype == 3 else (8, "q")
        return list(struct.unpack(f"<{len(tensor.tensor_content) // width}{code}", tensor.tensor_content))
    values = list(tensor.int_val if tensor.dtype == 3 else tensor.int64_val) or [0]  # no values: all zeros
    return values + values[-1:] * (count - len(values))  # TensorProto repeats its last value


def folded_ints(nodes: dict, tensor: str, depth: int = 4) -> list | None:
    """The int values of `tensor` where they are constant: a Const, or an Identity, ConcatV2 or Pack of such
    (Tensordot's permutation, computed so in a traced function that Grappler has not folded); None else."""
    node = nodes.get(parse_input(tensor.lstrip("^"))[0])
    if node is None or depth < 0:
        return None
    if node.op == "Const":
        return const_ints(node)
    data = [t for t in node.input if not t.startswith("^")]
    if node.op == "Identity":
        return folded_ints(nodes, data[0], depth - 1)
    if node.op not in ("ConcatV2", "Pack") or (node.op == "ConcatV2" and folded_ints(nodes, data[-1], 0) != [0]):
        return None
    parts = [folded_ints(nodes, t, depth - 1) for t in (data[:-1] if node.op == "ConcatV2" else data)]
    if any(p is None for p in parts) or (node.op == "Pack" and any(len(p) != 1 for p in parts)):
        return None
    return [v for p in parts for v in p]


def rows_k(node, states) -> int:
    """The k shared by the `rows` inputs when every other input is `same`, or refuse."""
    ks = {s.k for s in states if s.kind == ROWS}
    if len(ks) != 1 or any(s.kind not in (ROWS, SAME) for s in states):
        raise Refused(where(node, f"its inputs do not line up on the batch ({', '.join(map(str, states))})"))
    return ks.pop()


def refuse_batch_axis(node, axes, rank: int, what: str, new_axis: bool = False) -> None:
    """Refuse if one of `axes` (negative ones counted from `rank`, or rank + 1 for a new axis) is axis 0."""
    if any((a + rank + (1 if new_axis else 0) if a < 0 else a) == 0 for a in axes):
        raise Refused(where(node, f"{what} axis 0, the batch"))


def unary(node, data, states, context):
    """An elementwise op of one tensor: its state (the batch size only through Identity and Cast)."""
    if any(s != SAME_STATE for s in states[1:]):
        raise Refused(where(node, "a parameter of an elementwise op carries the batch"))
    first = states[0]
    if first.kind in (SIZE, SHAPE) and node.op not in ("Identity", "Cast", "StopGradient", "Snapshot"):
        raise Refused(where(node, f"computes with the batch size ({first})"))
    return [first]
