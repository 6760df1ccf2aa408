"""`fusion_groups`: the sets of nodes TensorFlow's CPU remapper (oneDNN build, TF 2.21) would fuse into one kernel.

A precision pass that puts a Cast inside a group (between a MatMul and its BiasAdd or activation) breaks the
fusion, and the standalone elementwise ops it leaves are the slow ones in bfloat16; so each group should take one
precision. The groups are plain data (node names), for a stage of the core to read without importing this package.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .activation import GELUS, activation_name, activation_region
from .evaluate import evaluate
from .graph import FLOAT_TYPES, EditableGraph, node_name
from .layer_norm import FUSED_ROLES, MARK as LAYER_NORM_MARK

CONTRACTIONS = {"MatMul": "_FusedMatMul", "Conv2D": "_FusedConv2D",
                "DepthwiseConv2dNative": "_FusedDepthwiseConv2dNative", "Conv3D": "_FusedConv3D"}
ACTIVATIONS = ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid")
RESIDUAL_ADDS = ("Add", "AddV2", "AddN")  # Conv2D/MatMul + BiasAdd + a residual: fused_ops [BiasAdd, Add]
RESIDUAL_ACTIVATIONS = ("Relu", "Relu6", "Elu", "LeakyRelu")  # after a Conv2D's residual add only
REGION_ACTIVATIONS = GELUS  # MatMul only, several nodes each
HARD_SWISH_OPS = ["AddV2", "Mul", "Mul", "Relu6"]  # x * relu6(x + 3) / 6 after folding, Conv2D/depthwise only
HARD_SWISH_POINTS = np.linspace(-8.0, 8.0, 65)
FUSED_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


@dataclasses.dataclass(frozen=True)
class FusionGroup:
    """Nodes the remapper fuses into one op.

    Attributes:
        root: the contraction (or FusedBatchNorm, or Sigmoid of a swish, or a layer normalization's output).
        op: the fused op TensorFlow makes ("_FusedMatMul", "_FusedConv2D", "_FusedBatchNormEx", "_MklSwish",
            "_MklLayerNorm").
        fused_ops: its `fused_ops` attribute, e.g. ("BiasAdd", "GeluExact").
        nodes: every node of the group, root included.
    """

    root: str
    op: str
    fused_ops: tuple
    nodes: frozenset


def fusion_groups(graph_def, fetches=()) -> list[FusionGroup]:
    """The groups of nodes the remapper would fuse, in graph order.

    Args:
        graph_def: a GraphDef; not modified.
        fetches: tensor or node names that are preserved (the remapper does not fuse a preserved inner node).

    Returns:
        [FusionGroup]; a node is in at most one group.
    """
    graph = EditableGraph(graph_def, fetches)
    groups, taken = [], set()
    # Sigmoids last: a swish after a Conv2D is the Conv2D's group, and a node is in at most one group.
    for node in sorted(graph.graph_def.node, key=lambda n: n.op == "Sigmoid"):
        if node.name in taken:
            continue
        if node.op in CONTRACTIONS:
            group = _contraction_group(graph, node)
        elif node.op in FUSED_NORMS:
            group = _norm_group(graph, node)
        elif node.op == "Sigmoid":
            group = _swish_group(graph, node)
        else:
            group = None
        if group is not None:
            groups.append(group)
            taken |= group.nodes
    order = {node.name: i for i, node in enumerate(graph.graph_def.node)}
    return sorted(groups, key=lambda g: order[g.root]) + _layer_norm_groups(graph)


def _layer_norm_groups(graph: EditableGraph) -> list[FusionGroup]:
    """The layer normalizations rules/layer_norm.py wrote, by their nodes' names (<output>/layer_norm_form/<role>);
    the output is in the group when it is the pattern's last AddV2 (a rank-2 input)."""
    members = {}
    for node in graph.graph_def.node:
        output, mark, role = node.name.rpartition(LAYER_NORM_MARK)
        if mark and role in FUSED_ROLES:
            members.setdefault(output, set()).add(node.name)
    groups = []
    for output, names in members.items():
        root = output if graph.nodes.get(output) is not None and graph.nodes[output].op == "AddV2" else \
            f"{output}{LAYER_NORM_MARK}normalized_flat"
        groups.append(FusionGroup(root, "_MklLayerNorm", (), frozenset(names | {root})))
    return groups


def _sole_reader(graph: EditableGraph, node, ops):
    """The node's only reader when its op is one of `ops` and the node is not preserved, else None."""
    reader = graph.only_reader(node.name)
    return reader if reader is not None and reader.op in ops and not graph.is_kept(node) else None


def _contraction_group(graph: EditableGraph, node) -> FusionGroup | None:
    if node.attr["T"].type not in FLOAT_TYPES:
        return None
    squeeze = _sole_reader(graph, node, ("Squeeze",)) if node.op == "Conv2D" else None
    bias = _sole_reader(graph, squeeze or node, ("BiasAdd",))
    if bias is None or graph.producer(bias.input[0]) is not (squeeze or node):
        return None
    members, fused = [node, bias] + ([squeeze] if squeeze is not None else []), ["BiasAdd"]
    # No activation is fused after a Squeeze. What follows the BiasAdd, as TF 2.21 runs a SavedModel's call (a
    # Session's Grappler fuses no residual add: there an unknown batch leaves the addends' shapes unknown):
    swish = _swish_after(graph, bias) if node.op == "Conv2D" and squeeze is None else None
    activation = _sole_reader(graph, bias, ACTIVATIONS) if squeeze is None else None
    residual = _sole_reader(graph, bias, RESIDUAL_ADDS) if node.op in ("Conv2D", "MatMul") and squeeze is None \
        else None
    if swish is not None:
        members += swish
        fused.append("_MklSwish")
    elif activation is not None:
        members.append(activation)
        fused.append(activation.op)
    elif residual is not None and len(graph.data_inputs(residual)) == 2:
        members.append(residual)
        fused.append("Add")
        after = _sole_reader(graph, residual, RESIDUAL_ACTIVATIONS) if node.op == "Conv2D" else None
        if after is not None:
            members.append(after)
            fused.append(after.op)
    elif node.op == "MatMul" and not graph.is_kept(bias):
        found = activation_region(graph, bias)
        if found is not None and found.ok and activation_name(found.values["region"]) in REGION_ACTIVATIONS:
            members += found.values["region"]
            fused.append(activation_name(found.values["region"]))
    elif node.op in ("Conv2D", "DepthwiseConv2dNative") and squeeze is None and not graph.is_kept(bias):
        region = _hard_swish(graph, bias)
        if region is not None:
            members += region
            fused.append("_FusedHardSwish")
    return FusionGroup(node.name, CONTRACTIONS[node.op], tuple(fused), frozenset(n.name for n in members))


def _hard_swish(graph: EditableGraph, bias) -> list | None:
    """The region after the BiasAdd when it computes hard swish, x * relu6(x + 3) / 6 (MobileNetV3's, which TF's
    remapper fuses after a Conv2D or a depthwise one), recognized by evaluating it; else None."""
    found = activation_region(graph, bias)
    if found is None or not found.ok or sorted(n.op for n in found.values["region"]) != HARD_SWISH_OPS:
        return None
    values = evaluate(graph, bias, found.values["region"], found.nodes["exit"], HARD_SWISH_POINTS)
    expected = HARD_SWISH_POINTS * np.clip(HARD_SWISH_POINTS + 3, 0, 6) / 6
    return found.values["region"] if values is not None and np.allclose(values, expected, atol=1e-5) else None


def _swish_after(graph: EditableGraph, bias) -> list | None:
    """[Sigmoid, Mul] when the BiasAdd's readers are exactly swish's (`Mul(bias, Sigmoid(bias))`), else None."""
    readers = graph.readers(bias.name)
    sigmoid = next((r for r in readers if r.op == "Sigmoid"), None)
    mul = next((r for r in readers if r.op == "Mul"), None)
    if len(readers) != 2 or sigmoid is None or mul is None or graph.is_kept(bias) or graph.is_kept(sigmoid) or \
            sorted(mul.input) != sorted([bias.name, sigmoid.name]):
        return None
    return [sigmoid, mul]


def _norm_group(graph: EditableGraph, node) -> FusionGroup | None:
    relu = _sole_reader(graph, node, ("Relu",))
    if relu is None or any(":" in t and not t.endswith(":0") for r in [relu] for t in r.input):
        return None
    return FusionGroup(node.name, "_FusedBatchNormEx", ("Relu",), frozenset({node.name, relu.name}))


def _swish_group(graph: EditableGraph, node) -> FusionGroup | None:
    mul = _sole_reader(graph, node, ("Mul",))
    if mul is None or _source(graph, node.input[0]) not in {_source(graph, t) for t in mul.input}:
        return None
    return FusionGroup(node.name, "_MklSwish", (), frozenset({node.name, mul.name}))


def _source(graph: EditableGraph, tensor: str) -> str:
    """The node name behind `tensor`, looking through Identities (TF's dependency optimizer removes them first)."""
    return node_name(graph.forwarded(tensor))
