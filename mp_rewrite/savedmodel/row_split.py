"""One sample's token rows in N branches: `split_rows(graph_def, plan)` -> the GraphDef a TokenRows plan
(analysis/token_rows.py) describes. GraphDef in, GraphDef out; the input is never modified.

The input's token axis is cut by Slices; each split node is copied once per slice (`<node>/row<i>`, reading its
inputs' copies), a constant Reshape target naming the token axis rewritten with the slice's rows; an unsplit
operand the plan slices gets a Slice per branch; a tensor the plan gathers is its slices concatenated once
(`<node>/rows_whole`), read by the ops fed every row and by the outputs. TensorFlow's inter-op pool runs the
branches at once: served with one intra-op thread, one sample uses both cores. The split graph is valid at batch 1
only (its targets and slices are sized for one sample); `routed_rows` puts it beside the whole graph, a Switch on
the batch choosing, and that is what `convert --freeze --split` writes (row_choice.py).

The node builders below are shared with the benchmark's other batch-1 splits (tools/batch_one_bands.py,
batch_one_columns.py).
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2, node_def_pb2, tensor_pb2

from ..analysis.batch_row_states import folded_ints
from ..analysis.token_rows import SPLIT, TokenRows, row_plan
from ..core.functions import unique_name
from ..core.graph_view import parse_input
from ..core.op_support import attr_or_default
from .split_option import ROW_ROUTE

INT32, INT64 = 3, 9


def const_node(name: str, values, dtype: int = INT32) -> node_def_pb2.NodeDef:
    """A 1-D integer Const of `values` (int32, or int64)."""
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = dtype
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    values = list(values)
    tensor.tensor_shape.dim.add(size=len(values))
    (tensor.int64_val if dtype == INT64 else tensor.int_val).extend(values)
    node.attr["value"].tensor.CopyFrom(tensor)
    return node


def scalar_node(name: str, value: int) -> node_def_pb2.NodeDef:
    """A scalar int32 Const."""
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = INT32
    node.attr["value"].tensor.CopyFrom(tensor_pb2.TensorProto(dtype=INT32, int_val=[value]))
    return node


def length_nodes(name: str, tensor: str, axis: int, dtype: int) -> list:
    """[Shape, its begin, end and stride, a StridedSlice named `name`: the scalar size of `tensor`'s `axis`]."""
    shape = node_def_pb2.NodeDef(name=name + "/shape", op="Shape", input=[tensor])
    shape.attr["T"].type, shape.attr["out_type"].type = dtype, INT32
    size = node_def_pb2.NodeDef(name=name, op="StridedSlice",
                                input=[shape.name, name + "/begin", name + "/end", name + "/stride"])
    size.attr["T"].type, size.attr["Index"].type, size.attr["shrink_axis_mask"].i = INT32, INT32, 1
    return [shape, const_node(name + "/begin", [axis]), const_node(name + "/end", [axis + 1]),
            const_node(name + "/stride", [1]), size]


def concat_nodes(name: str, parts: list, axis: int, dtype: int) -> list:
    """[its axis Const, a ConcatV2 named `name` of the tensors `parts` along `axis`]."""
    node = node_def_pb2.NodeDef(name=name, op="ConcatV2", input=[*parts, name + "/axis"])
    node.attr["N"].i = len(parts)
    node.attr["T"].type = dtype
    node.attr["Tidx"].type = INT32
    return [scalar_node(name + "/axis", axis), node]


def slice_nodes(name: str, tensor: str, begin: list, size: list, dtype: int) -> list:
    """[begin, size, a Slice named `name` of `tensor`]."""
    node = node_def_pb2.NodeDef(name=name, op="Slice", input=[tensor, name + "/begin", name + "/size"])
    node.attr["T"].type = dtype
    node.attr["Index"].type = INT32
    return [const_node(name + "/begin", begin), const_node(name + "/size", size), node]


def node_dtype(node, port: int = 0) -> int:
    """The dtype of a node's output `port`, from its OpDef (a fixed type, or the type attribute it names), else
    from its usual type attributes (float32 when it has none)."""
    from tensorflow.python.framework import op_def_registry
    op_def = op_def_registry.get(node.op)
    if op_def is not None and port < len(op_def.output_arg):
        arg = op_def.output_arg[port]
        if arg.type:
            return arg.type
        if arg.type_attr and attr_or_default(node, arg.type_attr).type:
            return attr_or_default(node, arg.type_attr).type
    for key in ("T", "dtype", "DstT", "Tparams"):
        if key in node.attr and node.attr[key].type:
            return node.attr[key].type
    return 1


def copied(node, name: str, inputs: list) -> node_def_pb2.NodeDef:
    """A copy of `node` named `name` reading `inputs` (its recorded output shapes dropped)."""
    new = node_def_pb2.NodeDef()
    new.CopyFrom(node)
    new.name = name
    del new.input[:]
    new.input.extend(inputs)
    new.attr.pop("_output_shapes", None)
    return new


def assembled(graph_def, nodes) -> graph_pb2.GraphDef:
    """A GraphDef of `nodes` with `graph_def`'s versions and function library (what every split returns)."""
    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    result.node.extend(nodes)
    return result


def split_rows(graph_def, plan: TokenRows) -> tuple[graph_pb2.GraphDef, dict]:
    """(the split GraphDef, {output tensor: its tensor in the new graph}) for a splittable plan of `graph_def`."""
    return _Surgery(graph_def, plan).graph()


def split_token_rows(graph_def, input_tensor: str, axis: int, outputs: list, shapes: dict, parts: int = 2,
                     whole_ops=()):
    """The plan (token_rows.row_plan) and the graph in one call, for the benchmark: (GraphDef, {output: tensor},
    [(node, op, why)] of the ops fed every row).

    Raises:
        ValueError: the plan is refused (its reason).
    """
    plan = row_plan(graph_def, input_tensor, axis, outputs, shapes, parts, whole_ops)
    if not plan.splittable:
        raise ValueError(plan.reason)
    graph, fetched = split_rows(graph_def, plan)
    return graph, fetched, list(plan.fed_whole)


class _Surgery:
    """The nodes of the split graph, made in the plan's order."""

    def __init__(self, graph_def, plan: TokenRows):
        self.source, self.plan = graph_def, plan
        self.nodes = {n.name: n for n in graph_def.node}
        self.out, self.made = [], {}  # made: (kind, tensor, i) -> the tensor made for it
        # Names of the model (and, as they are made, ours): a model may hold a "<node>/row0" of its own.
        self.taken, self.row_names = {n.name for n in graph_def.node}, {}

    def graph(self):
        plan, input_name = self.plan, parse_input(self.plan.input)[0]
        for name in plan.order:
            node, state = self.nodes[name], plan.states.get(name)
            if name == input_name:
                self.out.append(node)
                self._input_slices(node)
            elif state is None:
                fed = any(self._state(t) is not None for t in node.input)
                self.out.append(copied(node, name, self._whole_inputs(node.input)) if fed else node)
            else:
                self._branches(node)
        fetched = {o: self._whole(o) for o in plan.outputs}
        return assembled(self.source, self.out), fetched

    def _state(self, tensor: str):
        return self.plan.states.get(parse_input(tensor.lstrip("^"))[0])

    def _input_slices(self, node) -> None:
        for i in range(self.plan.parts):
            self._slice(self._row_name(node.name, i), self.plan.input, self.plan.axis, self.plan.rank, i,
                        node_dtype(node))

    def _slice(self, name: str, tensor: str, axis: int, rank: int, i: int, dtype: int) -> None:
        """A Slice named `name` of branch i's rows of `tensor` on `axis`: the plan's bounds, or where the length is
        unknown, i * length // parts on, of the length the tokens have at run time."""
        plan = self.plan
        if not plan.unknown_length:
            begin, size = [0] * rank, [-1] * rank
            begin[axis], size[axis] = plan.bounds[i], plan.bounds[i + 1] - plan.bounds[i]
            self.out += slice_nodes(name, tensor, begin, size, dtype)
            return
        starts = self._run_bounds()
        begin, size = (self._vector(f"{name}/{what}", rank, axis, value, filler) for what, value, filler in
                       (("begin", starts[i], 0), ("size", self._difference(starts, i), -1)))
        node = node_def_pb2.NodeDef(name=name, op="Slice", input=[tensor, begin, size])
        node.attr["T"].type, node.attr["Index"].type = dtype, INT32
        self.out.append(node)

    def _run_bounds(self) -> list:
        """The scalar tensors i * length // parts (i = 0 .. parts) of the token count at run time (made once)."""
        if ("bounds", "", 0) not in self.made:
            plan, base = self.plan, unique_name(f"{parse_input(self.plan.input)[0]}/rows_bounds", self.taken)
            self.out += length_nodes(base, plan.input, plan.axis, node_dtype(self.nodes[parse_input(plan.input)[0]]))
            starts = []
            for i in range(plan.parts + 1):
                at = f"{base}/at{i}"
                product = node_def_pb2.NodeDef(name=at + "/times", op="Mul", input=[base, at + "/i"])
                start = node_def_pb2.NodeDef(name=at, op="FloorDiv", input=[product.name, base + "/parts"])
                product.attr["T"].type = start.attr["T"].type = INT32
                self.out += [scalar_node(at + "/i", i), product, start]
                starts.append(at)
            self.out.append(scalar_node(base + "/parts", plan.parts))
            self.made["bounds", "", 0] = starts
        return self.made["bounds", "", 0]

    def _difference(self, starts: list, i: int) -> str:
        name = f"{starts[i]}/rows"
        if ("size", name, 0) not in self.made:
            node = node_def_pb2.NodeDef(name=name, op="Sub", input=[starts[i + 1], starts[i]])
            node.attr["T"].type = INT32
            self.out.append(node)
            self.made["size", name, 0] = name
        return name

    def _vector(self, name: str, rank: int, axis: int, value: str, filler: int) -> str:
        """A rank-long int32 vector of `filler`, `value` (a scalar tensor) at `axis`."""
        node = node_def_pb2.NodeDef(name=name, op="Pack", input=[
            value if a == axis else f"{name}/fill" for a in range(rank)])
        node.attr["N"].i, node.attr["T"].type = rank, INT32
        self.out += [scalar_node(f"{name}/fill", filler), node]
        return name

    def _branch(self, tensor: str, i: int) -> str:
        """The tensor as branch i reads it: its copy there, or itself (whole)."""
        control = tensor.startswith("^")
        name, port = parse_input(tensor.lstrip("^"))
        if self.plan.states.get(name) is None:
            return tensor
        return ("^" if control else "") + self._row_name(name, i) + (f":{port}" if port else "")

    def _row_name(self, name: str, i: int) -> str:
        """The name of branch i's copy of a node: "<node>/row<i>", unless the model holds that name already."""
        if (name, i) not in self.row_names:
            self.row_names[name, i] = unique_name(f"{name}/row{i}", self.taken)
        return self.row_names[name, i]

    def _whole_inputs(self, inputs) -> list:
        """A node's inputs read whole (`_whole`), a control input on a split node waiting for every copy of it (a
        tf_keras body's output control node waits so on its embedding lookup)."""
        data = [self._whole(t) for t in inputs if not t.startswith("^")]
        control = [t if self._state(t) is None else self._branch(t, i)
                   for t in inputs if t.startswith("^")
                   for i in range(1 if self._state(t) is None else self.plan.parts)]
        return data + list(dict.fromkeys(control))

    def _whole(self, tensor: str) -> str:
        """The tensor with all its rows: itself, its slices concatenated (once), or for a per-slice value, the
        node computed again from whole inputs (a data tensor: control inputs are `_whole_inputs`')."""
        state = self._state(tensor)
        if state is None:
            return tensor
        name, port = parse_input(tensor)
        key = ("whole", f"{name}:{port}", 0)
        if state[0] != SPLIT:
            if ("whole", name, 0) not in self.made:
                self.made["whole", name, 0] = name
                node = self.nodes[name]
                self.out.append(const_node(name, self.plan.constants[name],
                                           attr_or_default(node, "out_type").type or INT32)
                                if name in self.plan.constants else
                                copied(node, name, self._whole_inputs(node.input)))
            return tensor
        if key not in self.made:
            concat = unique_name(f"{name}/rows_whole" + (f"_{port}" if port else ""), self.taken)
            self.out += concat_nodes(concat, [self._branch(tensor, i) for i in range(self.plan.parts)], state[1],
                                     node_dtype(self.nodes[name], port))
            self.made[key] = concat + ":0"  # a tensor, also as a fetched output
        return self.made[key]

    def _sliced(self, tensor: str, axis: int, rank: int, i: int) -> str:
        """Branch i's rows of an unsplit tensor, cut on `axis` as the token rows are."""
        name, port = parse_input(tensor)
        key = ("slice", f"{name}:{port}", i)
        if key not in self.made:
            made = unique_name(f"{name}/rows_slice" + (f"_{port}" if port else "") + f"/row{i}", self.taken)
            self._slice(made, tensor, axis, rank, i, node_dtype(self.nodes[name], port))
            self.made[key] = made
        return self.made[key]

    def _branches(self, node) -> None:
        plan = self.plan
        gathered = {t: self._whole(t) for t in plan.gathers.get(node.name, ())}
        sliced = {t: (axis, rank) for t, axis, rank in plan.slices.get(node.name, ())}
        for i in range(plan.parts):
            inputs = [gathered[t] if t in gathered else self._sliced(t, *sliced[t], i) if t in sliced
                      else self._branch(t, i) for t in node.input]
            copy = copied(node, self._row_name(node.name, i), inputs)
            if node.name in plan.reshapes:
                values = folded_ints(self.nodes, node.input[1])
                values[plan.reshapes[node.name]] = plan.bounds[i + 1] - plan.bounds[i]
                const = const_node(unique_name(copy.name + "/target", self.taken), values,
                                   node_dtype(self.nodes[parse_input(node.input[1])[0]]))
                copy.input[1] = const.name
                self.out.append(const)
            self.out.append(copy)


def routed_rows(graph_def, plan: TokenRows, least: int = 0) -> tuple[graph_pb2.GraphDef, dict]:
    """(the whole graph and its row split in one GraphDef, {output tensor: its tensor there}): a Switch on the
    token input sends a batch of 1 to the rows and any other batch to the whole graph, and each output is the Merge
    of the two. What does not read the tokens (the weights above all) is one node for both: stored once. Where the
    length is unknown (plan.unknown_length), only a sample of `least` tokens or more (at least 2 per slice) goes to
    the rows."""
    split, fetched = split_rows(graph_def, plan)
    whole = {n.name: n for n in graph_def.node}
    taken = set(whole) | {n.name for n in split.node}  # a graph may hold a "<node>/rows" of its own (BERT's)
    apart = _apart(split, whole, parse_input(plan.input)[0])
    renamed = {n.name: unique_name(f"{n.name}/rows", taken) for n in split.node if n.name in apart}
    route = f"{parse_input(plan.input)[0]}/{ROW_ROUTE.format(plan.parts)}"  # what `inspect` finds
    nodes = [_rerouted(n, {plan.input: route + ":0"}) for n in graph_def.node]
    least = max(least, 2 * plan.parts) if plan.unknown_length else 0
    nodes += _route_nodes(route, plan.input, node_dtype(whole[parse_input(plan.input)[0]]), plan.axis, least)
    for node in split.node:
        if node.name in whole and node.name not in renamed:
            continue  # the whole graph's own node
        copy = copied(node, renamed.get(node.name, node.name), [_renamed(t, renamed) for t in node.input])
        nodes.append(_rerouted(copy, {plan.input: route + ":1"}))
    merged = {}
    for output in dict.fromkeys(plan.outputs):  # two signature outputs may be one tensor
        name, port = parse_input(output)
        rows = _renamed(fetched[output], renamed)
        if parse_input(rows) == (name, port):  # an output that does not read the tokens: one tensor for both
            merged[output] = output
            continue
        merge = node_def_pb2.NodeDef(name=f"{name}/routed_{port}", op="Merge", input=[output, rows])
        merge.attr["N"].i, merge.attr["T"].type = 2, node_dtype(whole[name], port)
        nodes.append(merge)
        merged[output] = merge.name + ":0"
    return assembled(graph_def, nodes), merged


def _apart(split, whole: dict, source: str) -> set:
    """The names of the row split's nodes that cannot be the whole graph's node of their name: they differ from
    it, read `source` (the tokens, switched apart), or read such a node, by data or by control, at any depth. (A
    constant Grappler folded keeps a control input from the node it came from, which may come later in the
    GraphDef: shared, it would read the whole graph's node, dead at batch 1, and so would every row.)"""
    readers = {}
    for node in split.node:
        for tensor in node.input:
            readers.setdefault(parse_input(tensor.lstrip("^"))[0], []).append(node.name)
    todo = [n.name for n in split.node if n.name in whole and n != whole[n.name]] + readers.get(source, [])
    apart = set()
    while todo:
        name = todo.pop()
        if name in whole and name not in apart:
            apart.add(name)
            todo += readers.get(name, [])
    return apart


def _renamed(tensor: str, renamed: dict) -> str:
    control = tensor.startswith("^")
    name, port = parse_input(tensor.lstrip("^"))
    if name not in renamed:
        return tensor
    return ("^" if control else "") + renamed[name] + (f":{port}" if port else "")


def _rerouted(node, routes: dict):
    """The node reading `routes`' tensors through their routed ends (itself if it reads none of them)."""
    keys = {t if ":" in t else f"{t}:0" for t in routes}
    if not any((t if ":" in t else f"{t}:0") in keys for t in node.input):
        return node
    full = {(t if ":" in t else f"{t}:0"): r for t, r in routes.items()}
    return copied(node, node.name, [full.get(t if ":" in t else f"{t}:0", t) for t in node.input])


def _route_nodes(route: str, tensor: str, dtype: int, axis: int, least: int) -> list:
    """A Switch of `tensor` on whether its leading dimension is 1 (output 1: batch 1) and, given `least`, its
    `axis` at least that long."""
    nodes = length_nodes(route + "/batch", tensor, 0, dtype)
    one = node_def_pb2.NodeDef(name=route + "/is_one", op="Equal", input=[route + "/batch", route + "/one"])
    one.attr["T"].type = INT32
    nodes += [scalar_node(route + "/one", 1), one]
    if least:
        nodes += length_nodes(route + "/length", tensor, axis, dtype)
        long = node_def_pb2.NodeDef(name=route + "/is_long", op="GreaterEqual", input=[route + "/length",
                                                                                        route + "/least"])
        long.attr["T"].type = INT32
        both = node_def_pb2.NodeDef(name=route + "/rows", op="LogicalAnd", input=[one.name, long.name])
        nodes += [scalar_node(route + "/least", least), long, both]
        one = both
    switch = node_def_pb2.NodeDef(name=route, op="Switch", input=[tensor, one.name])
    switch.attr["T"].type = dtype
    return [*nodes, switch]
