"""The walk of analysis/token_rows.py: each node's state on the token rows of one sample, by per-op rules (the
methods of RowWalk), and what each split or fed-whole node needs. token_rows.py turns it into a TokenRows plan."""

from __future__ import annotations

import math

from ..core.graph_view import parse_input
from ..core.op_support import attr_or_default
from .batch_row_states import folded_ints

ELEMENTWISE = frozenset({"AddV2", "Add", "Sub", "Mul", "RealDiv", "SquaredDifference", "Rsqrt", "Sqrt", "Erf", "Erfc",
                         "Identity", "Cast", "Relu", "Relu6", "Less", "Greater", "SelectV2", "BiasAdd", "Tanh",
                         "Sigmoid", "Maximum", "Minimum", "Neg", "Square", "Exp", "Elu", "Selu", "Softplus",
                         "StopGradient", "Snapshot", "LogicalAnd", "LogicalOr", "LogicalNot", "Equal", "NotEqual",
                         "GreaterEqual", "LessEqual", "Log", "Abs", "Reciprocal", "Pow", "DivNoNan", "AddN"})
BATCH_MATMULS = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod"})
CHANNEL_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
WORK = frozenset({"MatMul", "Einsum"}) | BATCH_MATMULS  # what a split must cut
SPLIT, LOCAL = "split", "local"


class FedWhole(Exception):
    """An op is not known to be row-wise on its input's split axis: it is fed whole rows."""


class Refused(Exception):
    """No plan: the message names the node."""


class RowWalk:
    """The states of the nodes, and what each split or fed-whole node needs (TokenRows' fields)."""

    def __init__(self, graph_def, shapes: dict, whole_ops: frozenset, pinned: bool = False):
        self.nodes = {n.name: n for n in graph_def.node}
        self.shapes, self.whole_ops, self.rows = shapes, whole_ops, 0
        self.pinned = pinned  # the token count is the caller's stand-in for a length the graph leaves unknown
        self.states, self.gathers, self.slices, self.reshapes, self.gathered = {}, {}, {}, {}, {}
        self.constants = {}
        self.consumers = {}  # node -> the nodes reading its outputs (data inputs)
        for node in graph_def.node:
            for t in node.input:
                if not t.startswith("^"):
                    self.consumers.setdefault(parse_input(t)[0], []).append(node.name)
        self.fed_whole = []

    def shape(self, tensor: str):
        name, port = parse_input(tensor)
        found = self.shapes.get(name) or []
        return found[port] if port < len(found) else None

    def axis(self, tensor: str):
        state = self.states.get(parse_input(tensor)[0])
        return state[1] if state and state[0] == SPLIT else None

    def whole(self, tensor: str, why: str) -> None:
        """Note that `tensor` is read with every row: its slices concatenated (once), or for a per-slice value
        (a slice's shape), the value computed again from whole inputs."""
        name = parse_input(tensor)[0]
        state = self.states.get(name)
        if state is None:
            return
        key = tensor if ":" in tensor else f"{tensor}:0"
        if state[0] == LOCAL:
            known = self.shape(self.nodes[name].input[0]) if self.nodes[name].op == "Shape" else None
            if known is not None and None not in known and not self.pinned:  # at batch 1, a constant
                self.constants[name] = tuple(known)
                self.gathered.setdefault(key, f"{why} (its value at batch 1)")
            elif key not in self.gathered:
                self.gathered[key] = f"{why} (computed again from whole rows)"
                for t in self.nodes[name].input:
                    if not t.startswith("^"):
                        self.whole(t, why)
            return
        self.gathered.setdefault(key, why)

    def visit(self, name: str) -> None:
        node = self.nodes[name]
        data = [t for t in node.input if not t.startswith("^")]
        kinds = [self.states.get(parse_input(t)[0]) for t in data]
        if all(k is None for k in kinds):
            self.states[name] = None
            return
        if node.op == "Shape" or all(k is None or k[0] == LOCAL for k in kinds):
            self.states[name] = self._local(node, data)
            return
        try:
            if node.op in self.whole_ops:
                raise FedWhole("asked to run whole")
            axis, gather, sliced, reshape = self.rule(node, data)
        except FedWhole as why:
            self.fed_whole.append((name, node.op, str(why)))
            self.states[name] = None
            for t in data:
                self.whole(t, f"node '{name}' (op {node.op}) needs every row: {why}")
            return
        self.states[name] = (SPLIT, axis)
        for t in gather:
            self.whole(t, f"node '{name}' (op {node.op}) reads every row of it")
        self.gathers.update({name: tuple(gather)} if gather else {})
        self.slices.update({name: tuple(sliced)} if sliced else {})
        self.reshapes.update({name: reshape} if reshape is not None else {})

    def _local(self, node, data):
        """The state of a node computed from per-slice values: a slice's shape and its arithmetic stay local; a
        Fill or a BroadcastTo to the shape of a split tensor (ones_like; a position embedding broadcast to the
        token embeddings' shape, its rows sliced like the tokens') is split as that tensor is; any other tensor
        made from a slice's shape is computed whole, from the whole values of its inputs."""
        at = {"Fill": 0, "BroadcastTo": 1}.get(node.op)
        dims = self.nodes.get(parse_input(data[at])[0]) if at is not None else None
        if dims is not None and dims.op == "Shape" and self.axis(dims.input[0]) is not None:
            axis = self.axis(dims.input[0])
            if node.op == "BroadcastTo":
                self._broadcast_rows(node, data[0], axis)
            return (SPLIT, axis)
        shape = self.shape(node.name)
        if node.op != "Shape" and (shape is None or len(shape) > 1):
            why = "a tensor made from a slice's shape is computed whole"
            self.fed_whole.append((node.name, node.op, why))
            for t in data:
                self.whole(t, f"node '{node.name}' (op {node.op}): {why}")
            return None
        return (LOCAL,)

    def _broadcast_rows(self, node, tensor: str, axis: int) -> None:
        """Note the rows of a whole `tensor` that a BroadcastTo to a split shape needs per slice (or refuse)."""
        out, shape = self.shape(node.name), self.shape(tensor)
        at = axis - (len(out or ()) - len(shape or ()))
        if out is None or shape is None or (at >= 0 and shape[at] not in (1, self.rows)):
            raise Refused(f"node '{node.name}' (op {node.op}) broadcasts {tensor} {shape} to a slice's shape")
        if at >= 0 and shape[at] == self.rows:
            self.slices[node.name] = ((tensor, at, len(shape)),)

    # ------------------------------------------------------------------------------------- the per-op rules

    def rule(self, node, data):
        """(output axis, inputs to gather whole, [(unsplit operand, axis, rank)] to slice, the token axis's position
        in a constant Reshape target to rewrite per slice or None), or raise FedWhole."""
        op = node.op
        if op in ELEMENTWISE:
            return self._elementwise(node, data)
        if op == "MatMul":
            if attr_or_default(node, "transpose_a").b or self.axis(data[0]) != 0:
                raise FedWhole("its rows are not split")
            return 0, [data[1]] if self.axis(data[1]) is not None else [], [], None
        if op == "Einsum":
            return self._einsum(node, data)
        if op in BATCH_MATMULS:  # a Dense on [batch, tokens, features], or attention spelled as matmuls
            return self._batch_matmul(node, data)
        if op in ("Softmax", "LogSoftmax"):
            rank = len(self.shape(data[0]) or ())
            if self.axis(data[0]) in (None, rank - 1):
                raise FedWhole("normalizes over the split axis")
            return self.axis(data[0]), [], [], None
        if op in REDUCTIONS:
            return self._reduction(node, data)
        if op in CHANNEL_NORMS:
            return self._channel_norm(node, data)
        if op == "Reshape":
            return self._reshape(node, data)
        if op in ("Transpose", "ExpandDims") and self.axis(data[1]) is None:
            return self._moved(node, data)
        if op == "Tile" and self.axis(data[1]) is None:  # Grappler's spelling of a Mul by ones (a LayerNorm's)
            multiples, axis = folded_ints(self.nodes, data[1]), self.axis(data[0])
            if multiples is None or axis >= len(multiples) or multiples[axis] != 1:
                raise FedWhole("tiles the split axis")
            return axis, [], [], None
        if op in ("GatherV2", "ResourceGather"):  # ResourceGather: a variable's rows (tf_keras' Embedding)
            axis = folded_ints(self.nodes, data[2]) if op == "GatherV2" else [0]
            if self.axis(data[0]) is not None or self.axis(data[1]) is None or axis != [0] or \
                    attr_or_default(node, "batch_dims").i:
                raise FedWhole("not a lookup by split indices")
            return self.axis(data[1]), [], [], None
        raise FedWhole("no rule")

    def _elementwise(self, node, data):
        out = self.shape(node.name)
        if out is None:
            raise FedWhole("rank unknown")
        axes = set()
        for t in data:
            shape = self.shape(t)
            if shape is None:
                raise FedWhole(f"rank of {t} unknown")
            if self.axis(t) is not None:
                axes.add(self.axis(t) + len(out) - len(shape))
        if len(axes) != 1:
            raise FedWhole("split inputs do not line up")
        axis, sliced = axes.pop(), []
        for t in data:
            shape = self.shape(t)
            at = axis - (len(out) - len(shape))
            if self.axis(t) is not None or self.states.get(parse_input(t)[0]) is not None or at < 0 or \
                    shape[at] == 1:
                continue
            if shape[at] != self.rows:
                raise FedWhole(f"{t} {shape} broadcasts over the split axis")
            sliced.append((t, at, len(shape)))  # a mask on the query rows, say: each slice takes its rows
        return axis, [], sliced, None

    def _einsum(self, node, data):
        equation = attr_or_default(node, "equation").s.decode()
        ins, out = equation.replace(" ", "").split("->")
        operands = ins.split(",")
        if "." in equation or len(operands) != len(data):
            raise FedWhole("an ellipsis")
        split = [i for i, t in enumerate(data) if self.axis(t) is not None]
        first = split[0]
        letter = operands[first][self.axis(data[first])]
        others = [operands[i] for i in range(len(operands)) if i != first]
        if letter not in out or any(letter in o for o in others):
            raise FedWhole("contracts or shares the split axis")
        return out.index(letter), [data[i] for i in split[1:]], [], None

    def _reduction(self, node, data):
        axis, rank = self.axis(data[0]), len(self.shape(data[0]) or ())
        reduced = [a % rank for a in (folded_ints(self.nodes, data[1]) or [axis])] if rank \
            else [axis]
        if axis is None or axis in reduced or self.axis(data[1]) is not None:
            raise FedWhole("reduces the split axis")
        keep = attr_or_default(node, "keep_dims").b
        return (axis if keep else axis - sum(a < axis for a in reduced)), [], [], None

    def _channel_norm(self, node, data):
        """A FusedBatchNorm whose split axis is its channel axis (the rules' LayerNorm spelling: the rows as the
        channels of [1, rows, features, 1] in NCHW, each normalized by its own statistics): each slice normalizes
        its own channels. Its scale, offset, mean and variance are per channel: split alike, computed per slice
        (filled to a slice's row count), sliced where whole and one per row, or empty (in training). Only its
        output 0 may be read: the others hold the statistics per channel."""
        first = attr_or_default(node, "data_format").s.decode() in ("NCHW", "NCDHW")
        channel = 1 if first else len(self.shape(data[0]) or ()) - 1
        if self.axis(data[0]) != channel:
            raise FedWhole("normalizes over the split axis")
        read = {parse_input(t)[1] for user in self.consumers.get(node.name, ()) for t in self.nodes[user].input
                if not t.startswith("^") and parse_input(t)[0] == node.name}
        if read - {0}:
            raise FedWhole("its statistics are read")
        sliced = []
        for t in data[1:]:
            state, shape = self.states.get(parse_input(t)[0]), self.shape(t)
            if (state is not None and (state[0] == LOCAL or self.axis(t) == 0)) or shape == (0,):
                continue
            if state is not None or shape != (self.rows,):
                raise FedWhole(f"{t} {shape} is not one value per row")
            sliced.append((t, 0, 1))
        return channel, [], sliced, None

    def _batch_matmul(self, node, data):
        """On the rows of the first operand (the second gathered), or on the columns of the second (the first
        gathered) where both are split and the rows would reach a softmax on its normalized axis (attention's
        scores spelled keys @ queries^T, then transposed). An adjoint operand's rows or columns are its other
        inner axis (keras-hub BERT's scores: queries^T and keys, both adjoint, as TensorFlow's einsum spells them)."""
        ranks = [len(self.shape(t) or ()) for t in data]
        out = len(self.shape(node.name) or ())
        rows = all(ranks) and self.axis(data[0]) == ranks[0] - (1 if attr_or_default(node, "adj_x").b else 2)
        columns = all(ranks) and self.axis(data[1]) == ranks[1] - (2 if attr_or_default(node, "adj_y").b else 1)
        if rows and not (columns and not self._softmax_allows(node.name, out - 2)):
            return out - 2, [data[1]] if self.axis(data[1]) is not None else [], [], None
        if columns:
            return out - 1, [data[0]] if self.axis(data[0]) is not None else [], [], None
        raise FedWhole("its rows are not split")

    def _softmax_allows(self, name: str, axis: int, steps: int = 8) -> bool:
        """Whether `name`'s output split on `axis` reaches no softmax over that axis, following its only
        consumer through transposes and elementwise ops (a few steps)."""
        for _ in range(steps):
            users = self.consumers.get(name, [])
            if len(users) != 1:
                return True
            user = self.nodes[users[0]]
            rank = len(self.shape(user.name) or ())
            if user.op in ("Softmax", "LogSoftmax"):
                return axis != rank - 1
            if user.op == "Transpose":
                perm = folded_ints(self.nodes, user.input[1])
                if perm is None:
                    return True
                axis = [p % rank for p in perm].index(axis)
            elif user.op in ELEMENTWISE:
                axis += rank - len(self.shape(name) or ())
            else:
                return True
            name = user.name
        return True

    def _moved(self, node, data):
        """Transpose or ExpandDims: the split axis where the permutation (or the new axis) puts it."""
        axis, rank = self.axis(data[0]), len(self.shape(data[0]) or ())
        values = folded_ints(self.nodes, data[1])
        if axis is None or not rank or values is None:
            raise FedWhole("the permutation or axis is not known")
        if node.op == "Transpose":
            return [p % rank for p in values].index(axis), [], [], None
        at = values[0] % (rank + 1)
        return axis + (at <= axis), [], [], None

    def _constant_at(self, target: str, p: int):
        """The constant a Reshape target made per slice gives position `p` (a Pack's element, or a ConcatV2's
        piece), or None where the slice's shape gives it or it cannot be read."""
        node = self.nodes.get(parse_input(target)[0])
        if node is None or node.op not in ("Pack", "ConcatV2"):
            return None
        data = [t for t in node.input if not t.startswith("^")]
        if node.op == "Pack":
            values = folded_ints(self.nodes, data[p]) if p < len(data) else None
            return values[0] if values and len(values) == 1 else None
        at = 0
        for piece in data[:-1]:
            length = (self.shape(piece) or [None])[0]
            if length is None:
                return None
            if at <= p < at + length:
                values = folded_ints(self.nodes, piece)
                return values[p - at] if values and len(values) == length else None
            at += length
        return None

    def _reshape(self, node, data):
        axis, shape_in, shape_out = self.axis(data[0]), self.shape(data[0]), self.shape(node.name)
        if axis is None or not shape_in or not shape_out or None in shape_in or None in shape_out:
            raise FedWhole("shapes unknown")
        before, rows, after = math.prod(shape_in[:axis]), shape_in[axis], math.prod(shape_in[axis + 1:])
        found = [p for p in range(len(shape_out)) if math.prod(shape_out[:p]) == before and shape_out[p] == rows
                 and math.prod(shape_out[p + 1:]) == after]
        if not found:
            raise FedWhole("the split axis does not stay whole")
        p = found[0]
        if self.states.get(parse_input(data[1])[0]) is not None:  # computed per slice (a slice's Shape)
            if self._constant_at(data[1], p) not in (None, -1):  # SegFormer's [batch, 256, 1, 16] in place
                raise FedWhole("its target, made per slice, names the whole token count")
            return p, [], [], None
        target = folded_ints(self.nodes, data[1])
        if target is None:
            raise FedWhole("target not constant")
        if target[p] == -1:
            return p, [], [], None
        if target[p] != rows or self.pinned:  # a constant cannot name a length the graph leaves unknown
            raise FedWhole("target does not name the split axis")
        return p, [], [], p
