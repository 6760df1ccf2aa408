"""The batch-rows analysis' rules (batch_row_rules.py holds the table) for the ops that move, cut, join, reshape,
fill or read the shape of a tensor without computing on its values: whether axis 0 stays the batch, and how the
batch size flows through the shapes they read and make (size(k), shape(k), channel_shape(k))."""

from __future__ import annotations

import math

from ..core.graph_view import parse_input
from .batch_row_states import (CHANNEL_SHAPE, CHANNELS, ROWS, SAME, SAME_STATE, SHAPE, SIZE, Refused, State,
                               const_ints, refuse_batch_axis, rows_k, unary, where)


def shape_of(node, data, states, context):
    """Shape of rows: shape(k), with its other values where they are known."""
    out = []
    for tensor, state in zip(data, states):
        if state.kind != ROWS:
            raise Refused(where(node, f"takes the shape of {state}"))
        shape = context.shape(tensor)
        known = shape is not None and None not in shape[1:]
        out.append(State(SHAPE, state.k, tuple(shape[1:]) if known else None))
    return out


def strided_slice(node, data, states, context):
    """A slice of a shape (its batch size, or the rest), or of rows that keeps all of axis 0."""
    if any(s != SAME_STATE for s in states[1:]):
        raise Refused(where(node, "its slice bounds depend on the batch"))
    x = states[0]
    begin, strides = context.value(data[1], node), context.value(data[3], node)
    masks = {m: node.attr[m].i for m in ("begin_mask", "end_mask", "shrink_axis_mask", "new_axis_mask",
                                          "ellipsis_mask")}
    if x.kind == SHAPE and len(begin) == 1 and strides == [1] and not masks["new_axis_mask"] | masks["ellipsis_mask"]:
        start = 0 if masks["begin_mask"] & 1 else begin[0]
        length = (context.shape(data[0]) or (None,))[0]
        start = start + length if start < 0 and length is not None else start
        if start == 0 and masks["shrink_axis_mask"] & 1:
            return [State(SIZE, x.k)]
        if start == 0:
            end = None if masks["end_mask"] & 1 else context.value(data[2], node)[0]
            rest = x.rest if end is None or x.rest is None else x.rest[:max(0, end - 1)]
            return [State(SHAPE, x.k, rest)]
        if start > 0:
            return [SAME_STATE]
    if x.kind == ROWS and _keeps_axis_0(node, begin, strides, masks, context.rank(data[0], node)):
        return [x]
    raise Refused(where(node, f"slices axis 0 of {x}, the batch"))


def _keeps_axis_0(node, begin, strides, masks, rank: int) -> bool:
    if masks["new_axis_mask"] & 1:
        return False
    if masks["ellipsis_mask"] & 1:
        after = sum(1 for i in range(1, len(begin)) if not masks["new_axis_mask"] >> i & 1)
        return rank - after >= 1
    return ((masks["begin_mask"] & 1 or begin[0] == 0) and masks["end_mask"] & 1 and strides[0] == 1
            and not masks["shrink_axis_mask"] & 1)


def pack(node, data, states, context):
    """Pack of the batch size and constants (a shape), or of rows on an axis other than 0."""
    axis = node.attr["axis"].i
    if states[0].kind == SIZE and all(s == SAME_STATE for s in states[1:]) and axis == 0:
        values = [const_ints(context.nodes.get(parse_input(t)[0])) for t in data[1:]]
        return [State(SHAPE, states[0].k, None if None in values else tuple(v[0] for v in values))]
    if (axis == 0 and len(states) > 1 and states[1].kind == SIZE and all(s == SAME_STATE for s in states[2:])
            and const_ints(context.nodes.get(parse_input(data[0])[0])) == [1]):  # [1, B*k, ...]: channels
        values = [const_ints(context.nodes.get(parse_input(t)[0])) for t in data[2:]]
        return [State(CHANNEL_SHAPE, states[1].k, None if None in values else tuple(v[0] for v in values))]
    k = rows_k(node, states)
    if any(s.kind != ROWS for s in states):
        raise Refused(where(node, "stacks batch and non-batch tensors"))
    refuse_batch_axis(node, [axis], context.rank(data[0], node), "stacks on", new_axis=True)
    return [State(ROWS, k)]


def concat(node, data, states, context):
    """ConcatV2 of a shape and constants (a shape), or of rows on an axis other than 0."""
    values, axis_states = states[:-1], states[-1]
    axis = context.value(data[-1], node)
    if values[0].kind == SHAPE and all(s == SAME_STATE for s in values[1:]) and axis in ([0], [-1]):
        tails = [const_ints(context.nodes.get(parse_input(t)[0])) for t in data[1:-1]]
        known = values[0].rest is not None and None not in tails
        return [State(SHAPE, values[0].k, values[0].rest + tuple(v for t in tails for v in t) if known else None)]
    k = rows_k(node, values)
    if any(s.kind != ROWS for s in values) or axis_states != SAME_STATE:
        raise Refused(where(node, "concatenates batch and non-batch tensors"))
    refuse_batch_axis(node, axis, context.rank(data[0], node), "concatenates along")
    return [State(ROWS, k)]


def reshape(node, data, states, context):
    """Reshape of rows to a batch-sized shape, or to [-1, ...] where a row holds one sample's whole rows ([1, -1,
    ...]: the same, the rows on axis 1 as channels; and back)."""
    x, target = states
    # The layout of [B*k, ...] and of [1, B*k, ...] is the same: rows move between axes 0 and 1 as a whole.
    if x.kind in (ROWS, CHANNELS) and target.kind in (SHAPE, CHANNEL_SHAPE):
        return [State(ROWS if target.kind == SHAPE else CHANNELS, target.k)]
    if x.kind not in (ROWS, CHANNELS) or target != SAME_STATE:
        raise Refused(where(node, f"reshapes {x} to a shape {target}"))
    dims, shape = context.value(data[1], node), context.shape(data[0])
    lead = 1 if dims[:2] == [1, -1] else 0  # the axes before the rows: none, or one of size 1 (channels)
    if not dims or dims[lead] != -1 or -1 in dims[lead + 1:]:
        raise Refused(where(node, f"reshapes to {dims}: a fixed size on axis 0, the batch"))
    skip = 2 if x.kind == CHANNELS else 1
    if shape is None or None in shape[skip:]:
        raise Refused(where(node, f"reshapes {shape} to {dims}: whether rows would mix samples is not known"))
    per_sample, row = x.k * math.prod(shape[skip:]), math.prod(dims[lead + 1:])
    if row <= 0 or per_sample % row:
        raise Refused(where(node, f"reshapes {shape} to {dims}: a row would hold parts of two samples"))
    return [State(CHANNELS if lead else ROWS, per_sample // row)]


def fill(node, data, states, context):
    """Fill (or BroadcastTo) to a shape whose first value is the batch size: rows."""
    shape, value = states[:2] if node.op == "Fill" else states[::-1]
    if shape.kind != SHAPE or value.kind not in (SAME, ROWS) or (value.kind == ROWS and value.k != shape.k):
        raise Refused(where(node, f"fills a shape {shape} with {value}"))
    return [State(ROWS, shape.k)]


def expand_dims(node, data, states, context):
    """ExpandDims of the batch size to [B*k] (Grappler's spelling of a one-value Pack): shape(k); else of rows on
    an axis other than 0."""
    if states[0].kind == SIZE and states[1] == SAME_STATE and context.value(data[1], node) in ([0], [-1]):
        return [State(SHAPE, states[0].k, ())]
    return _expand_rows(node, data, states, context)


def tile(node, data, states, context):
    """Tile of a `same` tensor by multiples whose first is the batch size (ViT's class token, one per sample):
    rows, each sample's block of the whole tensor; else of rows, by multiples that leave axis 0 alone."""
    if states[0] == SAME_STATE and states[1].kind == SHAPE:
        shape = context.shape(data[0])
        if not shape or shape[0] is None:
            raise Refused(where(node, f"tiles {data[0]} ({shape}) by the batch size: its rows are not known"))
        return [State(ROWS, states[1].k * shape[0])]
    return _tile_rows(node, data, states, context)


def _constant_axis_rule(index: int, check):
    """A rule for ops whose input `index` is a constant that must leave axis 0 alone (`check(values, rank)`)."""
    def rule(node, data, states, context):
        if states[0].kind != ROWS or any(s != SAME_STATE for i, s in enumerate(states) if i):
            raise Refused(where(node, f"its parameters carry the batch ({', '.join(map(str, states))})"))
        if not check(context.value(data[index], node), context.rank(data[0], node)):
            raise Refused(where(node, f"its {data[index]} moves, slices or repeats axis 0, the batch"))
        return [states[0]]
    return rule


def squeeze(node, data, states, context):
    """Squeeze of named axes other than 0."""
    dims = list(node.attr["squeeze_dims"].list.i)
    if not dims:  # every size-1 axis goes: the batch too, for a slice of one sample
        raise Refused(where(node, "squeezes every axis of size 1, the batch's too when a slice holds one sample"))
    refuse_batch_axis(node, dims, context.rank(data[0], node), "squeezes")
    return unary(node, data, states, context)


def gather(node, data, states, context):
    """A lookup per index (rows of indices), or a gather along an axis other than 0."""
    params, indices = states[:2]
    axis = context.value(data[2], node)[0] if node.op == "GatherV2" else 0
    if params.kind == SHAPE and indices == SAME_STATE and axis == 0:
        return [_gathered_shape(node, data, params, context)]
    batch_dims = node.attr["batch_dims"].i if node.op == "GatherV2" else 0
    if params == SAME_STATE and indices.kind == ROWS and axis == 0:
        return [indices]  # a lookup per index: the output's axis 0 is the indices'
    rank = context.rank(data[0], node)
    axis = axis + rank if axis < 0 else axis
    if params.kind == ROWS and indices == SAME_STATE and axis >= 1:
        return [params]
    if params.kind == ROWS and indices.kind == ROWS and params.k == indices.k and batch_dims >= 1 and axis >= 1:
        return [params]
    raise Refused(where(node, f"gathers across the batch (params {params}, indices {indices}, axis {axis})"))


def _gathered_shape(node, data, shape: State, context) -> State:
    """Some values of a shape (tf.tensordot's free dimensions): shape(k) if the batch size comes first, else same."""
    picked = context.value(data[1], node)
    if 0 not in picked:
        return SAME_STATE
    if picked[0] != 0 or 0 in picked[1:] or len(context.shape(data[1]) or ()) != 1:
        raise Refused(where(node, f"moves the batch size within a shape (indices {picked})"))
    rest = None if shape.rest is None else tuple(shape.rest[i - 1] for i in picked[1:])
    return State(SHAPE, shape.k, rest)


def split(node, data, states, context):
    """Split, SplitV or Unpack along an axis other than 0: rows."""
    index, axis_index = (1, 0) if node.op == "Split" else (0, 2)
    if states[index].kind != ROWS or any(s != SAME_STATE for i, s in enumerate(states) if i != index):
        raise Refused(where(node, "its split sizes or axis carry the batch"))
    axis = node.attr["axis"].i if node.op == "Unpack" else context.value(data[axis_index], node)[0]
    refuse_batch_axis(node, [axis], context.rank(data[index], node), "splits")
    return [states[index]]


def slice_rows(node, data, states, context):
    """Slice that keeps all of axis 0 (begin 0, size -1)."""
    rule = _constant_axis_rule(1, lambda begin, rank: begin[:1] == [0])
    if context.value(data[2], node)[:1] != [-1]:
        raise Refused(where(node, "slices axis 0, the batch (its size is not -1)"))
    return rule(node, data, states, context)


_expand_rows = _constant_axis_rule(1, lambda axis, rank: (axis[0] + rank + 1 if axis[0] < 0 else axis[0]) > 0)
_tile_rows = _constant_axis_rule(1, lambda multiples, rank: multiples[:1] == [1])


def _pads_keep_axis_0(values, rank):
    return values[:2] == [0, 0]


transpose = _constant_axis_rule(1, lambda perm, rank: perm[:1] == [0])
pad = _constant_axis_rule(1, _pads_keep_axis_0)
