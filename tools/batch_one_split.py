"""Batch-1 splits of a frozen GraphDef (issue 40, item 3), for tools/bench_batch_one.py: one sample's work in N
branches that TensorFlow's inter-op pool runs at once (served with one intra-op thread, no hand-off per op).

- `split_rows`: a Transformer's token rows. The input's token axis is cut into N slices; every op that is row-wise
  on that axis (elementwise ops that do not broadcast over it, matmuls on rows, LayerNorm's reductions over the
  features, reshapes that keep the token axis whole, an embedding lookup, the einsums of attention on the query's
  rows) runs once per slice; an op that needs every row (attention's keys and values, the pooling) is fed the slices
  concatenated -- the one exchange per attention layer. Any op without a rule is fed whole rows too, so the
  result rests on the rules' few row-wise facts, not on knowing every op of the graph.
- `split_bands`: a CNN's image in N horizontal bands. Each branch computes the rows of every tensor that its share
  of the merge tensor needs (its band plus the halo each convolution adds, worked out backwards from the merge
  point); a convolution gets its zero rows only at the image's edges (a Pad before it, VALID padding; or, with
  explicit=True, EXPLICIT padding -- which TF 2.21's oneDNN kernels abort on at 224x224: "tensor_format.h:428 Check
  failed ... Invalid index from the dimension: 1, 0, H"), elementwise ops are fed the same rows of both operands (a
  Slice where one holds more). No exchange between the branches before the merge.

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
CONVOLUTIONS = frozenset({"Conv2D", "DepthwiseConv2dNative"})
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
    fetched = {o: walk.whole(o) for o in outputs}
    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    result.node.extend(walk.out)
    return result, fetched, walk.fed_whole


# ------------------------------------------------------------------------------------------------- image bands

BAND_ELEMENTWISE = frozenset({"BiasAdd", "Relu", "Relu6", "AddV2", "Add", "Mul", "Sub", "Cast", "Identity",
                              "Sigmoid", "Tanh", "Elu", "Selu", "Maximum", "Minimum"})


def _descendants(nodes: dict, start: str) -> set:
    readers = {}
    for node in nodes.values():
        for t in node.input:
            readers.setdefault(parse_input(t.lstrip("^"))[0], []).append(node.name)
    seen, stack = {start}, [start]
    while stack:
        for reader in readers.get(stack.pop(), ()):
            if reader not in seen:
                seen.add(reader)
                stack.append(reader)
    return seen


def _conv_geometry(node, shapes: dict, in_shape, out_shape):
    """(kernel rows, stride, SAME's top padding, W padding (left, right)) of a 2-D convolution, NHWC."""
    filt = shapes.get(parse_input(node.input[1])[0], [None])[0]
    if not filt or node.attr["data_format"].s not in (b"", b"NHWC") or any(d != 1 for d in
                                                                        node.attr["dilations"].list.i):
        raise ValueError(f"{node.name}: only NHWC convolutions without dilation are split in bands")
    kh, kw = filt[0], filt[1]
    sh, sw = node.attr["strides"].list.i[1], node.attr["strides"].list.i[2]
    padding = node.attr["padding"].s
    if padding == b"SAME":
        th = max((out_shape[1] - 1) * sh + kh - in_shape[1], 0)
        tw = max((out_shape[2] - 1) * sw + kw - in_shape[2], 0)
        return kh, sh, th // 2, (tw // 2, tw - tw // 2)
    if padding == b"VALID":
        return kh, sh, 0, (0, 0)
    raise ValueError(f"{node.name}: padding {padding!r} is not split in bands")


def layer_output(graph_def, layer: str, op: str) -> str:
    """The tensor of the last node of op `op` inside Keras layer `layer` (a band cut: "block_5_add", "AddV2")."""
    found = [n.name for n in graph_def.node if n.op == op and f"/{layer}" in n.name]
    if not found:
        raise ValueError(f"no {op} in a layer {layer}")
    return found[-1] + ":0"


def split_bands(graph_def, cuts: list, outputs: list, shapes: dict, parts: int = 2, explicit: bool = False):
    """The graph with each stage between consecutive `cuts` (tensor names: the image first, then the tensors where
    the bands are concatenated) run as `parts` horizontal bands with halos (module docstring). Returns (GraphDef,
    {output: tensor}, {stage: rows computed over rows of the whole, FLOP-weighted by convolution})."""
    nodes = {n.name: n for n in graph_def.node}
    replaced, out, work = {}, [], {}
    done = set()
    for stage, (start, merge) in enumerate(zip(cuts, cuts[1:])):
        region = _descendants(nodes, parse_input(start)[0]) & set(_order(nodes, [parse_input(merge)[0]]))
        region.discard(parse_input(start)[0])
        new, merged, work[merge] = _band_stage(nodes, region, start, replaced.get(start, start), merge, shapes,
                                               parts, explicit, stage)
        out += new
        done |= region
        replaced[merge] = merged
    replaced.update({parse_input(k)[0] + ":0": v for k, v in list(replaced.items()) if parse_input(k)[1] == 0})
    replaced.update({parse_input(k)[0]: v for k, v in list(replaced.items()) if parse_input(k)[1] == 0})
    for name in _order(nodes, [parse_input(o)[0] for o in outputs]):
        if name in done:
            continue
        inputs = [replaced.get(t, t) for t in nodes[name].input]
        stale = [t for t in inputs if parse_input(t.lstrip("^"))[0] in done]
        if stale:
            raise ValueError(f"{name} reads {stale[0]} inside a band stage, not at its cut")
        out.append(_copy(nodes[name], name, inputs))
    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    result.node.extend(out)
    return result, {o: replaced.get(o, o) for o in outputs}, work


def _band_stage(nodes, region, start, start_now, merge, shapes, parts, explicit, stage):
    """The nodes of one stage: per branch, each region node on the rows its consumers need."""
    def shape(t):
        name, port = parse_input(t)
        return (shapes.get(name) or [None])[port]

    order = [n for n in _order(nodes, [parse_input(merge)[0]]) if n in region]
    rows_m = shape(merge)[1]
    bounds = [round(i * rows_m / parts) for i in range(parts + 1)]
    need = {merge: [(bounds[i], bounds[i + 1]) for i in range(parts)]}  # tensor -> [(lo, hi) per branch]

    def demand(t, ranges):
        t = t if ":" in t else t + ":0"
        old = need.get(t)
        need[t] = ranges if old is None else [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(old, ranges)]

    need[merge if ":" in merge else merge + ":0"] = need.pop(merge)
    geometry = {}
    for name in reversed(order):
        node = nodes[name]
        ranges = need.get(name + ":0")
        if ranges is None:
            continue
        data = [t for t in node.input if not t.startswith("^")]
        if node.op in CONVOLUTIONS:
            in_shape, out_shape = shape(data[0]), shape(name)
            kh, sh, pt, pw = _conv_geometry(node, shapes, in_shape, out_shape)
            geometry[name] = (kh, sh, pt, pw, in_shape[1])
            demand(data[0], [(max(0, lo * sh - pt), min(in_shape[1], (hi - 1) * sh - pt + kh)) for lo, hi in ranges])
        elif node.op in BAND_ELEMENTWISE:
            for t in data:
                s = shape(t)
                if parse_input(t)[0] in region or parse_input(t)[0] == parse_input(start)[0]:
                    if s is None or len(s) != 4:
                        raise ValueError(f"{name}: operand {t} is not an image")
                    demand(t, ranges)
                elif s is not None and len(s) == 4 and s[1] != 1:
                    raise ValueError(f"{name}: {t} broadcasts over the rows")
        else:
            raise ValueError(f"{name} ({node.op}) is not split in bands")
    new, tag = [], f"band{stage}"

    def local(t, i):  # the branch's tensor for a region tensor, or the shared one
        name, port = parse_input(t)
        if name == parse_input(start)[0]:
            return f"{name}/{tag}_{i}"
        if name in region:
            return f"{name}/{tag}_{i}" + (f":{port}" if port else "")
        return t

    def crop(t, i, lo, hi):  # the branch's tensor cut to rows [lo, hi)
        have = need[t if ":" in t else t + ":0"][i]
        if have == (lo, hi):
            return local(t, i)
        if not (have[0] <= lo and hi <= have[1]):
            raise ValueError(f"{t}: rows {lo}-{hi} wanted, {have} computed")
        name = f"{parse_input(t)[0]}/{tag}_{i}_crop{lo}_{hi}"
        if name not in made:
            made.add(name)
            new.extend(_slice(name, local(t, i), [0, lo - have[0], 0, 0], [-1, hi - lo, -1, -1], dtype(t)))
        return name

    def dtype(t):
        return _dtype(nodes[parse_input(t)[0]])

    made, flops = set(), [0, 0]
    start_key = start if ":" in start else start + ":0"
    for i in range(parts):
        lo, hi = need[start_key][i]
        new.extend(_slice(f"{parse_input(start)[0]}/{tag}_{i}", start_now, [0, lo, 0, 0], [-1, hi - lo, -1, -1],
                          dtype(start)))
    for name in order:
        node = nodes[name]
        ranges = need.get(name + ":0")
        data = [t for t in node.input if not t.startswith("^")]  # control inputs inside a stage are dropped
        for i, (lo, hi) in enumerate(ranges):
            if node.op in CONVOLUTIONS:
                kh, sh, pt, (pl, pr), rows_in = geometry[name]
                a, b = lo * sh - pt, (hi - 1) * sh - pt + kh
                top, bottom = max(0, -a), max(0, b - rows_in)
                copy = _copy(node, f"{name}/{tag}_{i}", [crop(data[0], i, max(0, a), min(rows_in, b)), *data[1:]])
                if explicit:
                    copy.attr["padding"].s = b"EXPLICIT"
                    del copy.attr["explicit_paddings"].list.i[:]
                    copy.attr["explicit_paddings"].list.i.extend([0, 0, top, bottom, pl, pr, 0, 0])
                elif top or bottom or pl or pr:
                    pad = f"{name}/{tag}_{i}_pad"
                    paddings = _const(pad + "/paddings", [0, 0, top, bottom, pl, pr, 0, 0])
                    paddings.attr["value"].tensor.tensor_shape.Clear()
                    paddings.attr["value"].tensor.tensor_shape.dim.add(size=4)
                    paddings.attr["value"].tensor.tensor_shape.dim.add(size=2)
                    pad_node = node_def_pb2.NodeDef(name=pad, op="Pad", input=[copy.input[0], pad + "/paddings"])
                    pad_node.attr["T"].type = _dtype(node)
                    pad_node.attr["Tpaddings"].type = 3
                    new += [paddings, pad_node]
                    copy.input[0] = pad
                    copy.attr["padding"].s = b"VALID"
                else:
                    copy.attr["padding"].s = b"VALID"
                out_shape = shape(name)
                flops[0] += (hi - lo) * out_shape[2] * out_shape[3]
                if i == 0:
                    flops[1] += out_shape[1] * out_shape[2] * out_shape[3]
            else:
                inputs = [crop(t, i, lo, hi) if (parse_input(t)[0] in region or parse_input(t)[0] ==
                                                   parse_input(start)[0]) else t for t in data]
                copy = _copy(node, f"{name}/{tag}_{i}", inputs)
            new.append(copy)
    merge_key = merge if ":" in merge else merge + ":0"
    concat = f"{parse_input(merge)[0]}/{tag}_whole"
    new += _concat(concat, [crop(merge_key, i, bounds[i], bounds[i + 1]) for i in range(parts)], 1, dtype(merge))
    return new, concat, flops[0] / max(flops[1], 1)
