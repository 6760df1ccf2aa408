"""The only step that writes protos: retype allow attributes and insert Casts where colors meet
(Grappler's ChangeTypeAttrsAndAddCasts), on a copy of the input GraphDef.
"""

from __future__ import annotations

import dataclasses
import itertools

from tensorflow.core.framework import graph_pb2, node_def_pb2

from . import dtypes
from .coloring import Paint
from .pass_context import PassContext


@dataclasses.dataclass(frozen=True, slots=True)
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
    """What the apply step did: the new GraphDef, the retyped (node, attr) pairs, and the Casts; in TF's CPU
    emulation (core.emulation), the (node, attr) pairs kept float32 between Casts instead of retyped."""

    graph_def: graph_pb2.GraphDef
    retyped: list
    casts: list
    emulated: list = dataclasses.field(default_factory=list)


def apply_coloring(graph_def: graph_pb2.GraphDef, ctx: PassContext, paint: Paint) -> Applied:
    """Return a new GraphDef with allow float32 attrs retyped and Casts at allow/non-allow boundaries.

    For every original node in order and each of its float32 type attrs: an allow attr is retyped; then each
    output port of the attr gets at most one Cast, shared by every consumer whose color differs.
    """
    view = ctx.view
    is_allow = bytearray(view.num_vertices)  # a byte per vertex stays in cache where a big set's lookups miss
    for v in paint.allow:
        is_allow[v] = 1
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)  # one bulk copy in C; only the nodes that change are touched afterwards
    retypes, retyped = _retypes(view, is_allow)
    rewires, casts, devices = {}, [], []  # rewires: node index -> [(input port, cast name)]
    cast_name = _cast_namer(view)
    for (src_vertex, src_port), edges in sorted(_boundary_edges(view, is_allow).items()):
        casts.append(_add_cast(ctx, is_allow[src_vertex], src_vertex, src_port, edges, cast_name, rewires))
        devices.append(view.devices[view.v_node[src_vertex]])
    _append_casts(out, casts, devices)
    _write_edits(out, view, retypes, rewires, ctx.target)
    return Applied(out, retyped, casts)


def _retypes(view, is_allow: bytearray) -> tuple[dict, list]:
    """(node index -> [attr key], [(node name, attr key)]) for every allow float32 vertex, in vertex order."""
    retypes, retyped, float32 = {}, [], dtypes.FLOAT
    for v in itertools.compress(range(len(is_allow)), is_allow):
        if view.v_dtype[v] == float32:
            node = view.v_node[v]
            retypes.setdefault(node, []).append(view.v_key[v])
            retyped.append((view.names[node], view.v_key[v]))
    return retypes, retyped


def _boundary_edges(view, is_allow: bytearray) -> dict:
    """(source vertex, source port) -> the edges from a float32 vertex to a consumer of the other color.

    Sorted by key, this is Grappler's order: node by node, type attr by type attr, output port by output port.
    """
    boundary, float32, v_dtype = {}, dtypes.FLOAT, view.v_dtype
    for e, (u, v) in enumerate(zip(view.e_u, view.e_v)):
        if is_allow[u] != is_allow[v] and v_dtype[u] == float32:
            key = (u, view.e_src_port[e])
            if key in boundary:
                boundary[key].append(e)
            else:
                boundary[key] = [e]
    return boundary


def _add_cast(ctx, src_allow, src_vertex, port, edges, cast_name, rewires) -> CastRecord:
    view = ctx.view
    node = view.v_node[src_vertex]
    src_dtype, to = (ctx.target, dtypes.FLOAT) if src_allow else (dtypes.FLOAT, ctx.target)
    name = cast_name(view.names[node], port, dtypes.CAST_KIND[to])
    consumers = [(view.e_dst[e], e - view.in_start[view.e_dst[e]]) for e in edges]
    for dst, dst_port in consumers:
        rewires.setdefault(dst, []).append((dst_port, name))
    return CastRecord(name, view.names[node], port, _DTYPE_NAMES[src_dtype], _DTYPE_NAMES[to],
                      tuple((view.names[d], p) for d, p in consumers))


def _cast_namer(view):
    """Return (src name, port, kind) -> TF 2.21's Cast name: the smallest free id in
    "<src>-<port>-<kind>-<id>-AutoMixedPrecision".

    The pass makes at most one Cast per output port, so its own names never collide; only a graph that already
    holds such names (a second rewrite) needs the search, which costs a lookup in a big dict per Cast.
    """
    if not any(CAST_SUFFIX in name for name in view.names):
        return lambda src, port, kind: f"{src}-{port}-{kind}-0-{CAST_SUFFIX}"
    return cast_name_search(view)


def cast_name_search(view):
    """Return (src name, port, kind) -> the smallest id not taken by the graph or an earlier call of this namer."""
    taken = set()

    def search(src: str, port: int, kind: str) -> str:
        n = 0
        while (name := f"{src}-{port}-{kind}-{n}-{CAST_SUFFIX}") in view.node_index or name in taken:
            n += 1
        taken.add(name)
        return name
    return search


def _write_edits(out: graph_pb2.GraphDef, view, retypes: dict, rewires: dict, target: int) -> None:
    """Retype and rewire the changed nodes of `out`, and finish Grappler's FusedBatchNorm -> V2 upgrades."""
    nodes = out.node
    for index in retypes.keys() | rewires.keys() | view.upgraded:
        node = nodes[index]
        if index in view.upgraded:
            node.op = view.ops[index]
            node.attr["U"].type = dtypes.FLOAT
        if index in retypes:
            _retype(node.attr, retypes[index], target)
        if index in rewires:
            _rewire(node.input, rewires[index], view.control_inputs[index])


def _retype(attrs, keys: list, dtype: int) -> None:
    for key in keys:
        if "[" not in key:
            attrs[key].type = dtype
        else:
            attr, _, element = key.partition("[")
            attrs[attr].list.type[int(element[:-1])] = dtype


def _rewire(inputs, rewires: list, n_control: int) -> None:
    if n_control == 0:  # then every input is a data input: port == position
        for port, cast_name in rewires:
            inputs[port] = cast_name
    else:
        data_positions = [i for i, name in enumerate(inputs) if not name.startswith("^")]
        for port, cast_name in rewires:
            inputs[data_positions[port]] = cast_name


def _append_casts(out: graph_pb2.GraphDef, casts: list, devices: list) -> None:
    """Append the Cast nodes in one MergeFromString of their wire encoding.

    A NodeDef wrapper per Cast cost more than the rest of the apply step on cast-heavy graphs; merging serialized
    messages appends to repeated fields, which is protobuf's defined semantics. Each Cast is a serialized template
    (op, device, attrs) followed by its name and input, as a GraphDef `node` field, written into one buffer.
    """
    templates, buffer = {}, bytearray()
    for record, device in zip(casts, devices):
        key = (record.from_dtype, record.to_dtype, device)
        template = templates.get(key)
        if template is None:
            template = templates[key] = _cast_template(*key)
        name, source = record.name.encode(), f"{record.src}:{record.src_port}".encode()
        name_head, source_head = _field_head(_NAME, len(name)), _field_head(_INPUT, len(source))
        buffer += _field_head(_NODE, len(template) + len(name_head) + len(name) + len(source_head) + len(source))
        buffer += template
        buffer += name_head
        buffer += name
        buffer += source_head
        buffer += source
    out.MergeFromString(buffer)


def _cast_template(from_dtype: str, to_dtype: str, device: str) -> bytes:
    node = node_def_pb2.NodeDef(op="Cast", device=device)
    node.attr["SrcT"].type = dtypes.by_name(from_dtype)
    node.attr["DstT"].type = dtypes.by_name(to_dtype)
    node.attr["Truncate"].b = False
    return node.SerializeToString(deterministic=True)


CAST_SUFFIX = "AutoMixedPrecision"
_DTYPE_NAMES = {d: dtypes.name(d) for d in (dtypes.FLOAT, dtypes.HALF, dtypes.BFLOAT16)}
_NAME = node_def_pb2.NodeDef.DESCRIPTOR.fields_by_name["name"].number
_INPUT = node_def_pb2.NodeDef.DESCRIPTOR.fields_by_name["input"].number
_NODE = graph_pb2.GraphDef.DESCRIPTOR.fields_by_name["node"].number


def _field_head(number: int, length: int) -> bytes:
    """Tag and varint length of a length-delimited field (wire type 2) numbered below 16."""
    if length <= 0x7F:
        return bytes((number << 3 | 2, length))
    varint = bytearray()
    while length > 0x7F:
        varint.append(0x80 | (length & 0x7F))
        length >>= 7
    varint.append(length)
    return bytes((number << 3 | 2,)) + varint
