"""A batch-1 split of a frozen CNN into horizontal image bands with halos, for tools/bench_batch_one.py.

`split_bands`: each branch computes the rows of every tensor that its share of the next cut tensor needs (its band
plus the halo each convolution adds, worked out backwards from the cut); a convolution gets its zero rows only at
the image's edges (a Pad before it, VALID padding; or, with explicit=True, EXPLICIT padding -- which TF 2.21's
oneDNN kernels abort on at 224x224: "tensor_format.h:428 Check failed ... Invalid index from the dimension: 1, 0,
H"), elementwise ops are fed the same rows of both operands (a Slice where one holds more). No exchange between the
branches inside a stage; at each cut the bands are concatenated. Protos in, GraphDef out; valid at batch 1.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2, node_def_pb2

from mp_rewrite.analysis.batch_rows import needed_order
from mp_rewrite.core.graph_view import parse_input
from mp_rewrite.savedmodel.row_split import concat_nodes, const_node, copied, node_dtype, slice_nodes

CONVOLUTIONS = frozenset({"Conv2D", "DepthwiseConv2dNative"})


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
        region = _descendants(nodes, parse_input(start)[0]) & set(needed_order(nodes, [parse_input(merge)[0]]))
        region.discard(parse_input(start)[0])
        new, merged, work[merge] = _band_stage(nodes, region, start, replaced.get(start, start), merge, shapes,
                                               parts, explicit, stage)
        out += new
        done |= region
        replaced[merge] = merged
    replaced.update({parse_input(k)[0] + ":0": v for k, v in list(replaced.items()) if parse_input(k)[1] == 0})
    replaced.update({parse_input(k)[0]: v for k, v in list(replaced.items()) if parse_input(k)[1] == 0})
    for name in needed_order(nodes, [parse_input(o)[0] for o in outputs]):
        if name in done:
            continue
        inputs = [replaced.get(t, t) for t in nodes[name].input]
        stale = [t for t in inputs if parse_input(t.lstrip("^"))[0] in done]
        if stale:
            raise ValueError(f"{name} reads {stale[0]} inside a band stage, not at its cut")
        out.append(copied(nodes[name], name, inputs))
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

    order = [n for n in needed_order(nodes, [parse_input(merge)[0]]) if n in region]
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
            new.extend(slice_nodes(name, local(t, i), [0, lo - have[0], 0, 0], [-1, hi - lo, -1, -1], dtype(t)))
        return name

    def dtype(t):
        return node_dtype(nodes[parse_input(t)[0]])

    made, flops = set(), [0, 0]
    start_key = start if ":" in start else start + ":0"
    for i in range(parts):
        lo, hi = need[start_key][i]
        new.extend(slice_nodes(f"{parse_input(start)[0]}/{tag}_{i}", start_now, [0, lo, 0, 0], [-1, hi - lo, -1, -1],
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
                copy = copied(node, f"{name}/{tag}_{i}", [crop(data[0], i, max(0, a), min(rows_in, b)), *data[1:]])
                if explicit:
                    copy.attr["padding"].s = b"EXPLICIT"
                    del copy.attr["explicit_paddings"].list.i[:]
                    copy.attr["explicit_paddings"].list.i.extend([0, 0, top, bottom, pl, pr, 0, 0])
                elif top or bottom or pl or pr:
                    pad = f"{name}/{tag}_{i}_pad"
                    paddings = const_node(pad + "/paddings", [0, 0, top, bottom, pl, pr, 0, 0])
                    paddings.attr["value"].tensor.tensor_shape.Clear()
                    paddings.attr["value"].tensor.tensor_shape.dim.add(size=4)
                    paddings.attr["value"].tensor.tensor_shape.dim.add(size=2)
                    pad_node = node_def_pb2.NodeDef(name=pad, op="Pad", input=[copy.input[0], pad + "/paddings"])
                    pad_node.attr["T"].type = node_dtype(node)
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
                copy = copied(node, f"{name}/{tag}_{i}", inputs)
            new.append(copy)
    merge_key = merge if ":" in merge else merge + ":0"
    concat = f"{parse_input(merge)[0]}/{tag}_whole"
    new += concat_nodes(concat, [crop(merge_key, i, bounds[i], bounds[i + 1]) for i in range(parts)], 1, dtype(merge))
    return new, concat, flops[0] / max(flops[1], 1)
