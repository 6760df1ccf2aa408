"""The accuracy guard's analysis: graph structure, the one-run range screen, and low-precision units.

A front end (like `execution`): structure comes from importing a GraphDef into a `tf.Graph` once and keeping plain
Python data; values come from `run_graph_def`. Nothing here decides what to keep beyond the screen's range rule.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
from tensorflow.core.framework import graph_pb2, types_pb2

from ..analysis.execution import tensor_name
from ..core.graph_view import parse_input

LOW_DTYPES = frozenset({types_pb2.DT_HALF, types_pb2.DT_BFLOAT16})
# (largest finite, smallest normal, half an ulp at 1.0): float16 keeps 11 significant bits, bfloat16 8.
LOW_RANGES = {"float16": (65504.0, 2.0 ** -14, 2.0 ** -11),
              "bfloat16": (3.3895313892515355e38, 2.0 ** -126, 2.0 ** -8)}
V1_CONTROL_FLOW = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "Merge",
                             "RefMerge", "Switch", "RefSwitch", "LoopCond"})


class GraphInfo:
    """Nodes of one GraphDef in topological order, with data edges and output dtypes, as plain Python data.

    Attributes:
        names: node names in a canonical topological order (ties broken by name), so that the guard's choices
            do not depend on the order of nodes in the GraphDef.
        ops: name -> op type.
        inputs: name -> data inputs [(src, port)]; controls: name -> control input names.
        dtypes: name -> output dtype enums; consumers: (name, port) -> consumer names (sorted, unique).
    """

    def __init__(self, graph_def: graph_pb2.GraphDef):
        import tensorflow as tf
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        self.ops, self.inputs, self.controls, self.dtypes = {}, {}, {}, {}
        consumers = {}
        for op in graph.get_operations():
            name = op.name
            self.ops[name] = op.type
            self.inputs[name] = [(t.op.name, t.value_index) for t in op.inputs]
            self.controls[name] = [c.name for c in op.control_inputs]
            self.dtypes[name] = [t.dtype.base_dtype.as_datatype_enum for t in op.outputs]
            for src in self.inputs[name]:
                consumers.setdefault(src, set()).add(name)
        self.consumers = {k: sorted(v) for k, v in consumers.items()}
        readers = {}
        for (src, _), names in consumers.items():
            readers.setdefault(src, set()).update(names)
        self._readers = {k: sorted(v) for k, v in readers.items()}
        self.names = self._topological()
        self.order = {name: i for i, name in enumerate(self.names)}

    def _topological(self) -> list:
        # Kahn's algorithm, smallest name first; a loop's NextIteration back edge is not a dependency.
        needs, followers = {}, {}
        for name in self.ops:
            sources = {src for src, _ in self.inputs[name]} | set(self.controls[name])
            sources = {s for s in sources if self.ops[s] not in ("NextIteration", "RefNextIteration")}
            needs[name] = len(sources)
            for src in sources:
                followers.setdefault(src, []).append(name)
        ready = [name for name, n in needs.items() if n == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            name = heapq.heappop(ready)
            order.append(name)
            for follower in followers.get(name, ()):
                needs[follower] -= 1
                if needs[follower] == 0:
                    heapq.heappush(ready, follower)
        placed = set(order)
        return order + sorted(n for n in self.ops if n not in placed)

    def readers(self, name: str) -> list[str]:
        """Every node reading any output of `name` (sorted)."""
        return self._readers.get(name, [])

    def has_v1_control_flow(self) -> bool:
        """True when the graph has Switch/Merge/Enter/Exit loops or conditionals (their tensors live in frames)."""
        return any(op in V1_CONTROL_FLOW for op in self.ops.values())

    def in_frames(self) -> set:
        """Nodes inside a while-loop frame (reachable from an Enter without leaving through an Exit); TF cannot
        fetch their tensors."""
        inside, stack = set(), [n for n in self.names if self.ops[n] in ("Enter", "RefEnter")]
        followers = {}
        for name in self.names:
            for src, _ in self.inputs[name]:
                followers.setdefault(src, []).append(name)
            for src in self.controls[name]:
                followers.setdefault(src, []).append(name)
        while stack:
            name = stack.pop()
            if name in inside or self.ops[name] in ("Exit", "RefExit"):
                continue
            inside.add(name)
            stack.extend(followers.get(name, ()))
        return inside


# --------------------------------------------------------------------------------------------- the screen


@dataclasses.dataclass(frozen=True)
class ScreenTarget:
    """A float32 tensor that the mixed graph holds in low precision: produced by a converted node (`producer`)
    or cast to low precision for converted `readers`."""

    tensor: str
    producer: str | None
    readers: tuple


@dataclasses.dataclass(frozen=True)
class Finding:
    """A node the screen keeps in float32, and why.

    Attributes:
        node: the node kept; tensor: the float32 tensor whose range decided it.
        kind: "overflow" or "underflow"; role: "produces" (node computes the tensor) or "reads" it.
        absmax: max |x| of the tensor on the calibration inputs; tiny_share: share of its nonzero values below the
            low precision's smallest normal.
        detail: the words for the Reason ("max |x| = 7.1e+05 exceeds float16 (max 65504) at its output d/MatMul:0").
    """

    node: str
    tensor: str
    kind: str
    role: str
    absmax: float
    tiny_share: float
    detail: str


def screen_targets(mixed: GraphInfo, converted: set, casts, skip: set = frozenset()) -> list[ScreenTarget]:
    """The tensors a rewrite holds in low precision, as float32 tensors of the original graph.

    Args:
        mixed: GraphInfo of the rewritten graph; converted: names of its converted nodes; casts: its CastRecords.
        skip: nodes whose tensors cannot be fetched (inside loop frames).
    """
    targets = {}
    for name in mixed.names:
        if name not in converted or name in skip:
            continue
        for port, dtype in enumerate(mixed.dtypes[name]):
            if dtype in LOW_DTYPES:
                readers = tuple(c for c in mixed.consumers.get((name, port), ()) if c in converted)
                targets[f"{name}:{port}"] = ScreenTarget(f"{name}:{port}", name, readers)
    for cast in casts:
        if cast.to_low and cast.src not in skip:
            tensor = f"{cast.src}:{cast.src_port}"
            readers = tuple(sorted({node for node, _ in cast.consumers} & converted))
            if readers and tensor not in targets:
                targets[tensor] = ScreenTarget(tensor, None, readers)
    return list(targets.values())


def tensor_range(value: np.ndarray, tiny: float) -> tuple[float, float]:
    """(max |x| over finite values, share of nonzero finite values with |x| < tiny)."""
    a = np.abs(np.asarray(value, dtype=np.float64))
    a = a[np.isfinite(a)]
    if a.size == 0:
        return 0.0, 0.0
    nonzero = int(np.count_nonzero(a))
    small = int(np.count_nonzero((a > 0) & (a < tiny)))
    return float(a.max()), (small / nonzero if nonzero else 0.0)


def range_findings(targets, values, precision: str, underflow_share: float | None = 0.5) -> list[Finding]:
    """Nodes that must stay float32 because a tensor they produce or read does not fit the low precision.

    Overflow: max |x| beyond the largest finite value (65504 for float16): the producer and every low-precision
    reader are kept, since a reader would get the tensor through a Cast that overflows.
    Underflow ("where it matters"): at least `underflow_share` of the nonzero values are below the smallest normal
    AND those values are not negligible at the tensor's scale (max |x| * half-ulp < smallest normal); a softmax
    with a few 1e-7 probabilities next to 0.9 is not flagged, a layer whose activations all live near 1e-6 is.

    Returns:
        One Finding per node (its first reason), producers before readers, in the order of `targets`.
    """
    largest, tiny, half_ulp = LOW_RANGES[precision]
    found = {}
    for target, value in zip(targets, values):
        absmax, share = tensor_range(value, tiny)
        if absmax > largest:
            kind, what = "overflow", f"max |x| = {absmax:.2g} exceeds {precision} (max {largest:.6g})"
        elif underflow_share is not None and share >= underflow_share and absmax * half_ulp < tiny:
            kind, what = "underflow", (f"{share:.0%} of the nonzero values are below {precision}'s smallest normal "
                                       f"({tiny:.2g}) and max |x| = {absmax:.2g}")
        else:
            continue
        if target.producer is not None:
            found.setdefault(target.producer, Finding(target.producer, target.tensor, kind, "produces", absmax,
                                                      share, f"{what} at its output {target.tensor}"))
        for reader in target.readers:
            found.setdefault(reader, Finding(reader, target.tensor, kind, "reads", absmax, share,
                                             f"reads {target.tensor}, where {what}"))
    return list(found.values())


# --------------------------------------------------------------------------------------------- units


@dataclasses.dataclass(frozen=True)
class Unit:
    """A group of converted nodes kept or converted together: one allow-list node (the seed: a MatMul, Conv2D,
    Einsum, ...) and the clear/infer nodes that follow it (or feed it, like a weight's Identity).

    Attributes:
        seed: the allow-list node that names the unit; nodes: its nodes in topological order.
        region: index of the connected low-precision region it belongs to.
    """

    seed: str
    nodes: tuple
    region: int


def converted_units(info: GraphInfo, converted: set, seeds: set) -> list[Unit]:
    """Partition the converted nodes into Units, in topological order of their seeds.

    A non-seed node joins the unit of its first converted data input; one with none (a weight's Identity or a
    Reshape in front of a MatMul) joins the unit of its first converted reader; what is left forms its own unit.
    """
    owner = {}
    for name in info.names:
        if name not in converted:
            continue
        if name in seeds:
            owner[name] = name
            continue
        owner[name] = next((owner[src] for src, _ in info.inputs[name] if src in owner), None)
    for name in reversed(info.names):
        if name in converted and owner.get(name) is None:
            owner[name] = next((owner[c] for c in info.readers(name) if owner.get(c)), name)
    regions = _regions(info, converted)
    members = {}
    for name in info.names:
        if name in owner:
            members.setdefault(owner[name], []).append(name)
    return [Unit(seed, tuple(nodes), regions[seed]) for seed, nodes in
            sorted(members.items(), key=lambda item: info.order[item[0]])]


def _regions(info: GraphInfo, converted: set) -> dict:
    """name -> index of its connected component of converted nodes (data edges, either direction)."""
    neighbours = {name: set() for name in converted}
    for name in converted:
        for src, _ in info.inputs.get(name, ()):
            if src in converted:
                neighbours[name].add(src)
                neighbours[src].add(name)
    region, count = {}, 0
    for name in info.names:
        if name in converted and name not in region:
            stack = [name]
            while stack:
                n = stack.pop()
                if n not in region:
                    region[n] = count
                    stack.extend(neighbours[n] - region.keys())
            count += 1
    return region


def by_region(units: list[Unit]) -> list[Unit]:
    """Merge the units of each region into one (coarser candidates, cheaper to isolate); a region of one unit
    stays that unit, a bigger one is named "region of <its first seed> (<n> units)"."""
    merged = {}
    for unit in units:
        merged.setdefault(unit.region, []).append(unit)
    return [group[0] if len(group) == 1 else
            Unit(f"region of {group[0].seed} ({len(group)} units)", tuple(n for u in group for n in u.nodes), region)
            for region, group in sorted(merged.items())]


def output_tensors(fetches) -> list[str]:
    """Fetch names ("node", "node:1") as tensor names."""
    return [tensor_name(f) for f in fetches]


def node_of(tensor: str) -> str:
    """"node:1" -> "node"."""
    return parse_input(tensor)[0]
