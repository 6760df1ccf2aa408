"""The layer graph: a rewritten graph simplified to what a person reads as the network — one box per layer, edges
along the data, casts counted on the edges where the rewrite put them.

What is not drawn: variable handles, `ReadVariableOp`s, constants and everything computed from them alone (a
BatchNorm's folded scale), identities, and nodes that only order others (NoOp, Assign*). A layer's box counts the
variables it reads and the Casts inserted on its weights; an input of the graph (`_Arg`, `Placeholder`) is an
"input" box and a `_Retval` an "output" box. Reasons are rendered from the rows, never decided again.
"""

from __future__ import annotations

import collections
import dataclasses

from .layer_scopes import group_ops
from .palette import dtype_label

PARAM_OPS = frozenset({"Const", "HostConst", "VarHandleOp", "ReadVariableOp", "VariableV2", "Variable",
                       "VarIsInitializedOp"})
VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
PASS_OPS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape"})
INPUT_OPS = frozenset({"_Arg", "Placeholder", "_DeviceArg"})
OUTPUT_OPS = frozenset({"_Retval", "_DeviceRetval"})
DROP_OPS = frozenset({"NoOp", "SaveV2", "RestoreV2", "MergeV2Checkpoints", "ShardedFilename"})
DT_RESOURCE = 20
FLOAT_DTYPES = frozenset({"float", "half", "bfloat16", "double"})  # Decision dtype names


@dataclasses.dataclass
class Layer:
    """One box: a layer (name scope), a lone op, an input or an output.

    Attributes:
        key: the box key (a scope "a/b/", or a node name).
        label: its short name.
        kind: "layer", "op", "input" or "output".
        members: the drawn ops in it, in graph order.
        classes: node class -> count over `members` (palette.CLASSES).
        ops: op type -> count over `members`.
        variables: the variables its ops read (through ReadVariableOps and weight-only arithmetic).
        casts: "float32→bfloat16" -> count of Casts inserted inside it or on its weights.
        cast_nodes: the names of those Casts (the time view prices each once).
        weights: the parameter nodes its ops read (through Casts and identities): a variable's read, or what is
            computed from weights alone (the time view counts that arithmetic, done every call, in the box).
    """

    key: str
    label: str
    kind: str
    members: list = dataclasses.field(default_factory=list)
    classes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    variables: set = dataclasses.field(default_factory=set)
    casts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    cast_nodes: set = dataclasses.field(default_factory=set)
    weights: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class LayerGraph:
    """A graph as layers.

    Attributes:
        source: the graph drawn ("" for the main graph, else the function's name).
        table: its GraphTable.
        layers: box key -> Layer, in graph order.
        edges: (box, box) -> {"count": data edges, "casts": Counter of Cast directions on them, "cast_nodes": the
            names of those Casts}.
        op_edges: (op, op, cast directions) between drawn ops and inputs/outputs, for opening a box.
        box_of: drawn node -> box key.
        hidden: role -> count of the nodes not drawn ("variable or constant", "identity", "ordering").
        note: how the grouping was limited (layer_scopes.Grouping.note), or None.
    """

    source: str
    table: object
    layers: dict
    edges: dict
    op_edges: list
    box_of: dict
    hidden: collections.Counter
    note: str | None = None


def _order(rows: dict) -> list:
    """Node names with every data input before its consumer (Kahn); nodes on a cycle come last."""
    consumers, missing = collections.defaultdict(list), {}
    for name, row in rows.items():
        inputs = {s for s, _ in row.drawn_inputs if s in rows}
        missing[name] = len(inputs)
        for s in inputs:
            consumers[s].append(name)
    ready = [n for n, k in missing.items() if k == 0]
    order = []
    while ready:
        name = ready.pop()
        order.append(name)
        for c in consumers[name]:
            missing[c] -= 1
            if missing[c] == 0:
                ready.append(c)
    placed = set(order)
    return order + [n for n in rows if n not in placed]


def _is_resource(node) -> bool:
    """True for an `_Arg` (attr T) or `Placeholder` (attr dtype) of resource type: a variable handle."""
    if node is None:
        return False
    return any(key in node.attr and node.attr[key].type == DT_RESOURCE for key in ("T", "dtype"))


def node_roles(table) -> tuple[dict, dict]:
    """(name -> role, name -> variables read) for every node of a GraphTable.

    Roles: "param" (a variable, constant or what is computed from those alone), "cast" (inserted by the rewrite),
    "pass" (identities), "drop" (ordering-only), "input", "output", "op" (drawn).
    """
    rows, protos = table.rows, {n.name: n for n in table.result.graph_def.node}
    role, variables = {}, {}
    for name in _order(rows):
        row = rows[name]
        inputs = [s for s, _ in row.drawn_inputs if s in rows]
        if row.cast is not None:
            role[name] = "cast"
        elif row.op in INPUT_OPS:
            role[name] = "param" if _is_resource(protos.get(name)) else "input"
        elif row.op in OUTPUT_OPS:
            role[name] = "output"
        elif row.op in DROP_OPS or row.op.startswith("Assign"):
            role[name] = "drop"
        elif row.op in PARAM_OPS or (all(_weight_only(role, rows, s) for s in inputs)
                                     and not _data_op(row.op)):
            role[name] = "param"
        elif row.op in PASS_OPS:
            role[name] = "pass"
        else:
            role[name] = "op"
        if role[name] in ("param", "cast"):
            own = {name} if row.op in VARIABLE_OPS or role[name] == "param" and row.op in INPUT_OPS else set()
            variables[name] = own.union(*(variables.get(s, set()) for s in inputs))
    return role, variables


def _data_op(op: str) -> bool:
    """Ops that start data of their own (no data inputs, not constants): inputs, random numbers, ..."""
    return op in INPUT_OPS or op.startswith(("Random", "Stateless", "Stateful"))


def _weight_only(role: dict, rows: dict, name: str) -> bool:
    """True if `name` is a parameter, or an inserted Cast of one."""
    r = role.get(name)
    while r == "cast":
        name = rows[name].drawn_inputs[0][0]
        r = role.get(name)
    return r == "param"


def _cast_label(row) -> str:
    return f"{dtype_label(row.cast.from_dtype)}→{dtype_label(row.cast.to_dtype)}"


def trace_input(rows: dict, role: dict, src: str, port: int) -> tuple:
    """(role, node, cast directions, cast node names) of what feeds an input, looking through inserted Casts and
    identities."""
    casts, names = [], []
    while src in rows:
        r = role[src]
        if r == "cast":
            casts.append(_cast_label(rows[src]))
            names.append(src)
        elif r != "pass":
            return r, src, tuple(casts), tuple(names)
        inputs = rows[src].drawn_inputs
        if not inputs:
            return "drop", src, tuple(casts), tuple(names)
        src, port = inputs[port] if rows[src].op == "IdentityN" and port < len(inputs) else inputs[0]
    return "drop", src, tuple(casts), tuple(names)


def called_functions(node) -> list:
    """The functions a NodeDef runs: a call's `f`, a While's `cond`/`body`, an If's branches."""
    return [v.func.name for _, v in sorted(node.attr.items()) if v.HasField("func") and v.func.name]


def callee_ops(name: str, tables: dict, seen: frozenset = frozenset(), memo: dict | None = None) -> list:
    """The NodeRows of the ops a function computes, through the functions it calls in turn (no parameters, casts
    or identities): what a call node inside a layer stands for. `memo` keeps answers across calls."""
    memo = {} if memo is None else memo
    if name not in memo:
        memo[name] = _callee_ops(name, tables, seen, memo)
    return memo[name]


def _callee_ops(name: str, tables: dict, seen: frozenset, memo: dict) -> list:
    table = tables.get(name)
    if table is None or name in seen:
        return []
    role, _ = node_roles(table)
    protos = {n.name: n for n in table.result.graph_def.node}
    out = []
    for node_name, row in table.rows.items():
        if role[node_name] == "op":
            out.append(row)
            for inner in called_functions(protos[node_name]):
                out += callee_ops(inner, tables, seen | {name}, memo)
    return out


def _count_callees(layers: dict, box_of: dict, table, tables: dict) -> None:
    """Count the ops of the functions a box's call nodes run (an LSTM's While body) into the box."""
    protos, memo = {n.name: n for n in table.result.graph_def.node}, {}
    for name, key in box_of.items():
        for function in called_functions(protos[name]) if name in protos else ():
            for row in callee_ops(function, tables, frozenset({table.name}), memo):
                layers[key].classes[row.node_class] += 1
                layers[key].ops[row.op] += 1


def build_layer_graph(table, budget: int = 150, tables: dict | None = None) -> LayerGraph:
    """The LayerGraph of one GraphTable.

    Args:
        table: a GraphTable (node_table.graph_table), e.g. network.network_table(tables).
        budget: the most boxes a deeper level of scopes may bring the picture to (layer_scopes.group_ops).
        tables: function name -> GraphTable; when given, a box counts the ops of the functions its call nodes run
            (drawn through the call: an LSTM layer's While body is counted in the LSTM's box).
    """
    rows = table.rows
    role, variables = node_roles(table)
    drawn = [n for n in rows if role[n] == "op"]
    grouping = group_ops({n: rows[n].op for n in drawn}, budget)
    box_of = {n: grouping.box_of[n] for n in drawn}
    box_of.update({n: n for n in rows if role[n] in ("input", "output")})
    layers = {}
    for name, key in box_of.items():
        layer = layers.get(key)
        if layer is None:
            kind = role[name] if role[name] != "op" else ("layer" if key.endswith("/") else "op")
            label = grouping.label(key) if kind in ("layer", "op") else name
            layer = layers[key] = Layer(key, label, kind)
        layer.members.append(name)
        layer.classes[rows[name].node_class] += 1
        layer.ops[rows[name].op] += 1
    if tables:
        _count_callees(layers, {n: k for n, k in box_of.items() if role[n] == "op"}, table, tables)
    op_edges, edges = [], {}
    for name, key in box_of.items():
        for src, port in rows[name].drawn_inputs:
            kind, node, casts, cast_nodes = trace_input(rows, role, src, port)
            if kind == "param":
                layers[key].variables |= variables.get(node, set())
                layers[key].casts.update(casts)
                layers[key].cast_nodes.update(cast_nodes)
                layers[key].weights.add(node)
            elif node in box_of:
                op_edges.append((node, name, casts, cast_nodes))
                _add_edge(edges, layers, box_of[node], key, casts, cast_nodes)
    fold_plumbing(layers, edges, box_of, {n for n in box_of if computes_in_float(rows[n])})
    hidden = collections.Counter({"param": "variable or constant", "pass": "identity", "drop": "ordering",
                                  "cast": "inserted Cast"}.get(role[n], "") for n in rows if n not in box_of)
    return LayerGraph(table.name, table, layers, edges, op_edges, box_of, hidden, grouping.note)


def computes_in_float(row) -> bool:
    """Whether a node has a floating-point type (float32, a low precision, float64) before or after the rewrite."""
    return any(d.dtype_before in FLOAT_DTYPES or d.dtype_after in FLOAT_DTYPES for d in row.decisions)


def fold_plumbing(layers: dict, edges: dict, box_of: dict, floating: set) -> None:
    """Fold boxes that compute nothing in floating point (masks, shapes, indices; none of their ops is in
    `floating`) into the one box they feed, repeatedly: a Transformer layer's attention-mask ExpandDims joins its
    attention box instead of a row of boxes at the top with long edges down to every layer. Not "every op
    untouched": in a model converted before (a frozen output inspected), a bfloat16 Relu6 is untouched too, and
    each activation layer would join the convolution after it (with the fused kernel TF names after it)."""
    from .network import WEIGHT_OPS
    changed = True
    while changed:
        changed = False
        for key, layer in list(layers.items()):
            targets = {b for (a, b) in edges if a == key}
            if (layer.kind not in ("layer", "op") or floating.intersection(layer.members) or len(targets) != 1
                    or any(op in WEIGHT_OPS for op in layer.ops)):
                continue
            _merge(layers, edges, box_of, key, targets.pop())
            changed = True


def _merge(layers: dict, edges: dict, box_of: dict, key: str, into: str) -> None:
    """Move box `key` into box `into`: its ops, counts and edges."""
    source, target = layers.pop(key), layers[into]
    target.members += source.members
    target.classes.update(source.classes)
    target.ops.update(source.ops)
    target.variables |= source.variables
    target.casts.update(source.casts)
    target.cast_nodes |= source.cast_nodes
    target.weights |= source.weights
    for name in source.members:
        box_of[name] = into
    for (a, b) in [e for e in edges if key in e]:
        data = edges.pop((a, b))
        a, b = (into if a == key else a), (into if b == key else b)
        if a == b:
            target.casts.update(data["casts"])
            target.cast_nodes |= data["cast_nodes"]
            continue
        edge = _edge_data(edges, a, b)
        edge["count"] += data["count"]
        edge["casts"].update(data["casts"])
        edge["cast_nodes"] |= data["cast_nodes"]


def _edge_data(edges: dict, a: str, b: str) -> dict:
    return edges.setdefault((a, b), {"count": 0, "casts": collections.Counter(), "cast_nodes": set()})


def _add_edge(edges: dict, layers: dict, a: str, b: str, casts: tuple, cast_nodes: tuple) -> None:
    """Count one data edge between boxes; inside one box its Casts count on the box."""
    if a == b:
        layers[a].casts.update(casts)
        layers[a].cast_nodes.update(cast_nodes)
        return
    edge = _edge_data(edges, a, b)
    edge["count"] += 1
    edge["casts"].update(casts)
    edge["cast_nodes"].update(cast_nodes)
