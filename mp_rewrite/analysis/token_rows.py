"""Which ops of one sample can run on slices of its token rows: `token_rows(...)` -> TokenRows, a plan or a refusal.

At batch 1 a Transformer's work can still use two cores: the tokens are cut into N slices and every op that is
row-wise on the token axis runs once per slice (savedmodel/row_split.py builds that graph from the plan). The walk
visits the nodes the outputs need, each after its inputs, and gives each node one state:

- whole (None): computed once, from whole tensors (weights, shapes of weights, ops fed every row);
- split (SPLIT, axis): computed once per slice, its output cut along `axis`;
- local (LOCAL,): computed once per slice from per-branch values only (a slice's Shape and what it feeds).

An op splits only by a rule: elementwise ops whose unsplit operands do not broadcast over the token axis (an operand
of full length along it, such as an attention mask on the query rows, is sliced too), matmuls on rows (MatMul,
BatchMatMul), Transpose and ExpandDims, a Tile that repeats no token, reductions over other axes, reshapes that
keep the token axis whole, an embedding lookup, softmax over another axis, einsums on a letter the other operands
lack (attention on the query rows, its keys and values gathered), a Fill or BroadcastTo to the shape of a split
tensor (AddN counts as elementwise: Grappler's spelling of a LayerNorm's sums); a batched matmul splits
on the columns of its second operand instead where its rows would reach a softmax over them (attention's scores
spelled keys @ queries^T). Any other op that reads a split tensor is fed the slices concatenated ("gathered"); a
tensor made from a slice's shape is computed whole (a slice's Shape is then its value at batch 1, a constant). So
the plan rests on those few row-wise facts, not on knowing every op; the split graph's outputs are checked against
the whole graph's by the caller all the same. The rules are token_row_walk.py's. A model where no matmul runs on
split rows is refused, naming the node where the rows were first gathered: there is nothing worth splitting. Protos
in, plain data out; shapes are the caller's (analysis/shapes.node_shapes at batch 1). A graph that leaves the token
count unknown (keras-hub exports it so) is planned at a stand-in count the caller pins (`others=`); the plan then
makes nothing of that count -- no constant shape, no reshape target naming it -- and the split graph cuts the rows
it is given at run time (`unknown_length`).

A model whose input has no token axis -- an image cut into patches (ViT) -- makes its tokens inside: where the
input's own plan is refused, the tensors it feeds before its first matmul, of shape [1, tokens, features] at batch
1, are tried as the rows to cut (the earliest that splits the most matmuls, where that is half of them or more;
only for an input of static shape but its batch); what computes them runs once, whole (`source` is then the input
they come from, `input` the tensor cut).
"""

from __future__ import annotations

import dataclasses

from ..core.graph_view import parse_input
from .batch_rows import needed_order
from .token_row_walk import ELEMENTWISE, LOCAL, SPLIT, WORK, Refused, RowWalk

__all__ = ["ELEMENTWISE", "LOCAL", "SPLIT", "WORK", "TokenRows", "row_plan", "token_rows"]


@dataclasses.dataclass(frozen=True)
class TokenRows:
    """A plan to run one sample's token rows in `parts` slices, or why not.

    Attributes:
        splittable: a plan exists (some matmul runs on split rows).
        reason: why not ("" when splittable), naming the node.
        input: the tensor whose `axis` is cut (a graph input, or a tensor made from one: the module docstring);
            rank: its rank; bounds: the slices' row bounds (parts + 1).
        source: the graph input `input` is, or is computed from.
        order: the nodes the outputs need, each after its inputs.
        states: {node: None | (SPLIT, axis) | (LOCAL,)}.
        gathers: {split node: inputs it reads whole (attention's keys and values)}.
        slices: {split node: ((unsplit operand, its axis, its rank), ...) sliced like the rows}.
        reshapes: {split Reshape: position of the token axis in its constant target, rewritten per slice}.
        fed_whole: ((node, op, why), ...) of the ops with split inputs fed every row.
        gathered: {tensor: why} of every tensor whose slices are concatenated (outputs included), or for a
            per-slice value, computed again whole.
        constants: {Shape node: its value at batch 1} for a slice's Shape whose whole value is needed.
        outputs: the output tensors.
        split_work: how many matmuls and einsums run once per slice (what makes a plan worth having).
        unknown_length: the graph leaves the input's token count unknown (keras-hub's export): the plan was made
            at a stand-in count (`bounds` are its), and the split graph cuts the rows it is given at run time.
    """

    splittable: bool
    reason: str = ""
    input: str = ""
    axis: int = 1
    rank: int = 0
    bounds: tuple = ()
    order: tuple = ()
    states: dict = dataclasses.field(default_factory=dict)
    gathers: dict = dataclasses.field(default_factory=dict)
    slices: dict = dataclasses.field(default_factory=dict)
    reshapes: dict = dataclasses.field(default_factory=dict)
    fed_whole: tuple = ()
    gathered: dict = dataclasses.field(default_factory=dict)
    constants: dict = dataclasses.field(default_factory=dict)
    outputs: tuple = ()
    split_work: int = 0
    unknown_length: bool = False
    source: str = ""

    @property
    def parts(self) -> int:
        """The number of slices."""
        return len(self.bounds) - 1


def token_rows(graph_def, inputs: dict, outputs, shapes: dict, parts: int = 2) -> TokenRows:
    """The plan with the most split matmuls over the inputs that have a token axis (axis 1 of static length at
    batch 1, at least 2 * parts rows), or the first input's refusal.

    Args:
        graph_def: the frozen graph (never modified); inputs: its input tensors ("node:0"), in order;
        outputs: its output tensors; shapes: node_shapes(graph_def, batch=1), with `others=` a stand-in length
            where the graph leaves it unknown (the plan then holds at every length: row_plan); parts: the number
            of slices.
    """
    refusals, plans = [], []
    for tensor in inputs:
        found = row_plan(graph_def, tensor, 1, outputs, shapes, parts)
        if not found.splittable:
            found = _made_inside(graph_def, tensor, outputs, shapes, parts) or found
        (plans if found.splittable else refusals).append(found)
    if plans:
        return max(plans, key=lambda plan: plan.split_work)
    if not refusals:
        return TokenRows(False, "the graph has no input")
    return TokenRows(False, "; ".join(r.reason if tensor in r.reason else f"{tensor}: {r.reason}"
                                      for tensor, r in zip(inputs, refusals)))


def row_plan(graph_def, input_tensor: str, axis: int, outputs, shapes: dict, parts: int = 2,
             whole_ops=()) -> TokenRows:
    """The plan for cutting `input_tensor`'s `axis` into `parts` slices (module docstring); `whole_ops`: op types
    to feed whole rows even where a rule would split them (the benchmark's variants)."""
    declared = _declared_shape(graph_def, input_tensor)
    pinned = declared is not None and axis < len(declared) and declared[axis] is None
    walk = RowWalk(graph_def, shapes, frozenset(whole_ops), pinned)
    shape = walk.shape(input_tensor)
    if not shape or axis >= len(shape) or shape[axis] is None:
        return TokenRows(False, f"input {input_tensor} has no axis {axis} of static length at batch 1 ({shape})")
    walk.rows = shape[axis]
    if walk.rows < 2 * parts:
        return TokenRows(False, f"input {input_tensor} has {walk.rows} rows on axis {axis}: too few for {parts} "
                                f"slices")
    input_name = parse_input(input_tensor)[0]
    order = tuple(needed_order(walk.nodes, [parse_input(o)[0] for o in outputs]))
    if input_name not in order:
        return TokenRows(False, f"no output depends on input {input_tensor}")
    try:
        for name in order:
            if name == input_name:
                walk.states[name] = (SPLIT, axis)
            else:
                walk.visit(name)
    except Refused as why:
        return TokenRows(False, str(why))
    for output in outputs:
        walk.whole(output, "an output")
    work = sum(1 for name in order if walk.nodes[name].op in WORK and walk.axis(name) is not None)
    if not work:
        first = walk.fed_whole[0] if walk.fed_whole else None
        where = f"node '{first[0]}' (op {first[1]}) needs every token row ({first[2]})" if first else \
            "no matmul reads the token rows"
        return TokenRows(False, f"nothing worth splitting on the token rows of {input_tensor}: {where} before any "
                                "matmul runs on split rows")
    bounds = tuple(round(i * walk.rows / parts) for i in range(parts + 1))
    return TokenRows(True, "", input_tensor, axis, len(shape), bounds,
                     order, walk.states, walk.gathers, walk.slices, walk.reshapes, tuple(walk.fed_whole),
                     walk.gathered, walk.constants, tuple(outputs), work, pinned, input_tensor)


def _made_inside(graph_def, input_tensor: str, outputs, shapes: dict, parts: int) -> TokenRows | None:
    """The plan on tokens the graph makes from `input_tensor` (module docstring), or None: of the tensors of shape
    [1, tokens, features] at batch 1 that the input feeds before its first matmul (the first output of a node of
    one output), the earliest whose plan splits the most matmuls, and only where it splits half of them or more (a
    hierarchical model -- SegFormer's MiT -- turns its tokens back into an image in every block: cut, it would
    exchange rows at every block for a few split matmuls). Only for an input of static shape but its batch: where
    the graph leaves a dimension unknown, the caller's stand-in for it would be taken for the token count."""
    declared = _declared_shape(graph_def, input_tensor)
    if not declared or None in declared[1:]:
        return None
    nodes = {n.name: n for n in graph_def.node}
    fed, best = {parse_input(input_tensor)[0]}, None
    for name in needed_order(nodes, [parse_input(o)[0] for o in outputs]):
        node = nodes[name]
        if name in fed or not any(parse_input(t.lstrip("^"))[0] in fed for t in node.input):
            continue
        fed.add(name)
        if node.op in WORK:
            break
        found = shapes.get(name) or ()
        shape = found[0] if len(found) == 1 else None
        if not shape or len(shape) != 3 or shape[0] != 1 or shape[1] is None or shape[1] < 2 * parts:
            continue
        found = row_plan(graph_def, f"{name}:0", 1, outputs, shapes, parts)
        if found.splittable and (best is None or found.split_work > best.split_work):
            best = dataclasses.replace(found, source=input_tensor)
    work = sum(nodes[name].op in WORK for name in best.order) if best else 0
    return best if best and 2 * best.split_work >= work else None


def _declared_shape(graph_def, tensor: str):
    """The shape a Placeholder, or a function's _Arg, declares (None for an unknown dimension), or None (no such
    node, unknown rank)."""
    name = parse_input(tensor)[0]
    node = next((n for n in graph_def.node if n.name == name and n.op in ("Placeholder", "_Arg")), None)
    if node is not None and "shape" in node.attr:
        shape = node.attr["shape"].shape
    elif node is not None and "_output_shapes" in node.attr and node.attr["_output_shapes"].list.shape:
        shape = node.attr["_output_shapes"].list.shape[0]
    else:
        return None
    return None if shape.unknown_rank else [d.size if d.size >= 0 else None for d in shape.dim]
