"""Which graphs keep the samples of a batch apart: `batch_rows(graph_def, inputs, outputs, shapes)` -> BatchRows.

A graph may be run on slices of its batch and the results concatenated on axis 0 (savedmodel/batch_split.py) only
if every output row depends on the matching input rows alone. The analysis walks the nodes the outputs need, each
after its inputs, and gives each tensor one of four states:

- same: the same value in every slice and in the whole batch (weights, constants, shapes of weights);
- rows(k): axis 0 holds B*k rows, sample i in rows [i*k, (i+1)*k) (k = 1: one row per sample; k > 1: a reshape
  merged each sample's rows into axis 0, as a Dense on [batch, time, features] does before its MatMul);
- size(k): a scalar equal to B*k (the batch size read with Shape and StridedSlice);
- shape(k): a 1-D integer vector whose first element is B*k and the rest `same` (a Reshape's target shape);
- channels(k) and channel_shape(k): the same as rows(k) and shape(k) behind a leading axis of size 1 ([1, B*k, ...]),
  the rows normalized as channels by the graph rules' LayerNorm in FusedBatchNorm's spelling (NCHW).

Per-op rules live in one table (batch_row_rules.RULES). The walk refuses, with the reason and the node: a reduction,
concatenation, gather or matmul across axis 0, a reshape whose rows would mix samples (or are not known not to), a
`same` tensor that may broadcast over axis 0, batch statistics, stateful and random ops, function calls that see
the batch (their bodies are not looked into; --freeze inlines them), and any op it does not know. Protos in, plain
data out; the static shapes are given by the caller (analysis/shapes.node_shapes).
"""

from __future__ import annotations

import dataclasses

from ..core.graph_view import parse_input
from ..core.op_support import Signatures
from ..errors import GraphError
from .batch_row_rules import CALLS, READS, RULES
from .batch_row_states import CHANNELS, ROWS, SAME_STATE, Context, Refused, State, where


@dataclasses.dataclass(frozen=True)
class BatchRows:
    """Whether a graph keeps the samples of its batch apart.

    Attributes:
        splittable: every output's rows depend only on the same rows of the batch inputs.
        reason: why not ("" when splittable), naming the node and its op.
        batch_inputs: the input tensors that carry the batch (axis 0); the others are passed whole to each slice.
    """

    splittable: bool
    reason: str = ""
    batch_inputs: tuple = ()


def batch_rows(graph_def, inputs: dict, outputs, shapes: dict | None = None, batch: int | None = None) -> BatchRows:
    """Can `graph_def` be run on slices of its batch, its outputs concatenated on axis 0?

    Args:
        graph_def: the graph (never modified).
        inputs: input tensor name ("node:0") -> its static shape (a tuple, None for unknown dims; None for an
            unknown rank). A scalar input is passed whole to each slice; an input of rank >= 1 with an unknown
            axis 0 carries the batch.
        outputs: the output tensor names.
        shapes: {node name: [shape or None per output]} (analysis/shapes.node_shapes); an op that needs a rank
            or a size it is not given refuses.
        batch: the batch size `shapes` were inferred at (node_shapes(..., batch=)), which makes the sizes a reshape
            computes known; then every rows(k) tensor must have B*k rows there, a check of the rules themselves.

    Returns:
        A BatchRows; a refusal is an answer, not an error.
    """
    nodes = {node.name: node for node in graph_def.node}
    context = Context(nodes, shapes or {})
    carried = []
    for name, shape in inputs.items():
        if shape is None:
            return BatchRows(False, f"input {name} has an unknown rank")
        if len(shape) and shape[0] is not None:
            return BatchRows(False, f"input {name} has a fixed leading dimension ({shape[0]}): no batch to split")
        context.states[parse_input(name)[0]] = [State(ROWS) if len(shape) else SAME_STATE]
        carried += [name] if len(shape) else []
    if not carried:
        return BatchRows(False, "no input carries a batch (an axis 0 of unknown size)")
    signatures = Signatures(graph_def.library)
    try:
        for name in needed_order(nodes, [parse_input(o)[0] for o in outputs]):
            if name not in context.states:
                context.states[name] = _checked(nodes[name], _visit(nodes[name], context, signatures), context,
                                                batch)
        for output in outputs:
            state = context.state(output)
            if state.kind != ROWS:
                raise Refused(f"output {output} does not carry the batch on axis 0 ({state})")
    except Refused as e:
        return BatchRows(False, str(e))
    return BatchRows(True, "", tuple(carried))


def _visit(node, context: Context, signatures: Signatures) -> list:
    """The states of the node's outputs (the last one repeats), or raise Refused."""
    data = [t for t in node.input if not t.startswith("^")]
    unseen = [t for t in data if parse_input(t)[0] not in context.states]
    if unseen:  # only a loop's back edge reaches a node before its inputs
        raise Refused(where(node, f"reads {unseen[0]} around a loop (TF1 control flow), which is not analysed"))
    states = [context.state(t) for t in data]
    if all(s == SAME_STATE for s in states):
        if node.op not in READS and _stateful(node.op, signatures):
            raise Refused(where(node, "a stateful or random op would run once per slice"))
        return [SAME_STATE]
    if node.op in CALLS or signatures.is_function(node.op):
        called = next((v.func.name for v in node.attr.values() if v.HasField("func")), node.op)
        raise Refused(where(node, f"calls function '{called}' with the batch; function bodies are not looked into "
                                  "(--freeze inlines them)"))
    rule = RULES.get(node.op)
    if rule is None:
        raise Refused(where(node, "this op is not known to keep the samples of a batch apart"))
    return rule(node, data, states, context)


def _checked(node, states: list, context: Context, batch: int | None) -> list:
    """The states, after checking that each rows(k) output has batch*k rows in the shapes inferred at `batch` (a
    channels(k) output: 1, then batch*k)."""
    for port, shape in enumerate(context.shapes.get(node.name) or []):
        state = states[min(port, len(states) - 1)]
        lead = {ROWS: (), CHANNELS: (1,)}.get(state.kind)
        if not batch or lead is None or not shape or len(shape) <= len(lead):
            continue
        found, want = tuple(shape[:len(lead) + 1]), (*lead, batch * state.k)
        if None not in found and found != want:
            raise Refused(where(node, f"output {port} is {list(found)} on its leading axes at batch {batch}, not "
                                      f"{list(want)} ({state}): the rows do not follow the batch as the rules expect"))
    return states


def _stateful(op: str, signatures: Signatures) -> bool:
    try:
        return signatures.get(op).is_stateful
    except GraphError:  # an op this TensorFlow does not know: stateful for all we know
        return True


def needed_order(nodes: dict, roots) -> list:
    """The nodes the roots need (through data and control inputs), each after its inputs (a TF1 loop's back edge,
    NextIteration -> Merge, is not followed twice: the walk refuses the loop)."""
    order, done, entered, stack = [], set(), set(), [(r, False) for r in roots if r in nodes]
    while stack:
        name, expanded = stack.pop()
        if name in done or (not expanded and name in entered):
            continue
        if expanded:
            done.add(name)
            order.append(name)
            continue
        entered.add(name)
        stack.append((name, True))
        for tensor in nodes[name].input:
            parent = parse_input(tensor.lstrip("^"))[0]
            if parent in nodes and parent not in done:
                stack.append((parent, False))
    return order
