"""The only step that writes protos: retype allow attributes and insert Casts where colors meet
(Grappler's ChangeTypeAttrsAndAddCasts), on a copy of the input GraphDef.
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import graph_pb2, node_def_pb2

from . import dtypes
from .coloring import Paint
from .pass_context import PassContext


@dataclasses.dataclass(frozen=True)
class CastRecord:
    """One inserted Cast.

    Attributes:
        name: the Cast node's name (TF 2.21's scheme, e.g. "dense/MatMul-0-CastToFp32-0-AutoMixedPrecision").
        src, src_port: the tensor it casts.
        from_dtype, to_dtype: "float" and "half"/"bfloat16", or the other way round.
        consumers: the (node, input index) pairs rewired to read it.
    """

    name: str
    src: str
    src_port: int
    from_dtype: str
    to_dtype: str
    consumers: tuple

    @property
    def to_low(self) -> bool:
        """True for a cast into low precision."""
        return self.to_dtype != "float"


@dataclasses.dataclass
class Applied:
    """What the apply step did: the new GraphDef, the retyped (node, attr) pairs, and the Casts."""

    graph_def: graph_pb2.GraphDef
    retyped: list
    casts: list


def apply_coloring(graph_def: graph_pb2.GraphDef, ctx: PassContext, paint: Paint) -> Applied:
    """Return a new GraphDef with allow float32 attrs retyped and Casts at allow/non-allow boundaries.

    For every original node in order and each of its float32 type attrs: an allow attr is retyped; then each
    output port of the attr gets at most one Cast, shared by every consumer whose color differs.
    """
    view, allow = ctx.view, paint.allow
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    taken = set(view.names)
    retyped, casts, edits = [], [], {}   # edits: node index -> (attr changes, input rewires)
    for node in range(view.num_nodes):
        for key, v in view.node_vids[node].items():
            if view.v_dtype[v] != dtypes.FLOAT:
                continue
            src_allow = v in allow
            if src_allow:
                edits.setdefault(node, ({}, {}))[0][key] = ctx.target
                retyped.append((view.names[node], key))
            for port, out_vid in enumerate(view.out_vids[node]):
                if out_vid == v:
                    _cast_port(ctx, allow, node, port, src_allow, taken, casts, edits)
    _write_edits(out, view, edits)
    for record in casts:
        out.node.append(_cast_node(record, view.devices[view.node_index[record.src]]))
    return Applied(out, retyped, casts)


def _cast_port(ctx, allow, node, port, src_allow, taken, casts, edits) -> None:
    view = ctx.view
    consumers = [(d, p) for d, p in view.out_edges[node][port] if (view.in_vids[d][p] in allow) != src_allow]
    if not consumers:
        return
    src_dtype, to = (ctx.target, dtypes.FLOAT) if src_allow else (dtypes.FLOAT, ctx.target)
    name = _cast_name(view.names[node], port, dtypes.CAST_KIND[to], taken)
    for dst, dst_port in consumers:
        edits.setdefault(dst, ({}, {}))[1][dst_port] = name
    casts.append(CastRecord(name, view.names[node], port, dtypes.name(src_dtype), dtypes.name(to),
                            tuple((view.names[d], p) for d, p in consumers)))


def _cast_name(src: str, port: int, kind: str, taken: set) -> str:
    """TF 2.21's Cast name: the smallest free id in "<src>-<port>-<kind>-<id>-AutoMixedPrecision"."""
    n = 0
    while f"{src}-{port}-{kind}-{n}-AutoMixedPrecision" in taken:
        n += 1
    name = f"{src}-{port}-{kind}-{n}-AutoMixedPrecision"
    taken.add(name)
    return name


def _write_edits(out: graph_pb2.GraphDef, view, edits: dict) -> None:
    nodes = out.node
    for index, (attr_changes, rewires) in edits.items():
        node = nodes[index]
        if index in view.upgraded:
            node.op = view.ops[index]
            node.attr["U"].type = dtypes.FLOAT
        for key, dtype in attr_changes.items():
            attr, _, element = key.partition("[")
            if element:
                node.attr[attr].list.type[int(element[:-1])] = dtype
            else:
                node.attr[attr].type = dtype
        if rewires:
            data_positions = [i for i, name in enumerate(node.input) if not name.startswith("^")]
            for port, cast_name in rewires.items():
                node.input[data_positions[port]] = cast_name
    for index in view.upgraded - edits.keys():
        nodes[index].op = view.ops[index]
        nodes[index].attr["U"].type = dtypes.FLOAT


def _cast_node(record: CastRecord, device: str) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=record.name, op="Cast", input=[f"{record.src}:{record.src_port}"],
                                device=device)
    node.attr["SrcT"].type = dtypes.by_name(record.from_dtype)
    node.attr["DstT"].type = dtypes.by_name(record.to_dtype)
    node.attr["Truncate"].b = False
    return node
