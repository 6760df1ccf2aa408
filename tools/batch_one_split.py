"""Batch-1 splits of a frozen GraphDef (issue 40, item 3), for tools/bench_batch_one.py: one sample's work in N
branches that TensorFlow's inter-op pool runs at once (served with one intra-op thread, no hand-off per op).

- `split_rows`: a Transformer's token rows. The input's token axis is cut into N slices; every op that is row-wise
  on that axis (elementwise ops that do not broadcast over it, matmuls on rows, LayerNorm's reductions over the
  features, reshapes that keep the token axis whole, an embedding lookup, the einsums of attention on the query's
  rows) runs once per slice; an op that needs every row (attention's keys and values, the pooling) is fed the slices
  concatenated -- the one exchange per attention layer. Any op without a rule is fed whole rows too, so the
  result rests on the rules' few row-wise facts, not on knowing every op of the graph.
- `split_bands` (batch_one_bands.py): a CNN's image in N horizontal bands with halos.

Protos in, GraphDef out; shapes come from the caller (mp_rewrite.analysis.shapes.node_shapes at batch 1). The
split graph is valid at batch 1 only. Tested numerically by the benchmark (outputs against the whole graph's).
"""

from __future__ import annotations

import math

from tensorflow.core.framework import graph_pb2, node_def_pb2, tensor_pb2

from mp_rewrite.analysis.batch_row_states import const_ints
from mp_rewrite.core.graph_view import parse_input

ELEMENTWISE = frozenset({"AddV2", "Add", "Sub", "Mul", "RealDiv", "SquaredDifference", "Rsqrt", "Sqrt", "Erf", "Erfc",
                         "Identity", "Cast", "Relu", "Relu6", "Less", "Greater", "SelectV2", "BiasAdd", "Tanh",
                         "Sigmoid", "Maximum", "Minimum", "Neg", "Square", "Exp", "Elu", "Selu", "Softplus"})
REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod"})
SPLIT, LOCAL = "split", "local"  # a tensor cut along an axis; a per-branch value (the shape of a slice)


class Whole(Exception):
    """An op is not known to be row-wise on its input's split axis: it is fed whole rows."""


def _const(name: str, values, dtype: int = 3) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = dtype
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    values = list(values)
    tensor.tensor_shape.dim.add(size=len(values))
    tensor.int_val.extend(values)
    node.attr["value"].tensor.CopyFrom(tensor)
    return node


def _scalar(name: str, value: int) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = 3
    node.attr["value"].tensor.CopyFrom(tensor_pb2.TensorProto(dtype=3, int_val=[value]))
    return node


def _concat(name: str, parts: list, axis: int, dtype: int) -> list:
    node = node_def_pb2.NodeDef(name=name, op="ConcatV2", input=[*parts, name + "/axis"])
    node.attr["N"].i = len(parts)
    node.attr["T"].type = dtype
    node.attr["Tidx"].type = 3
    return [_scalar(name + "/axis", axis), node]


def _slice(name: str, tensor: str, begin: list, size: list, dtype: int) -> list:
    node = node_def_pb2.NodeDef(name=name, op="Slice", input=[tensor, name + "/begin", name + "/size"])
    node.attr["T"].type = dtype
    node.attr["Index"].type = 3
    return [_const(name + "/begin", begin), _const(name + "/size", size), node]


def _dtype(node) -> int:
    for key in ("T", "dtype", "DstT", "Tparams"):
        if key in node.attr and node.attr[key].type:
            return node.attr[key].type
    return 1


def _order(nodes: dict, roots) -> list:
    order, done, stack = [], set(), [(r, False) for r in roots]
    while stack:
        name, expanded = stack.pop()
        if name in done:
            continue
        if expanded:
            done.add(name)
            order.append(name)
            continue
        stack.append((name, True))
        stack.extend((parse_input(t.lstrip("^"))[0], False) for t in nodes[name].input
                     if parse_input(t.lstrip("^"))[0] not in done)
    return order


def _copy(node, name: str, inputs: list) -> node_def_pb2.NodeDef:
    new = node_def_pb2.NodeDef()
    new.CopyFrom(node)
    new.name = name
    del new.input[:]
    new.input.extend(inputs)
    new.attr.pop("_output_shapes", None)
    return new


class _RowSplit:
    """The walk of split_rows: states per node, the new nodes, the gathered (concatenated) tensors."""

    def __init__(self, graph_def, shapes: dict, parts: int, whole_ops):
        self.nodes = {n.name: n for n in graph_def.node}
        self.shapes, self.parts, self.whole_ops = shapes, parts, frozenset(whole_ops)
        self.state = {}  # node -> None (one copy), (SPLIT, axis) or (LOCAL,)
        self.out, self.gathered, self.bounds = [], {}, None
        self.fed_whole = []  # (node, op, why) of ops with split inputs fed whole rows

    def shape(self, tensor: str):
        name, port = parse_input(tensor)
        found = self.shapes.get(name) or []
        return found[port] if port < len(found) else None

    def axis(self, tensor: str):
        state = self.state.get(parse_input(tensor)[0])
        return state[1] if state and state[0] == SPLIT else None

    def branch(self, tensor: str, i: int) -> str:
        control = tensor.startswith("^")
        name, port = parse_input(tensor.lstrip("^"))
        if self.state.get(name) is None:
            return tensor
        return ("^" if control else "") + f"{name}/row{i}" + (f":{port}" if port else "")

    def whole(self, tensor: str) -> str:
        """The tensor with all its rows: itself, or its slices concatenated (once)."""
        name, port = parse_input(tensor)
        state = self.state.get(name)
        if state is None:
            return tensor
        if state[0] == LOCAL:
            raise ValueError(f"{tensor} is a per-branch value and cannot be made whole")
        key = f"{name}:{port}"
        if key not in self.gathered:
            concat = f"{name}/rows_whole" + (f"_{port}" if port else "")
            self.out += _concat(concat, [self.branch(tensor, i) for i in range(self.parts)], state[1],
                                _dtype(self.nodes[name]))
            self.gathered[key] = concat
        return self.gathered[key]

    def visit(self, name: str) -> None:
        node = self.nodes[name]
        data = [t for t in node.input if not t.startswith("^")]
        kinds = [self.state.get(parse_input(t)[0]) for t in data]
        if all(k is None for k in kinds):
            self.state[name] = None
            self.out.append(node)
            return
        if node.op == "Shape" or all(k is None or k[0] == LOCAL for k in kinds):
            self.state[name] = (LOCAL,)
            self._duplicate(node, lambda i, n: None)
            return
        try:
            if node.op in self.whole_ops:
                raise Whole("asked to run whole")
            axis, gather, adjust = self.rule(node, data)
        except Whole as why:
            self.fed_whole.append((name, node.op, str(why)))
            if any(k and k[0] == LOCAL for k in kinds):
                raise ValueError(f"node {name} ({node.op}) reads a per-branch value but must run whole: {why}")
            self.state[name] = None
            self.out.append(_copy(node, name, [self.whole(t) if not t.startswith("^") else t for t in node.input]))
            return
        self.state[name] = (SPLIT, axis)
        gathered = {t: self.whole(t) for t in gather}
        inputs = [gathered.get(t, t) for t in node.input]
        self._duplicate(node, adjust, inputs)

    def _duplicate(self, node, adjust, inputs=None) -> None:
        inputs = list(node.input) if inputs is None else inputs
        for i in range(self.parts):
            copy = _copy(node, f"{node.name}/row{i}", [self.branch(t, i) for t in inputs])
            extra = adjust(i, copy)
            self.out += extra or []
            self.out.append(copy)

    # ------------------------------------------------------------------------------------- the per-op rules

    def rule(self, node, data):
        """(output axis, inputs to gather whole, adjust(i, copy) -> extra nodes) or raise Whole."""
        op = node.op
        if op in ELEMENTWISE:
            return self._elementwise(node, data)
        if op == "MatMul":
            if node.attr["transpose_a"].b or self.axis(data[0]) != 0:
                raise Whole("its rows are not split")
            return 0, [data[1]] if self.axis(data[1]) is not None else [], _same
        if op == "Einsum":
            return self._einsum(node, data)
        if op in ("Softmax", "LogSoftmax"):
            rank = len(self.shape(data[0]) or ())
            if self.axis(data[0]) in (None, rank - 1):
                raise Whole("normalizes over the split axis")
            return self.axis(data[0]), [], _same
        if op in REDUCTIONS:
            return self._reduction(node, data)
        if op == "Reshape":
            return self._reshape(node, data)
        if op == "GatherV2":
            axis = const_ints(self.nodes.get(parse_input(data[2])[0]))
            if self.axis(data[0]) is not None or self.axis(data[1]) is None or axis != [0] or \
                    node.attr["batch_dims"].i:
                raise Whole("not a lookup by split indices")
            return self.axis(data[1]), [], _same
        raise Whole("no rule")

    def _elementwise(self, node, data):
        out = self.shape(node.name)
        if out is None:
            raise Whole("rank unknown")
        axes = set()
        for t in data:
            shape = self.shape(t)
            if shape is None:
                raise Whole(f"rank of {t} unknown")
            if self.axis(t) is not None:
                axes.add(self.axis(t) + len(out) - len(shape))
        if len(axes) != 1:
            raise Whole("split inputs do not line up")
        axis = axes.pop()
        for t in data:
            shape = self.shape(t)
            at = axis - (len(out) - len(shape))
            if self.axis(t) is None and self.state.get(parse_input(t)[0]) is None and at >= 0 and shape[at] != 1:
                raise Whole(f"{t} {shape} broadcasts over the split axis")
        return axis, [], _same

    def _einsum(self, node, data):
        equation = node.attr["equation"].s.decode()
        ins, out = equation.replace(" ", "").split("->")
        operands = ins.split(",")
        if "." in equation or len(operands) != len(data):
            raise Whole("an ellipsis")
        split = [i for i, t in enumerate(data) if self.axis(t) is not None]
        first = split[0]
        letter = operands[first][self.axis(data[first])]
        others = [operands[i] for i in range(len(operands)) if i != first]
        if letter not in out or any(letter in o for o in others):
            raise Whole("contracts or shares the split axis")
        return out.index(letter), [data[i] for i in split[1:]], _same

    def _reduction(self, node, data):
        axis, rank = self.axis(data[0]), len(self.shape(data[0]) or ())
        reduced = [a % rank for a in (const_ints(self.nodes.get(parse_input(data[1])[0])) or [axis])] if rank \
            else [axis]
        if axis in reduced or self.axis(data[1]) is not None:
            raise Whole("reduces the split axis")
        keep = node.attr["keep_dims"].b
        return axis if keep else axis - sum(a < axis for a in reduced), [], _same

    def _reshape(self, node, data):
        axis, shape_in, shape_out = self.axis(data[0]), self.shape(data[0]), self.shape(node.name)
        if axis is None or not shape_in or not shape_out or None in shape_in or None in shape_out:
            raise Whole("shapes unknown")
        before, rows, after = math.prod(shape_in[:axis]), shape_in[axis], math.prod(shape_in[axis + 1:])
        found = [p for p in range(len(shape_out)) if math.prod(shape_out[:p]) == before and shape_out[p] == rows
                 and math.prod(shape_out[p + 1:]) == after]
        if not found:
            raise Whole("the split axis does not stay whole")
        p = found[0]
        target_state = self.state.get(parse_input(data[1])[0])
        if target_state is not None:  # computed per branch (a slice's Shape)
            return p, [], _same
        target = const_ints(self.nodes.get(parse_input(data[1])[0]))
        if target is None:
            raise Whole("target not constant")
        if target[p] == -1:
            return p, [], _same
        if target[p] != rows:
            raise Whole("target does not name the split axis")

        def adjust(i, copy):
            values = list(target)
            values[p] = self.bounds[i + 1] - self.bounds[i]
            const = _const(copy.name + "/target", values, self.nodes[parse_input(data[1])[0]].attr["dtype"].type)
            copy.input[1] = const.name
            return [const]
        return p, [], adjust


def _same(i, copy):
    return None


def split_rows(graph_def, input_tensor: str, axis: int, outputs: list, shapes: dict, parts: int = 2,
               whole_ops=()):
    """The graph with `input_tensor`'s `axis` (the tokens) cut into `parts` slices, each row-wise op run once per
    slice (module docstring). Returns (GraphDef, {output: tensor in the new graph}, [(node, op, why)] of the ops
    that had split inputs and were fed whole rows)."""
    walk = _RowSplit(graph_def, shapes, parts, whole_ops)
    input_name = parse_input(input_tensor)[0]
    input_shape = walk.shape(input_tensor)
    rows = input_shape[axis]
    walk.bounds = [round(i * rows / parts) for i in range(parts + 1)]
    order = _order(walk.nodes, [parse_input(o)[0] for o in outputs])
    for name in order:
        if name == input_name:
            walk.out.append(walk.nodes[name])
            walk.state[name] = None
            for i in range(parts):
                begin = [0] * len(input_shape)
                size = [-1] * len(input_shape)
                begin[axis], size[axis] = walk.bounds[i], walk.bounds[i + 1] - walk.bounds[i]
                walk.out += _slice(f"{name}/row{i}", input_tensor, begin, size, _dtype(walk.nodes[name]))
            walk.state[name] = (SPLIT, axis)
            continue
        walk.visit(name)
    fetched = {o: walk.whole(o) for o in outputs}  # may add the nodes that put an output back together
    return _assembled(graph_def, walk.out), fetched, walk.fed_whole


def _assembled(graph_def, nodes) -> graph_pb2.GraphDef:
    """A GraphDef of `nodes` with `graph_def`'s versions and function library (what every split returns)."""
    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    result.node.extend(nodes)
    return result

