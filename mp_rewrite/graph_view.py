"""The graph seen per type attribute: Grappler's NodeTypeAttrMap + GraphTypeTopologyView, as plain Python data.

A vertex is a (node, type attribute) pair: "T", "T[1]" (element 1 of a list(type) attr) or "fixed:float" (an OpDef
argument with a fixed dtype). All ports that share a type attribute must share a dtype, so they are colored as
one unit. Edges are data edges only (control inputs are never ports). Each NodeDef is read once; everything
after construction works on lists and ints.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from . import dtypes
from .errors import GraphError
from .op_support import OpSignature, Signatures

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

    Node arrays (index = position in graph_def.node): names, ops, devices, signatures, in_vids (vertex of each
    data input port), out_vids (vertex of each output port), inputs (data inputs as (src node, src port)),
    out_edges (per output port, the (dst node, dst port) consumers), node_vids (key -> vertex).
    Vertex arrays: v_node, v_key, v_dtype, v_attr (attr name, or "" when fixed), fanin, fanout (sorted, unique).
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
        self._upgrade = upgrade_batch_norm
        self.upgraded = set()
        self.names, self.ops, self.devices, self.sigs = [], [], [], []
        self.in_vids, self.out_vids, self.inputs, self.node_vids, self.control_inputs = [], [], [], [], []
        self.v_node, self.v_key, self.v_dtype, self.v_attr = [], [], [], []
        self._attr_values = []
        raw_inputs = []
        for index, node in enumerate(graph_def.node):
            raw_inputs.append(self._add_node(index, node))
        self.node_index = {name: i for i, name in enumerate(self.names)}
        if len(self.node_index) != len(self.names):
            dup = next(n for n in self.names if self.names.count(n) > 1)
            raise GraphError(f"two nodes are named '{dup}'; node names must be unique in a GraphDef")
        self._connect(raw_inputs)

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_vertices(self) -> int:
        return len(self.v_node)

    def attr_values(self, node: int) -> dict:
        """The node's type attr values: attr name -> dtype (or a tuple of dtypes for list(type) attrs)."""
        return self._attr_values[node]

    def vertex(self, node_name: str, key: str) -> int | None:
        """Return the vertex id of (node, type attr key), or None."""
        index = self.node_index.get(node_name)
        return None if index is None else self.node_vids[index].get(key)

    def _add_node(self, index: int, node) -> list:
        name, op = node.name, node.op
        if op in BATCH_NORM_V2 and self._upgrade is not None and self._upgrade(name, node.device):
            op = BATCH_NORM_V2[op]
            self.upgraded.add(index)
        sig = self.signatures.get(op, name)
        attrs = node.attr
        values = self._read_type_attrs(sig, attrs, name, op, index)
        in_keys = self._port_keys(sig.inputs, attrs, values, name)
        out_keys = self._port_keys(sig.outputs, attrs, values, name)
        vids = {}
        for attr_name, is_list, _ in sig.type_attrs:
            value = values[attr_name]
            if is_list:
                for i, dt in enumerate(value):
                    vids[f"{attr_name}[{i}]"] = self._new_vertex(index, f"{attr_name}[{i}]", dt, attr_name)
            else:
                vids[attr_name] = self._new_vertex(index, attr_name, value, attr_name)
        for key in in_keys + out_keys:
            if key not in vids:  # a fixed-dtype argument
                vids[key] = self._new_vertex(index, key, _FIXED_DTYPE[key], "")
        self.names.append(name)
        self.ops.append(op)
        self.devices.append(node.device)
        self.sigs.append(sig)
        self.node_vids.append(vids)
        self._attr_values.append(values)
        self.in_vids.append([vids[k] for k in in_keys])
        self.out_vids.append([vids[k] for k in out_keys])
        return list(node.input)

    def _new_vertex(self, node: int, key: str, dtype: int, attr: str) -> int:
        self.v_node.append(node)
        self.v_key.append(key)
        self.v_dtype.append(dtype)
        self.v_attr.append(attr)
        return len(self.v_node) - 1

    def _read_type_attrs(self, sig: OpSignature, attrs, name: str, op: str, index: int) -> dict:
        values = {}
        for attr_name, is_list, default in sig.type_attrs:
            value = attrs.get(attr_name)
            if value is None:
                if attr_name == "U" and index in self.upgraded:
                    values[attr_name] = dtypes.FLOAT  # the V2 upgrade sets U = float
                    continue
                if default is None:
                    raise GraphError(f"node '{name}' (op {op}) has no value for its type attribute '{attr_name}'")
                value = default
            values[attr_name] = tuple(value.list.type) if is_list else value.type
        return values

    def _port_keys(self, args, attrs, values, name) -> list:
        keys = []
        for arg in args:
            if arg.type_list_attr:
                keys.extend(f"{arg.type_list_attr}[{i}]" for i in range(len(values[arg.type_list_attr])))
                continue
            key = arg.type_attr or _fixed_key(arg.fixed_type)
            if arg.number_attr:
                count = attrs.get(arg.number_attr)
                if count is None:
                    raise GraphError(f"node '{name}' has no value for its length attribute '{arg.number_attr}'")
                keys.extend([key] * count.i)
            else:
                keys.append(key)
        return keys

    def _connect(self, raw_inputs: list) -> None:
        n_vertices = len(self.v_node)
        fanin = [[] for _ in range(n_vertices)]
        fanout = [[] for _ in range(n_vertices)]
        self.out_edges = [[[] for _ in ports] for ports in self.out_vids]
        index = self.node_index
        for dst, inputs in enumerate(raw_inputs):
            data = [i for i in inputs if not i.startswith("^")]
            self.control_inputs.append(len(inputs) - len(data))
            ports = self.in_vids[dst]
            if len(data) != len(ports):
                raise GraphError(f"expected {self.ops[dst]} node '{self.names[dst]}' to have {len(ports)} data "
                                 f"input(s), but got {len(data)}")
            parsed = []
            for port, text in enumerate(data):
                src_name, src_port = parse_input(text)
                src = index.get(src_name)
                if src is None:
                    raise GraphError(f"node '{self.names[dst]}' has input '{text}', but no node is named "
                                     f"'{src_name}'; fix the input or add the missing node")
                if src_port >= len(self.out_vids[src]):
                    raise GraphError(f"node '{self.names[dst]}' reads output {src_port} of '{src_name}', which "
                                     f"({self.ops[src]}) has only {len(self.out_vids[src])} output(s)")
                parsed.append((src, src_port))
                self.out_edges[src][src_port].append((dst, port))
                u, v = self.out_vids[src][src_port], ports[port]
                fanout[u].append(v)
                fanin[v].append(u)
            self.inputs.append(parsed)
        self.fanin = [sorted(set(f)) if len(f) > 1 else f for f in fanin]
        self.fanout = [sorted(set(f)) if len(f) > 1 else f for f in fanout]

    def add_edges(self, edges) -> None:
        """Add ephemeral (src vertex, dst vertex) edges, e.g. TensorList writer -> reader, keeping lists sorted."""
        for u, v in edges:
            self.fanout[u] = sorted(set(self.fanout[u]) | {v})
            self.fanin[v] = sorted(set(self.fanin[v]) | {u})


_FIXED_DTYPE = {}


def _fixed_key(dtype: int) -> str:
    key = "fixed:" + dtypes.name(dtype)
    _FIXED_DTYPE[key] = dtype
    return key
