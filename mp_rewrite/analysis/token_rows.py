"""Which ops of one sample can run on slices of its token rows: `token_rows(...)` -> TokenRows, a plan or a refusal.

At batch 1 a Transformer's work can still use two cores: the tokens are cut into N slices and every op that is
row-wise on the token axis runs once per slice (savedmodel/row_split.py builds that graph from the plan). The walk
visits the nodes the outputs need, each after its inputs, and gives each node one state:

- whole (None): computed once, from whole tensors (weights, shapes of weights, ops fed every row);
- split (SPLIT, axis): computed once per slice, its output cut along `axis`;
- local (LOCAL,): computed once per slice from per-branch values only (a slice's Shape and what it feeds).

An op splits only by a rule: elementwise ops whose unsplit operands do not broadcast over the token axis (an
operand of full length along it, such as an attention mask on the query rows, is sliced too), matmuls on rows
(MatMul, BatchMatMul), reductions over other axes, reshapes that keep the token axis whole, an embedding lookup,
softmax over another axis, einsums on a letter the other operands lack (attention on the query rows, its keys and
values gathered), a Fill to the shape of a split tensor.
Any other op that reads a split tensor is fed the slices concatenated ("gathered"), so the plan rests on those
few row-wise facts, not on knowing every op; the split graph's outputs are checked against the whole graph's by
the caller all the same. A model where no matmul runs on split rows is refused, naming the node where the rows
were first gathered: there is nothing worth splitting. Protos in, plain data out; shapes are the caller's
(analysis/shapes.node_shapes at batch 1).
"""

from __future__ import annotations

import dataclasses
import math

from ..core.graph_view import parse_input
from .batch_row_states import const_ints
from .batch_rows import _topological

ELEMENTWISE = frozenset({"AddV2", "Add", "Sub", "Mul", "RealDiv", "SquaredDifference", "Rsqrt", "Sqrt", "Erf", "Erfc",
                         "Identity", "Cast", "Relu", "Relu6", "Less", "Greater", "SelectV2", "BiasAdd", "Tanh",
                         "Sigmoid", "Maximum", "Minimum", "Neg", "Square", "Exp", "Elu", "Selu", "Softplus",
                         "StopGradient", "Snapshot", "LogicalAnd", "LogicalOr", "LogicalNot", "Equal", "NotEqual",
                         "GreaterEqual", "LessEqual", "Log", "Abs", "Reciprocal", "Pow", "DivNoNan"})
BATCH_MATMULS = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod"})
WORK = frozenset({"MatMul", "Einsum"}) | BATCH_MATMULS  # what a split must cut
SPLIT, LOCAL = "split", "local"


class _FedWhole(Exception):
    """An op is not known to be row-wise on its input's split axis: it is fed whole rows."""


class _Refused(Exception):
    """No plan: the message names the node."""


@dataclasses.dataclass(frozen=True)
class TokenRows:
    """A plan to run one sample's token rows in `parts` slices, or why not.

    Attributes:
        splittable: a plan exists (some matmul runs on split rows).
        reason: why not ("" when splittable), naming the node.
        input: the input tensor whose `axis` is cut; rank: its rank; bounds: the slices' row bounds (parts + 1).
        order: the nodes the outputs need, each after its inputs.
        states: {node: None | (SPLIT, axis) | (LOCAL,)}.
        gathers: {split node: inputs it reads whole (attention's keys and values)}.
        slices: {split node: ((unsplit operand, its axis, its rank), ...) sliced like the rows}.
        reshapes: {split Reshape: position of the token axis in its constant target, rewritten per slice}.
        fed_whole: ((node, op, why), ...) of the ops with split inputs fed every row.
        gathered: {tensor: why} of every tensor whose slices are concatenated (outputs included).
        outputs: the output tensors.
        split_work: how many matmuls and einsums run once per slice (what makes a plan worth having).
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
    outputs: tuple = ()
    split_work: int = 0

    @property
    def parts(self) -> int:
        """The number of slices."""
        return len(self.bounds) - 1


def token_rows(graph_def, inputs: dict, outputs, shapes: dict, parts: int = 2) -> TokenRows:
    """The plan with the most split matmuls over the inputs that have a token axis (axis 1 of static length at
    batch 1, at least 2 * parts rows), or the first input's refusal.

    Args:
        graph_def: the frozen graph (never modified); inputs: its input tensors ("node:0"), in order;
        outputs: its output tensors; shapes: node_shapes(graph_def, batch=1); parts: the number of slices.
    """
    refusals, plans = [], []
    for tensor in inputs:
        found = row_plan(graph_def, tensor, 1, outputs, shapes, parts)
        (plans if found.splittable else refusals).append(found)
    if plans:
        return max(plans, key=lambda plan: plan.split_work)
    return refusals[0] if refusals else TokenRows(False, "the graph has no input")


def row_plan(graph_def, input_tensor: str, axis: int, outputs, shapes: dict, parts: int = 2,
             whole_ops=()) -> TokenRows:
    """The plan for cutting `input_tensor`'s `axis` into `parts` slices (module docstring); `whole_ops`: op types
    to feed whole rows even where a rule would split them (the benchmark's variants)."""
    walk = _Walk(graph_def, shapes, frozenset(whole_ops))
    shape = walk.shape(input_tensor)
    if not shape or axis >= len(shape) or shape[axis] is None:
        return TokenRows(False, f"input {input_tensor} has no axis {axis} of static length at batch 1 ({shape})")
    walk.rows = shape[axis]
    if walk.rows < 2 * parts:
        return TokenRows(False, f"input {input_tensor} has {walk.rows} rows on axis {axis}: too few for {parts} "
                                f"slices")
    input_name = parse_input(input_tensor)[0]
    order = tuple(_topological(walk.nodes, [parse_input(o)[0] for o in outputs]))
    if input_name not in order:
        return TokenRows(False, f"no output depends on input {input_tensor}")
    try:
        for name in order:
            if name == input_name:
                walk.states[name] = (SPLIT, axis)
            else:
                walk.visit(name)
    except _Refused as why:
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
                     walk.gathered, tuple(outputs), work)


class _Walk:
    """The states of the nodes, and what each split or fed-whole node needs (TokenRows' fields)."""

    def __init__(self, graph_def, shapes: dict, whole_ops: frozenset):
        self.nodes = {n.name: n for n in graph_def.node}
        self.shapes, self.whole_ops, self.rows = shapes, whole_ops, 0
        self.states, self.gathers, self.slices, self.reshapes, self.gathered = {}, {}, {}, {}, {}
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
            if key not in self.gathered:
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
                raise _FedWhole("asked to run whole")
            axis, gather, sliced, reshape = self.rule(node, data)
        except _FedWhole as why:
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
        Fill to the shape of a split tensor (ones_like) is split as that tensor is; any other tensor made from a
        slice's shape refuses the plan (where its rows lie is not known)."""
        if node.op == "Fill":
            dims = self.nodes.get(parse_input(data[0])[0])
            if dims is not None and dims.op == "Shape" and self.axis(dims.input[0]) is not None:
                return (SPLIT, self.axis(dims.input[0]))
        shape = self.shape(node.name)
        if node.op != "Shape" and (shape is None or len(shape) > 1):
            raise _Refused(f"node '{node.name}' (op {node.op}) makes a tensor from a slice's shape; where its rows "
                           "lie is not known")
        return (LOCAL,)

    # ------------------------------------------------------------------------------------- the per-op rules

    def rule(self, node, data):
        """(output axis, inputs to gather whole, [(unsplit operand, axis, rank)] to slice, the token axis's position
        in a constant Reshape target to rewrite per slice or None), or raise _FedWhole."""
        op = node.op
        if op in ELEMENTWISE:
            return self._elementwise(node, data)
        if op == "MatMul":
            if node.attr["transpose_a"].b or self.axis(data[0]) != 0:
                raise _FedWhole("its rows are not split")
            return 0, [data[1]] if self.axis(data[1]) is not None else [], [], None
        if op == "Einsum":
            return self._einsum(node, data)
        if op in BATCH_MATMULS:  # a Dense on [batch, tokens, features], or attention spelled as matmuls
            rank, out = len(self.shape(data[0]) or ()), len(self.shape(node.name) or ())
            if not rank or node.attr["adj_x"].b or self.axis(data[0]) != rank - 2:
                raise _FedWhole("its rows are not split")
            return out - 2, [data[1]] if self.axis(data[1]) is not None else [], [], None
        if op in ("Softmax", "LogSoftmax"):
            rank = len(self.shape(data[0]) or ())
            if self.axis(data[0]) in (None, rank - 1):
                raise _FedWhole("normalizes over the split axis")
            return self.axis(data[0]), [], [], None
        if op in REDUCTIONS:
            return self._reduction(node, data)
        if op == "Reshape":
            return self._reshape(node, data)
        if op == "GatherV2":
            axis = const_ints(self.nodes.get(parse_input(data[2])[0]))
            if self.axis(data[0]) is not None or self.axis(data[1]) is None or axis != [0] or \
                    node.attr["batch_dims"].i:
                raise _FedWhole("not a lookup by split indices")
            return self.axis(data[1]), [], [], None
        raise _FedWhole("no rule")

    def _elementwise(self, node, data):
        out = self.shape(node.name)
        if out is None:
            raise _FedWhole("rank unknown")
        axes = set()
        for t in data:
            shape = self.shape(t)
            if shape is None:
                raise _FedWhole(f"rank of {t} unknown")
            if self.axis(t) is not None:
                axes.add(self.axis(t) + len(out) - len(shape))
        if len(axes) != 1:
            raise _FedWhole("split inputs do not line up")
        axis, sliced = axes.pop(), []
        for t in data:
            shape = self.shape(t)
            at = axis - (len(out) - len(shape))
            if self.axis(t) is not None or self.states.get(parse_input(t)[0]) is not None or at < 0 or \
                    shape[at] == 1:
                continue
            if shape[at] != self.rows:
                raise _FedWhole(f"{t} {shape} broadcasts over the split axis")
            sliced.append((t, at, len(shape)))  # a mask on the query rows, say: each slice takes its rows
        return axis, [], sliced, None

    def _einsum(self, node, data):
        equation = node.attr["equation"].s.decode()
        ins, out = equation.replace(" ", "").split("->")
        operands = ins.split(",")
        if "." in equation or len(operands) != len(data):
            raise _FedWhole("an ellipsis")
        split = [i for i, t in enumerate(data) if self.axis(t) is not None]
        first = split[0]
        letter = operands[first][self.axis(data[first])]
        others = [operands[i] for i in range(len(operands)) if i != first]
        if letter not in out or any(letter in o for o in others):
            raise _FedWhole("contracts or shares the split axis")
        return out.index(letter), [data[i] for i in split[1:]], [], None

    def _reduction(self, node, data):
        axis, rank = self.axis(data[0]), len(self.shape(data[0]) or ())
        reduced = [a % rank for a in (const_ints(self.nodes.get(parse_input(data[1])[0])) or [axis])] if rank \
            else [axis]
        if axis is None or axis in reduced or self.axis(data[1]) is not None:
            raise _FedWhole("reduces the split axis")
        keep = node.attr["keep_dims"].b
        return (axis if keep else axis - sum(a < axis for a in reduced)), [], [], None

    def _reshape(self, node, data):
        axis, shape_in, shape_out = self.axis(data[0]), self.shape(data[0]), self.shape(node.name)
        if axis is None or not shape_in or not shape_out or None in shape_in or None in shape_out:
            raise _FedWhole("shapes unknown")
        before, rows, after = math.prod(shape_in[:axis]), shape_in[axis], math.prod(shape_in[axis + 1:])
        found = [p for p in range(len(shape_out)) if math.prod(shape_out[:p]) == before and shape_out[p] == rows
                 and math.prod(shape_out[p + 1:]) == after]
        if not found:
            raise _FedWhole("the split axis does not stay whole")
        p = found[0]
        if self.states.get(parse_input(data[1])[0]) is not None:  # computed per slice (a slice's Shape)
            return p, [], [], None
        target = const_ints(self.nodes.get(parse_input(data[1])[0]))
        if target is None:
            raise _FedWhole("target not constant")
        if target[p] == -1:
            return p, [], [], None
        if target[p] != rows:
            raise _FedWhole("target does not name the split axis")
        return p, [], [], p
