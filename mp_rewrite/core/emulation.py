"""TF's CPU emulation of float16 (auto_mixed_precision_cpu with TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16,
on by default there): allow nodes keep computing in float32, but every tensor they read or write makes a round trip
float32 -> float16 -> float32, so the graph sees float16's rounding and range where a GPU would compute in float16.

The apply step of that mode (Grappler's ChangeTypeAttrsAndAddCasts with emulate_f16), on a copy of the GraphDef:

- every output port of an allow float32 attribute gets one Cast to float16 ("<src>-<port>-CastToFp16-<n>-...") that
  all its consumers read; consumers that are not allow read it through one shared Cast back to float32
  ("<that cast>-0-CastToFp32-<n>-...");
- every output port of a non-allow float32 attribute that feeds an allow attribute gets one Cast to float16, as in
  the real rewrite;
- every input port of an allow float32 attribute reads its own Cast to float32 from that float16 tensor: Grappler
  does not share these, so MatMul(x, x) gets two.

Grappler inserts these while it walks the nodes in GraphDef order and fails (an out-of-range lookup) when a
consumer comes before its producer; this module works from the edges, so its output is what Grappler gives for the
graph in topological order, whatever the order of the input (only the ids of several per-port Casts of one tensor
follow the input's node order). A v1 while loop has no such order, and Grappler fails on every loop whose
recurrent edge is painted allow; here the back edge NextIteration -> Merge gets no Casts (TF's importer refuses
anything but a NextIteration there, and the tensor was already rounded to float16 on its way into the
NextIteration, so the numerics are those of the round trip), and the loop runs.
"""

from __future__ import annotations

import itertools

from tensorflow.core.framework import graph_pb2

from . import dtypes
from .apply import _DTYPE_NAMES, Applied, CastRecord, _append_casts, _write_edits, cast_name_search
from .coloring import Paint
from .pass_context import PassContext


def apply_emulated(graph_def: graph_pb2.GraphDef, ctx: PassContext, paint: Paint) -> Applied:
    """Return a new GraphDef where allow float32 attrs stay float32 between Casts, as TF's CPU emulation does.

    Args:
        graph_def: the input graph; never modified.
        ctx: the pass context of the run that painted `paint`.
        paint: the final coloring.

    Returns:
        An Applied with no retyped attributes, the emulated (node, attr) pairs, and every inserted Cast.
    """
    view = ctx.view
    is_allow = bytearray(view.num_vertices)
    for v in paint.allow:
        is_allow[v] = 1
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    builder = _CastBuilder(ctx)
    for (src_vertex, src_port), edges in sorted(_float32_fanouts(view).items()):
        builder.add_tensor(src_vertex, src_port, edges, is_allow)
    _append_casts(out, builder.casts, builder.devices)
    _write_edits(out, view, {}, builder.rewires, ctx.target)
    return Applied(out, [], builder.casts, emulated=_emulated(view, is_allow))


def _float32_fanouts(view) -> dict:
    """(source vertex, source port) -> its data edges, for every float32 output that has consumers."""
    fanouts, float32, v_dtype = {}, dtypes.FLOAT, view.v_dtype
    for e, u in enumerate(view.e_u):
        if v_dtype[u] == float32:
            key = (u, view.e_src_port[e])
            if key in fanouts:
                fanouts[key].append(e)
            else:
                fanouts[key] = [e]
    return fanouts


def _emulated(view, is_allow: bytearray) -> list:
    """(node name, attr key) of every allow float32 vertex: what the real rewrite would retype."""
    float32 = dtypes.FLOAT
    return [(view.names[view.v_node[v]], view.v_key[v]) for v in itertools.compress(range(len(is_allow)), is_allow)
            if view.v_dtype[v] == float32]


class _CastBuilder:
    """Collects the Casts of one emulated rewrite, their devices and the consumers' rewired inputs."""

    def __init__(self, ctx: PassContext):
        self.view, self.target = ctx.view, ctx.target
        self.casts, self.devices, self.rewires = [], [], {}  # rewires: node index -> [(input port, cast name)]
        # Several Casts per output port here (one per emulated input), so every name needs the id search.
        self._name = cast_name_search(self.view)

    def add_tensor(self, src_vertex: int, src_port: int, edges: list, is_allow: bytearray) -> None:
        """Add the Casts of one float32 output, named in Grappler's order: the float16 Cast, the float32 Cast the
        non-allow consumers share, then one float32 Cast per allow input port in node and port order."""
        view, float32 = self.view, dtypes.FLOAT
        to_allow = [e for e in edges if is_allow[view.e_v[e]]]
        if not is_allow[src_vertex] and not to_allow:
            return
        node = view.v_node[src_vertex]
        if view.ops[node] == "NextIteration":
            return  # the loop's back edge: see the module docstring
        device, src = view.devices[node], view.names[node]
        others = [e for e in edges if not is_allow[view.e_v[e]]] if is_allow[src_vertex] else []
        low = self._name(src, src_port, dtypes.CAST_KIND[self.target])
        back_kind = dtypes.CAST_KIND[float32]
        back = [(others, self._name(low, 0, back_kind))] if others else []
        back += [([e], self._name(low, 0, back_kind)) for e in to_allow if view.v_dtype[view.e_v[e]] == float32]
        # An allow attr that is already in low precision (not float32) reads the float16 Cast as it is.
        direct = [e for e in to_allow if view.v_dtype[view.e_v[e]] != float32]
        self._add(low, src, src_port, dtypes.FLOAT, self.target, device,
                  [(name, 0) for _, name in back] + self._rewire(direct, low))
        for back_edges, name in back:
            self._add(name, low, 0, self.target, dtypes.FLOAT, device, self._rewire(back_edges, name))

    def _rewire(self, edges: list, cast: str) -> list:
        """Rewire the edges' consumers to read `cast`; return them as (node name, input port)."""
        view, consumers = self.view, []
        for e in edges:
            dst = view.e_dst[e]
            dst_port = e - view.in_start[dst]
            self.rewires.setdefault(dst, []).append((dst_port, cast))
            consumers.append((view.names[dst], dst_port))
        return consumers

    def _add(self, name: str, src: str, port: int, from_dtype: int, to_dtype: int, device: str, consumers) -> None:
        self.casts.append(CastRecord(name, src, port, _DTYPE_NAMES[from_dtype], _DTYPE_NAMES[to_dtype],
                                     tuple(consumers)))
        self.devices.append(device)
