"""The graph seen per type attribute: Grappler's NodeTypeAttrMap + GraphTypeTopologyView, as plain Python data.

A vertex is a (node, type attribute) pair: "T", "T[1]" (element 1 of a list(type) attr) or "fixed:float" (an OpDef
argument with a fixed dtype). All ports that share a type attribute must share a dtype, so they are colored as
one unit. Edges are data edges only (control inputs are never ports). Each NodeDef is read once; everything
after construction works on lists and ints.

Speed and memory (a 1M-node graph must take well under a minute and 4 GiB): a Python wrapper per NodeDef and per
field read is the main cost, so each field is read once, in bulk; nodes of the same shape share one PortLayout
(vertex keys, port -> vertex offsets); and data edges live in flat per-edge lists rather than in small per-node
lists, since millions of small containers cost time to build, memory, and a garbage-collector scan.
"""

from __future__ import annotations

import collections
import itertools
import sys

from tensorflow.core.framework import graph_pb2

from . import dtypes
from ..errors import GraphError
from .op_support import PortLayout, Signatures, attr_default

# Grappler upgrades these before building its view so that scale/offset can stay float32 through attr U.
BATCH_NORM_V2 = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}


def parse_input(name: str) -> tuple[str, int]:
    """Split a data input "node:3" / "node" into ("node", 3) / ("node", 0)."""
    colon = name.rfind(":")
    if colon > 0 and name[colon + 1:].isdigit():
        return name[:colon], int(name[colon + 1:])
    return name, 0


def device_kind(device: str) -> str:
    """Return "gpu", "cpu" or "" (unplaced or unknown) for a device string, as Grappler's IsOnDevice reads it."""
    local = device.rsplit("/", 1)[-1].lower() if device else ""
    if "gpu" in local:
        return "gpu"
    if "cpu" in local:
        return "cpu"
    return ""


class GraphView:
    """Nodes, type-attribute vertices and their data edges, built once from a GraphDef.

    Node arrays (index = position in graph_def.node): names, ops, devices, sigs, layouts (PortLayout), node_first
    (the node's vertices are node_first .. node_first + layout.size - 1), control_inputs (count), in_start (the
    node's data input ports are edges in_start[node] .. in_start[node + 1] - 1).
    Edge arrays (one entry per data input port, in node then port order): e_dst, e_src, e_src_port, e_u (source
    vertex), e_v (destination vertex).
    Vertex arrays: v_node, v_key, v_dtype, v_attr (attr name, or "" when fixed), fanin, fanout (sorted, unique).
    Per-node views built on access: node_vids (key -> vertex), in_vids, out_vids (vertex per port), inputs
    ((src node, src port) per data input), out_edges (per output port, the (dst node, dst port) consumers).
    """

    def __init__(self, graph_def: graph_pb2.GraphDef, upgrade_batch_norm=None, signatures: Signatures | None = None):
        """Build the view.

        Args:
            graph_def: the graph (never modified).
            upgrade_batch_norm: callable (node name, device) -> bool; True upgrades that FusedBatchNorm(Grad) node
                to its V2 op with U = float, as Grappler does for the nodes it processes. The upgraded node
                indices end up in `self.upgraded`.
            signatures: an OpSignature cache to share between graphs (defaults to one for this graph's library).

        Raises:
            GraphError: unknown op, missing input node, wrong input count, duplicate node name, missing type attr.
        """
        self.signatures = signatures or Signatures(graph_def.library)
        nodes = list(graph_def.node)
        self.names = [n.name for n in nodes]
        # Interned: a graph has few distinct ops and devices, and a str object per node costs memory and hashing.
        self.ops = list(map(sys.intern, [n.op for n in nodes]))
        self.devices = list(map(sys.intern, [n.device for n in nodes]))
        self.upgraded = self._upgrade_batch_norms(upgrade_batch_norm)
        self._add_vertices(nodes)
        self.node_index = dict(zip(self.names, range(len(self.names))))
        if len(self.node_index) != len(self.names):
            counts = collections.Counter(self.names)
            dup = next(n for n in self.names if counts[n] > 1)
            raise GraphError(f"two nodes are named '{dup}'; node names must be unique in a GraphDef")
        self._connect(nodes)
        self.node_vids = _PerNode(self, self.vids_of)
        self.in_vids = _PerNode(self, self._in_vids)
        self.out_vids = _PerNode(self, self._out_vids)
        self.inputs = _PerNode(self, self._inputs)
        self.out_edges = _PerNode(self, self._out_edges)
        self._consumers = None

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_vertices(self) -> int:
        return len(self.v_node)

    def attr_values(self, node: int) -> dict:
        """The node's type attr values: attr name -> dtype (or a tuple of dtypes for list(type) attrs)."""
        first, layout = self.node_first[node], self.layouts[node]
        return layout.attr_values(self.v_dtype[first:first + layout.size])

    def vids_of(self, node: int) -> dict:
        """The node's vertices: type attr key -> vertex, in vertex order."""
        first, layout = self.node_first[node], self.layouts[node]
        return dict(zip(layout.keys, range(first, first + layout.size)))

    def vertex(self, node_name: str, key: str) -> int | None:
        """Return the vertex id of (node, type attr key), or None."""
        index = self.node_index.get(node_name)
        return None if index is None else self.vids_of(index).get(key)

    def in_vertex(self, node: int, port: int) -> int:
        """The vertex of data input `port` of `node`."""
        return self.e_v[self.in_start[node] + port]

    def consumers(self, node: int, port: int) -> list:
        """The (dst node, dst port) pairs reading output `port` of `node`, in node order."""
        if self._consumers is None:
            self._consumers = self.consumers_of(range(self.num_nodes))
        return self._consumers.get((node, port), [])

    def consumers_of(self, nodes) -> dict:
        """(node, output port) -> its (dst node, dst port) consumers, for the given nodes (one pass over the edges)."""
        wanted, found = set(nodes), {}
        for e, src in enumerate(self.e_src):
            if src in wanted:
                dst = self.e_dst[e]
                found.setdefault((src, self.e_src_port[e]), []).append((dst, e - self.in_start[dst]))
        return found

    def _in_vids(self, node: int) -> list:
        return self.e_v[self.in_start[node]:self.in_start[node + 1]]

    def _out_vids(self, node: int) -> list:
        return [self.node_first[node] + k for k in self.layouts[node].outputs]

    def _inputs(self, node: int) -> list:
        start, end = self.in_start[node], self.in_start[node + 1]
        return list(zip(self.e_src[start:end], self.e_src_port[start:end]))

    def _out_edges(self, node: int) -> list:
        return [self.consumers(node, port) for port in range(len(self.layouts[node].outputs))]

    def _upgrade_batch_norms(self, upgrade) -> set:
        upgraded = set()
        if upgrade is None:
            return upgraded
        for index, op in enumerate(self.ops):
            if op in BATCH_NORM_V2 and upgrade(self.names[index], self.devices[index]):
                self.ops[index] = BATCH_NORM_V2[op]
                upgraded.add(index)
        return upgraded

    def _add_vertices(self, nodes: list) -> None:
        """Read every node's type attrs; fill sigs, layouts, node_first and the vertex arrays."""
        specs = {}  # op -> (signature, layout if it depends on no attr value else None, type attr names)
        layouts, v_dtype = [], []
        for index, node in enumerate(nodes):
            op = self.ops[index]
            spec = specs.get(op)
            if spec is None:
                spec = specs[op] = self._spec(op, self.names[index])
            sig, layout, type_attrs = spec
            if type_attrs and layout is not None:  # the common case: read the values, the layout is known
                attrs = node.attr
                values = [attrs.get(type_attrs[0])] if len(type_attrs) == 1 else [attrs.get(a) for a in type_attrs]
                if None not in values and index not in self.upgraded:
                    v_dtype.extend([value.type for value in values])
                else:  # a default value, a missing attr or an upgraded node: the careful path
                    layout = None
            if layout is None:  # the layout depends on list lengths or argument counts, or the careful path
                node_dtypes, layout = self._read_attrs(index, sig, node.attr)
                v_dtype.extend(node_dtypes)
            if layout.fixed:
                v_dtype.extend(layout.fixed)
            layouts.append(layout)
        self.sigs = [specs[op][0] for op in self.ops]
        self._fill_vertex_arrays(layouts, v_dtype)
        self._check_dtypes()

    def _check_dtypes(self) -> None:
        """Refuse a dtype enum value TensorFlow does not know (a corrupt or newer graph): nothing could name it."""
        unknown = set(self.v_dtype) - dtypes.KNOWN
        if unknown:
            v = next(v for v, d in enumerate(self.v_dtype) if d in unknown)
            node = self.v_node[v]
            raise GraphError(f"node '{self.names[node]}' (op {self.ops[node]}) has dtype enum {self.v_dtype[v]} for "
                             f"{self.v_key[v]}, which TensorFlow does not know (a corrupt graph, or one from a newer "
                             "TensorFlow)")

    def _fill_vertex_arrays(self, layouts: list, v_dtype: list) -> None:
        self.layouts, self.v_dtype = layouts, v_dtype
        sizes = [layout.size for layout in layouts]
        self.node_first = list(itertools.accumulate(sizes, initial=0))
        self.node_first.pop()
        self.v_node = list(itertools.chain.from_iterable(map(itertools.repeat, range(len(sizes)), sizes)))
        self.v_key = list(itertools.chain.from_iterable(layout.keys for layout in layouts))
        self.v_attr = list(itertools.chain.from_iterable(layout.attrs for layout in layouts))

    def _spec(self, op: str, node_name: str) -> tuple:
        sig = self.signatures.get(op, node_name)
        if sig.number_attrs or any(is_list for _, is_list, _ in sig.type_attrs):
            return sig, None, ()
        layout = self.signatures.layout(sig, (None,) * len(sig.type_attrs), ())
        return sig, layout, tuple(name for name, _, _ in sig.type_attrs)

    def _read_attrs(self, index: int, sig, attrs) -> tuple[list, PortLayout]:
        """Read the node's type attrs (in vertex order) and argument counts; return (dtypes, layout)."""
        node_dtypes, lengths = [], []
        for attr_name, is_list, default in sig.type_attrs:
            value = attrs.get(attr_name)
            if value is None:
                if attr_name == "U" and index in self.upgraded:
                    node_dtypes.append(dtypes.FLOAT)  # the V2 upgrade sets U = float
                    lengths.append(None)
                    continue
                if default is None:
                    raise GraphError(f"node '{self.names[index]}' (op {self.ops[index]}) has no value for its type "
                                     f"attribute '{attr_name}'")
                value = default
            if is_list:
                types = value.list.type
                node_dtypes.extend(types)
                lengths.append(len(types))
            else:
                node_dtypes.append(value.type)
                lengths.append(None)
        counts = []
        for attr_name in sig.number_attrs:
            count = attrs.get(attr_name)
            if count is None:  # a default-valued count a SavedModel left out (ParseSequenceExampleV2's)
                count = attr_default(self.ops[index], attr_name)
            if count is None:
                raise GraphError(f"node '{self.names[index]}' has no value for its length attribute '{attr_name}'")
            counts.append(count.i)
        return node_dtypes, self.signatures.layout(sig, tuple(lengths), tuple(counts))

    def _connect(self, nodes: list) -> None:
        """Parse every node's inputs into the edge arrays; build fanin/fanout."""
        index_get, first, layouts = self.node_index.get, self.node_first, self.layouts
        self.in_start, self.control_inputs = in_start, control_inputs = [0], []
        self.e_dst, self.e_src, self.e_src_port, self.e_u, self.e_v = e_dst, e_src, e_src_port, e_u, e_v = (
            [], [], [], [], [])
        for dst, node in enumerate(nodes):
            inputs = node.input
            base, ports = first[dst], layouts[dst].inputs
            port = n_control = 0
            for text in inputs:
                src = index_get(text)  # node names cannot hold ":" or "^": a hit is output 0 of that node
                src_port = 0
                if src is None:
                    if text.startswith("^"):
                        n_control += 1
                        continue
                    src_name, src_port = parse_input(text)
                    src = index_get(src_name)
                outputs = None if src is None else layouts[src].outputs
                if outputs is None or port >= len(ports) or src_port >= len(outputs):
                    self._raise_input_error(dst, inputs)
                e_src.append(src)
                e_src_port.append(src_port)
                e_u.append(first[src] + outputs[src_port])
                e_v.append(base + ports[port])
                port += 1
            if port != len(ports):
                self._raise_input_error(dst, inputs)
            e_dst.extend([dst] * port)
            in_start.append(len(e_src))
            control_inputs.append(n_control)
        self._build_adjacency()

    def _build_adjacency(self) -> None:
        n_vertices = len(self.v_node)
        self.fanin = fanin = [[] for _ in range(n_vertices)]
        self.fanout = fanout = [[] for _ in range(n_vertices)]
        for u, v in zip(self.e_u, self.e_v):
            fanout[u].append(v)
            fanin[v].append(u)
        for adjacency in (fanin, fanout):
            for v, vs in enumerate(adjacency):
                if len(vs) > 1:
                    adjacency[v] = sorted(set(vs))

    def _raise_input_error(self, dst: int, inputs) -> None:
        """Raise the GraphError for the first bad data input of node `dst`, checks in Grappler's order."""
        data = [i for i in inputs if not i.startswith("^")]
        ports = self.layouts[dst].inputs
        if len(data) != len(ports):
            raise GraphError(f"expected {self.ops[dst]} node '{self.names[dst]}' to have {len(ports)} data "
                             f"input(s), but got {len(data)}")
        for text in data:
            src_name, src_port = parse_input(text)
            src = self.node_index.get(src_name)
            if src is None:
                raise GraphError(f"node '{self.names[dst]}' has input '{text}', but no node is named "
                                 f"'{src_name}'; fix the input or add the missing node")
            n_outputs = len(self.layouts[src].outputs)
            if src_port >= n_outputs:
                raise GraphError(f"node '{self.names[dst]}' reads output {src_port} of '{src_name}', which "
                                 f"({self.ops[src]}) has only {n_outputs} output(s)")
        raise AssertionError(f"no bad input found for node '{self.names[dst]}'")

    def add_edges(self, edges) -> None:
        """Add ephemeral (src vertex, dst vertex) edges, e.g. TensorList writer -> reader, keeping lists sorted."""
        for u, v in edges:
            self.fanout[u] = sorted(set(self.fanout[u]) | {v})
            self.fanin[v] = sorted(set(self.fanin[v]) | {u})

    def release_edges(self) -> None:
        """Drop the edge and adjacency arrays once the rewrite is applied (Decisions only need nodes and vertices);
        freeing them early returns their memory before the caller's next garbage collection has to scan them."""
        self.fanin = self.fanout = None
        self.e_dst = self.e_src = self.e_src_port = self.e_u = self.e_v = self._consumers = None


class _PerNode:
    """A read-only per-node sequence computed on access (a list per node would cost more than it saves)."""

    def __init__(self, view: GraphView, get):
        self._view, self._get = view, get

    def __getitem__(self, node: int):
        return self._get(node)

    def __len__(self) -> int:
        return self._view.num_nodes
