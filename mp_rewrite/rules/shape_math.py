"""`constant_target`: the value of a Reshape's computed target (Keras' Tensordot: `Shape -> GatherV2 -> Prod ->
Pack`), as a constant with -1 for the batch, when it is provably one.

The target is evaluated in numpy twice, with the input's unknown batch dimension set to 3 and to 7. Its ops only
pick and multiply dimensions (Shape, GatherV2, StridedSlice, Prod, Mul, Pack, ConcatV2, Identity), so each entry is a
product of the input's dimensions: one equal at both batch sizes does not contain the batch, one that grew by 7/3
contains it once and is the -1 (the entry Reshape infers from the element count). Anything else is not answered.
"""

from __future__ import annotations

import numpy as np

from .graph import EditableGraph

BATCHES = (3, 7)
MAX_NODES = 64


def constant_target(graph: EditableGraph, tensor: str) -> list | None:
    """The target as a list (-1 for the one entry that grows with the batch), or None."""
    values = [_evaluate(graph, tensor, batch, {}) for batch in BATCHES]
    if any(v is None or v.ndim != 1 for v in values) or values[0].shape != values[1].shape:
        return None
    small, large = (v.astype(np.int64) for v in values)
    grows = [i for i in range(len(small)) if small[i] != large[i]]
    if len(grows) > 1 or grows and large[grows[0]] * BATCHES[0] != small[grows[0]] * BATCHES[1]:
        return None
    if grows and (small < 0).any():  # a literal -1 already stands for one dimension (keras-hub's ViT patches)
        return None
    return [-1 if i in grows else int(v) for i, v in enumerate(small)]


def _evaluate(graph: EditableGraph, tensor: str, batch: int, seen: dict):
    """The value of an int32/int64 shape computation, or None when it uses anything but the ops above."""
    if tensor in seen:
        return seen[tensor]
    if len(seen) > MAX_NODES:
        return None
    value = graph.constant(tensor)
    node = graph.producer(tensor)
    if value is None and node is not None:
        args = [_evaluate(graph, t, batch, seen) for t in graph.data_inputs(node)] if node.op != "Shape" else []
        value = None if any(a is None for a in args) else _apply(graph, node, args, batch)
    seen[tensor] = value
    return value


def _apply(graph: EditableGraph, node, args: list, batch: int):
    op = node.op
    if op == "Shape":
        shape = graph.inferred_shape(node.input[0])
        if shape is None or any(d is None for d in shape[1:]):
            return None
        return np.array([batch if d is None else d for d in shape], np.int64)
    if op == "Identity":
        return args[0]
    if op == "Mul":
        return np.multiply(args[0], args[1])
    if op == "GatherV2" and ("batch_dims" not in node.attr or node.attr["batch_dims"].i == 0):
        return np.take(args[0], args[1], axis=int(args[2]))
    if op == "Prod":
        keep = "keep_dims" in node.attr and node.attr["keep_dims"].b
        return np.prod(args[0], axis=tuple(np.atleast_1d(args[1]).tolist()), keepdims=keep)
    if op == "Pack":
        return np.stack(args, axis=node.attr["axis"].i if "axis" in node.attr else 0)
    if op == "ConcatV2":
        return np.concatenate([np.atleast_1d(a) for a in args[:-1]], axis=int(args[-1]))
    if op == "StridedSlice":
        return _strided_slice(node, *args)
    return None


def _strided_slice(node, value, begin, end, strides):
    """A 1-D StridedSlice (begin/end/shrink masks only), else None."""
    masks = {key: node.attr[key].i if key in node.attr else 0
             for key in ("begin_mask", "end_mask", "shrink_axis_mask", "ellipsis_mask", "new_axis_mask")}
    if value.ndim != 1 or begin.size != 1 or masks["ellipsis_mask"] or masks["new_axis_mask"]:
        return None
    start = None if masks["begin_mask"] & 1 else int(begin[0])
    stop = None if masks["end_mask"] & 1 else int(end[0])
    if masks["shrink_axis_mask"] & 1:
        return value[int(begin[0])]
    return value[start:stop:int(strides[0])]

