"""A batch-1 split of a frozen Transformer by weight columns (heads), for tools/bench_batch_one.py: each branch
reads half of every large weight instead of all of it (at batch 1 a Dense of 128 rows is bound by its weight's
bytes, not by its rows: tools/batch_one_split.py's row split made each branch read every weight).

States of a tensor: replicated (computed once; both branches read it), cols(axis, bounds) (branch i holds the
slice [bounds[i], bounds[i+1]) of `axis`), partial (branch i holds a partial sum; the value is their sum).

- MatMul(replicated x, constant W [K, N], N >= MIN_COLUMNS): W cut by columns -> cols(1).
- MatMul(cols(1) x, constant W): W cut by rows -> partial (the contraction is split).
- BiasAdd / elementwise ops on cols with scalars or constants cut the same way -> cols.
- Reshape of cols: the cut axis, with the axes it merges with or splits into, stays one contiguous group whose
  cut falls on whole units (256 columns -> 8 heads x 32: 128 columns = 4 heads) -> cols on the group's outer axis.
- Einsum: operands cut on the same letter, kept in the output -> cols on it (attention per head group).
- Softmax over another axis -> cols.
- A CNN's inverted residual block the same way, by channels: a convolution (NHWC, constant filter, >= MIN_CHANNELS
  outputs) on a replicated input cut by output channels; a depthwise convolution keeps them cut (one filter per
  channel: no halo, no exchange); a convolution on cut channels cuts its filter's input channels -> partial.
- Shape of a cut tensor: the whole tensor's static shape (the split graph is for batch 1, shapes known).
- Anything else reading a cut tensor gets it whole (ConcatV2), and reading a partial one gets the sum (AddN): always
  the whole graph's value; the two exchanges per layer are the AddN after attention's output projection and after
  the second Dense.
"""

from __future__ import annotations

import math

from tensorflow.core.framework import node_def_pb2, tensor_pb2

from mp_rewrite.analysis.batch_row_states import const_ints
from mp_rewrite.analysis.batch_rows import needed_order
from mp_rewrite.analysis.token_rows import ELEMENTWISE
from mp_rewrite.core.graph_view import parse_input
from mp_rewrite.savedmodel.row_split import assembled, concat_nodes, const_node, copied, node_dtype

MIN_COLUMNS = 64
MIN_CHANNELS = 64  # a convolution's output channels, cut only when each branch keeps a multiple of 8
COLS, PARTIAL = "cols", "partial"


class _Whole(Exception):
    pass


def _sliced_const(node, name: str, axis: int, lo: int, hi: int):
    """A Const node holding node's constant sliced along `axis`."""
    import tensorflow as tf
    tensor = node.attr["value"].tensor
    values = tf.make_ndarray(tensor)
    index = [slice(None)] * values.ndim
    index[axis] = slice(lo, hi)
    new = node_def_pb2.NodeDef(name=name, op="Const")
    new.attr["dtype"].type = node.attr["dtype"].type
    piece = values[tuple(index)].copy()
    proto = tensor_pb2.TensorProto(dtype=tensor.dtype)
    for d in piece.shape:
        proto.tensor_shape.dim.add(size=d)
    proto.tensor_content = piece.tobytes()
    new.attr["value"].tensor.CopyFrom(proto)
    return new


class _ColumnSplit:
    def __init__(self, graph_def, shapes: dict, parts: int):
        self.nodes = {n.name: n for n in graph_def.node}
        self.shapes, self.parts = shapes, parts
        self.state, self.out, self.made = {}, [], {}
        self.exchanges = []

    def shape(self, t):
        name, port = parse_input(t)
        return (self.shapes.get(name) or [None])[port]

    def const(self, t):
        node = self.nodes.get(parse_input(t)[0])
        while node is not None and node.op == "Identity":
            node = self.nodes.get(parse_input(node.input[0])[0])
        return node if node is not None and node.op == "Const" else None

    def branch(self, t, i):
        name, port = parse_input(t.lstrip("^"))
        if self.state.get(name) is None:
            return t
        return f"{name}/col{i}" + (f":{port}" if port else "")

    def whole(self, t):
        name, port = parse_input(t)
        state = self.state.get(name)
        if state is None:
            return t
        key = f"{name}:{port}"
        if key not in self.made:
            dtype = node_dtype(self.nodes[name])
            if state[0] == PARTIAL:
                node = node_def_pb2.NodeDef(name=f"{name}/summed", op="AddN",
                                            input=[self.branch(t, i) for i in range(self.parts)])
                node.attr["N"].i = self.parts
                node.attr["T"].type = dtype
                self.out.append(node)
                self.made[key] = node.name
            else:
                self.out += concat_nodes(f"{name}/cols_whole", [self.branch(t, i) for i in range(self.parts)],
                                         state[1], dtype)
                self.made[key] = f"{name}/cols_whole"
            self.exchanges.append((name, state[0]))
        return self.made[key]

    def piece(self, t, i, axis_out, bounds, out_rank):
        """Branch i's operand: its slice if cut, a constant cut the same way, or itself if it broadcasts."""
        if self.state.get(parse_input(t)[0]) is not None:
            return self.branch(t, i)
        shape = self.shape(t)
        at = axis_out - (out_rank - len(shape))
        if at < 0 or shape[at] == 1:
            return t
        node = self.const(t)
        if node is None:
            raise _Whole(f"{t} is not constant")
        name = f"{node.name}/cut{at}_{bounds[i]}_{bounds[i + 1]}"
        if name not in self.made:
            self.out.append(_sliced_const(node, name, at, bounds[i], bounds[i + 1]))
            self.made[name] = name
        return name

    def visit(self, name):
        node = self.nodes[name]
        data = [t for t in node.input if not t.startswith("^")]
        states = [self.state.get(parse_input(t)[0]) for t in data]
        if node.op == "Shape" and states and states[0] is not None:
            shape = self.shape(data[0])
            const = const_node(name, list(shape), node.attr["out_type"].type or 3)
            self.state[name] = None
            self.out.append(const)
            return
        mark = len(self.out)
        try:
            state, make = self.rule(node, data, states) or (None, None)
            inputs = [make(i) for i in range(self.parts)] if make else None
        except _Whole:
            del self.out[mark:]  # constants cut for this node, unused
            self.made = {k: v for k, v in self.made.items() if any(n.name == v for n in self.out)}
            state, inputs = None, None
        if inputs is None:
            self.state[name] = None
            self.out.append(copied(node, name, [self.whole(t) if not t.startswith("^") else t for t in node.input]))
            return
        self.state[name] = state
        for i in range(self.parts):
            copy = copied(node, f"{name}/col{i}", [])
            copy.input.extend(inputs[i])
            self.out.append(copy)

    def rule(self, node, data, states):
        op = node.op
        if all(s is None for s in states):
            if op == "MatMul" and not node.attr["transpose_b"].b and self.const(data[1]) is not None:
                n = self.shape(data[1])[1]
                if n >= MIN_COLUMNS and n % self.parts == 0 and not node.attr["transpose_a"].b:
                    bounds = [n * i // self.parts for i in range(self.parts + 1)]
                    w = self.const(data[1])
                    return (COLS, 1, bounds), lambda i: [data[0], self.cut(w, 1, bounds, i)]
            if op == "Conv2D" and self.const(data[1]) is not None and node.attr["data_format"].s in (b"", b"NHWC"):
                n = self.shape(data[1])[3]
                if n >= MIN_CHANNELS and n % (8 * self.parts) == 0:
                    bounds = [n * i // self.parts for i in range(self.parts + 1)]
                    w = self.const(data[1])
                    return (COLS, 3, bounds), lambda i: [data[0], self.cut(w, 3, bounds, i)]
            return None
        if any(s is not None and s[0] == PARTIAL for s in states):
            return None
        if op in ("Conv2D", "DepthwiseConv2dNative") and states[0] is not None and states[0][1] == 3 and \
                states[1] is None and self.const(data[1]) is not None:
            w = self.const(data[1])
            if op == "Conv2D":  # the input channels cut: partial sums
                return (PARTIAL,), lambda i: [self.branch(data[0], i), self.cut(w, 2, states[0][2], i)]
            if self.shape(data[1])[3] == 1:  # one filter per channel: the channels stay cut
                return states[0], lambda i: [self.branch(data[0], i), self.cut(w, 2, states[0][2], i)]
            return None
        if op == "MatMul":
            s = states[0]
            if s is None or s[1] != 1 or states[1] is not None or self.const(data[1]) is None or \
                    node.attr["transpose_a"].b or node.attr["transpose_b"].b:
                return None
            w = self.const(data[1])
            return (PARTIAL,), lambda i: [self.branch(data[0], i), self.cut(w, 0, s[2], i)]
        if op in ELEMENTWISE:
            out = self.shape(node.name)
            axes = {(s[1] + len(out) - len(self.shape(t)), tuple(s[2])) for t, s in zip(data, states) if s}
            if len(axes) != 1:
                return None
            axis, bounds = axes.pop()
            return (COLS, axis, list(bounds)), lambda i: [self.piece(t, i, axis, bounds, len(out)) for t in data]
        if op in ("Softmax", "LogSoftmax"):
            s = states[0]
            if s[1] == len(self.shape(data[0])) - 1:
                return None
            return s, lambda i: [self.branch(data[0], i)]
        if op == "Einsum":
            return self.einsum(node, data, states)
        if op == "Reshape":
            return self.reshape(node, data, states)
        return None

    def cut(self, const_node, axis, bounds, i):
        name = f"{const_node.name}/cut{axis}_{bounds[i]}_{bounds[i + 1]}"
        if name not in self.made:
            self.out.append(_sliced_const(const_node, name, axis, bounds[i], bounds[i + 1]))
            self.made[name] = name
        return name

    def einsum(self, node, data, states):
        ins, out = node.attr["equation"].s.decode().replace(" ", "").split("->")
        operands = ins.split(",")
        letters = {(operands[k][s[1]], tuple(s[2])) for k, s in enumerate(states) if s}
        if "." in ins or len(letters) != 1 or any(s is None for s in states):
            return None
        letter, bounds = letters.pop()
        if letter not in out or any(letter not in o for o in operands):
            return None
        return (COLS, out.index(letter), list(bounds)), lambda i: [self.branch(t, i) for t in data]

    def reshape(self, node, data, states):
        s, shape_in, shape_out = states[0], self.shape(data[0]), self.shape(node.name)
        target = const_ints(self.const(data[1]))
        if s is None or states[1] is not None or target is None or None in shape_in or None in shape_out:
            return None
        a, bounds = s[1], s[2]
        for b in range(a + 1, len(shape_in) + 1):
            for p in range(len(shape_out)):
                if math.prod(shape_in[:a]) != math.prod(shape_out[:p]):
                    continue
                for q in range(p + 1, len(shape_out) + 1):
                    if math.prod(shape_in[a:b]) != math.prod(shape_out[p:q]):
                        continue
                    inner_in, inner_out = math.prod(shape_in[a + 1:b]), math.prod(shape_out[p + 1:q])
                    if any(x * inner_in % inner_out for x in bounds) or target[p] == -1:
                        continue
                    new = [x * inner_in // inner_out for x in bounds]
                    dtype = self.nodes[parse_input(data[1])[0]].attr["dtype"].type

                    def make(i, p=p, new=new, dtype=dtype):
                        values = list(target)
                        values[p] = new[i + 1] - new[i]
                        name = f"{node.name}/col{i}_target"
                        if name not in self.made:
                            self.out.append(const_node(name, values, dtype))
                            self.made[name] = name
                        return [self.branch(data[0], i), name]
                    return (COLS, p, new), make
        return None


def split_columns(graph_def, outputs: list, shapes: dict, parts: int = 2):
    """The graph with its large Dense weights cut by columns, then rows (module docstring). Returns (GraphDef,
    {output: tensor}, [(node, "cols"/"partial")] of the exchanges: where the branches' pieces are put together)."""
    walk = _ColumnSplit(graph_def, shapes, parts)
    for name in needed_order(walk.nodes, [parse_input(o)[0] for o in outputs]):
        walk.visit(name)
    fetched = {o: walk.whole(o) for o in outputs}  # may add the nodes that put an output back together
    return assembled(graph_def, walk.out), fetched, walk.exchanges
