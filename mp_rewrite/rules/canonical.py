"""`canonicalize`: rewrite a GraphDef into the patterns TensorFlow's CPU remapper fuses, with a record of every
rule applied or declined (and why).

The rules are data (RULES): a name, the ops a pattern is rooted at, a matcher (conditions included: it returns a
declined Match with a reason), a rewrite, and the fusion it enables. They run to a fixed point, since one rule's
output is another's input (a batched matmul becomes a MatMul between Reshapes, the Reshapes merge, the bias and the
activation move next to the MatMul).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .batchnorm import RULE as BATCHNORM_FOLD, fold_batch_norms_recorded
from .batchnorm_variables import (batchnorm_fused_fusion, batchnorm_fusion, match_batchnorm_into_filter,
                                  match_float32_scaled_filter, rewrite_batchnorm_fused, rewrite_batchnorm_into_filter,
                                  rewrite_float32_scaled_filter)
from .cast_placement import match_cast_after_gather, rewrite_cast_after_gather
from .bias import match_bias_add, rewrite_bias_add
from .dense import match_dense_activation, match_dense_bias, rewrite_dense_activation, rewrite_dense_bias
from .gelu import match_gelu, rewrite_gelu
from .graph import EditableGraph, drop_unset_attrs, reachable
from .graph_check import Fault, drop_stale_shapes, graph_fault
from .grouped_conv import match_grouped_conv, rewrite_grouped_conv
from .identity import match_identity_n, rewrite_identity_n
from .layer_norm import match_layer_norm, rewrite_layer_norm
from .padding import match_explicit_padding, rewrite_explicit_padding
from .residual import match_residual_bias, match_residual_rows, rewrite_residual_bias, rewrite_residual_rows
from .record import APPLIED, DECLINED, LEFT_OUT, Match, Record
from .reshape import (match_batch_matmul, match_einsum, match_reshape_pair, match_static_reshape,
                      rewrite_batch_matmul, rewrite_einsum, rewrite_reshape_pair, rewrite_static_reshape)
from .scale import match_scale_into_weights, rewrite_scale_into_weights
from .swish import match_swish, rewrite_swish
from .transpose import match_matmul_transpose, rewrite_matmul_transpose

MAX_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class Rule:
    """A graph rewrite rule.

    Attributes:
        name: what records call it.
        anchors: the ops its pattern is rooted at.
        match: (graph, node) -> None (not this pattern), a Match, or a declined Match (`.fail(reason)`).
        rewrite: (graph, match) -> what it did (one line); edits the graph.
        fusion: match -> the fusion it enables in TensorFlow's remapper (for records).
    """

    name: str
    anchors: tuple
    match: Callable
    rewrite: Callable
    fusion: Callable = lambda match: ""


def _contraction_fusion(match: Match) -> str:
    return f"{match.nodes['contraction'].op} + BiasAdd"


RULES = (
    Rule("grouped_conv", ("StatefulPartitionedCall", "PartitionedCall"), match_grouped_conv, rewrite_grouped_conv,
         lambda m: "DepthwiseConv2dNative" if m.values["depthwise"] else "Conv2D per group"),
    Rule("batch_matmul", ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"), match_batch_matmul, rewrite_batch_matmul,
         lambda m: "MatMul (the remapper fuses no BatchMatMul with a bias)"),
    Rule("einsum", ("Einsum",), match_einsum, rewrite_einsum, lambda m: "MatMul (the remapper fuses no Einsum)"),
    Rule("matmul_transpose", ("Transpose",), match_matmul_transpose, rewrite_matmul_transpose),
    Rule("reshape_pair", ("Reshape",), match_reshape_pair, rewrite_reshape_pair),
    Rule("static_reshape", ("Reshape",), match_static_reshape, rewrite_static_reshape),
    Rule("bias_add", ("Add", "AddV2"), match_bias_add, rewrite_bias_add, _contraction_fusion),
    Rule("dense_bias", ("Reshape",), match_dense_bias, rewrite_dense_bias, lambda m: "MatMul + BiasAdd"),
    Rule("dense_activation", ("Reshape",), match_dense_activation, rewrite_dense_activation,
         lambda m: f"MatMul + BiasAdd + {m.values['activation']}"),
    Rule("conv1d_bias", ("Squeeze",), match_dense_bias, rewrite_dense_bias, lambda m: "Conv2D + BiasAdd"),
    Rule("conv1d_activation", ("Squeeze",), match_dense_activation, rewrite_dense_activation,
         lambda m: f"Conv2D + BiasAdd + {m.values['activation']}"),
    Rule("gelu", ("BiasAdd",), match_gelu, rewrite_gelu, lambda m: f"MatMul + BiasAdd + {m.values['form']}"),
    Rule("explicit_padding", ("Conv2D", "DepthwiseConv2dNative"), match_explicit_padding, rewrite_explicit_padding,
         lambda m: f"{m.nodes['conv'].op} with its Pad (padding {m.values['padding'].decode()})"),
    Rule("layer_norm", ("Mean",), match_layer_norm, rewrite_layer_norm, lambda m: "LayerNorm (_MklLayerNorm)"),
    Rule("identity_n", ("IdentityN",), match_identity_n, rewrite_identity_n),
    Rule("swish", ("Mul",), match_swish, rewrite_swish, lambda m: m.values["fusion"]),
    Rule("scale_into_weights", ("Mul",), match_scale_into_weights, rewrite_scale_into_weights),
    Rule("batchnorm_into_filter", ("Add", "AddV2", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"),
         match_batchnorm_into_filter, rewrite_batchnorm_into_filter,
         batchnorm_fusion),
    Rule("residual_bias", ("Add", "AddV2", "AddN"), match_residual_bias, rewrite_residual_bias,
         lambda m: f"{m.nodes['contraction'].op} + BiasAdd" + (" + Add" if m.values["residual"] else "")),
    Rule("residual_rows", ("Add", "AddV2"), match_residual_rows, rewrite_residual_rows,
         lambda m: "MatMul + BiasAdd + Add"),
)

# For a graph that will compute in float32 (no low-precision units): a BatchNorm after a Conv2D as the
# FusedBatchNorm TF fuses into a float32 convolution, the filter untouched.
FLOAT32_RULES = tuple(Rule("batchnorm_fused", rule.anchors, rule.match, rewrite_batchnorm_fused, batchnorm_fused_fusion)
                      if rule.name == "batchnorm_into_filter" else rule for rule in RULES)

# After the precision pass (a graph in which weights stay variables): where its Casts run, and what a
# convolution the pass left float32 does with its BatchNorm.
PLACEMENT_RULES = (Rule("cast_after_gather", ("Cast",), match_cast_after_gather, rewrite_cast_after_gather),
                   Rule("float32_batchnorm", ("BiasAdd",), match_float32_scaled_filter, rewrite_float32_scaled_filter,
                        lambda m: "Conv2D + FusedBatchNorm"))


def canonicalize(graph_def, fetches=(), rules=RULES, fold_batch_norms: bool = True,
                 shapes=None, alive=()) -> tuple[object, list]:
    """Rewrite a graph so that TensorFlow's remapper can fuse its contractions with their bias and activation.

    Args:
        graph_def: a GraphDef (frozen: the rules that need weights read them from Consts); not modified.
        fetches: tensor or node names whose nodes keep their name, op and value.
        rules: the rules to run (RULES by default).
        fold_batch_norms: first fold per-channel scales and shifts (BatchNormalization) into the contraction
            before them (batchnorm.py); this needs a frozen, constant-folded graph.
        shapes: {node name: shape} of weights that are not constants (a traced training step's variables, keyed
            by their resource placeholder or ReadVariableOp), for the rules that need a channel count.
        alive: tensor or node names that must still name a node afterwards (not removed as unread), though rules
            may change what computes them (tensors a SavedModel's object graph restores by name).

    Returns:
        (a new GraphDef, [Record]): every rule applied and every rule declined where its pattern was found, with
        the reason, in the order they happened; a decline later made moot by another rule's rewrite is dropped.
        The new graph passes `graph_check.graph_fault`: a rule whose rewrite fails it is left out of this graph
        (a "left out" Record says which, and why) and the rules run again without it, so no rule can break a graph.
    """
    left_out, original = [], None
    while True:
        new, records = _rewritten(graph_def, fetches, rules, fold_batch_norms, shapes, alive)
        if not any(record.applied for record in records):
            return new, records + left_out
        fault = graph_fault(new, fetches, shapes)
        if fault is not None and fault.reason.startswith(IMPORT_FAULT):
            # a graph TF's importer refuses as it was given (an op this process does not register) says nothing
            # of the rules: then only the structure (inputs and outputs that name nodes) is theirs to answer for
            original = original or graph_fault(graph_def, fetches, shapes) or NO_FAULT
            fault = None if original is not NO_FAULT else fault
        if fault is None:
            return new, records + left_out
        culprits = _culprits(records, fault)
        left_out += [Record(name, _where(fault), LEFT_OUT, f"left out of this graph: its rewrite failed the check "
                            f"({fault.reason}); the graph was converted without it") for name in culprits]
        rules = tuple(rule for rule in rules if rule.name not in culprits)
        fold_batch_norms = fold_batch_norms and BATCHNORM_FOLD not in culprits


IMPORT_FAULT = "TensorFlow does not import it"
NO_FAULT = Fault("", frozenset())


def _rewritten(graph_def, fetches, rules, fold_batch_norms: bool, shapes, alive) -> tuple[object, list]:
    """The rules run to a fixed point over a copy of `graph_def` (canonicalize's arguments), unchecked."""
    records, needed = [], reachable(graph_def, fetches)
    if fold_batch_norms:
        graph_def, records = fold_batch_norms_recorded(graph_def, fetches)
    graph = EditableGraph(graph_def, fetches, shapes)
    declined = {}
    for _ in range(MAX_ROUNDS):
        applied = _run_round(graph, rules, records, declined)
        if not applied:
            break
        # asked again (lazily) in the next round, the new nodes included, from TF's inference, not from the shapes
        # a rewritten node still states (TF's importer takes a node's `_output_shapes` over its own inference)
        drop_stale_shapes(graph.graph_def, graph_def, shapes)
        graph.forget_shapes()
    records += [r for r in declined.values() if r.node in graph.nodes]
    # What a rewrite left unread (the chain a BatchNorm was folded out of) would keep the contraction "read by 2
    # nodes" for whoever looks next; what was dead before is not ours to remove, unless it reads what went (Keras
    # leaves an unread strided_slice of a Shape that a rewrite stopped reading).
    graph.remove(needed - reachable(graph.graph_def, (*fetches, *alive)))
    graph.remove_orphans()
    drop_unset_attrs(graph.graph_def)
    return graph.graph_def, records


def _culprits(records: list, fault: Fault) -> list[str]:
    """The rules whose applied rewrites cover a node the fault names (a node they added is named after one they
    covered: 'x/before_reshape'); every rule that applied when the fault names none of theirs."""
    applied = [record for record in records if record.applied]

    def covers(record) -> bool:
        names = (record.node, *record.nodes)
        return any(f == n or f.startswith(f"{n}/") for f in fault.nodes for n in names)
    return list(dict.fromkeys(r.rule for r in applied if covers(r))) or list(dict.fromkeys(r.rule for r in applied))


def _where(fault: Fault) -> str:
    return min(fault.nodes) if fault.nodes else "graph"


def _run_round(graph: EditableGraph, rules, records: list, declined: dict) -> int:
    """Run every rule once over the graph; return how many rewrites were made."""
    applied = 0
    for rule in rules:
        anchors = [node for node in graph.graph_def.node if node.op in rule.anchors]
        for node in anchors:
            if graph.nodes.get(node.name) is not node or node.op not in rule.anchors:
                continue  # removed or changed by an earlier rewrite of this round
            match = rule.match(graph, node)
            if match is None:
                continue
            # the pattern's nodes, and the region it recognized (a LayerNorm's, a GELU's) where it has one
            covered = tuple(dict.fromkeys([n.name for n in match.nodes.values()] +
                                          [n.name for n in match.values.get("region", ())]))
            if not match.ok:
                declined[(rule.name, node.name)] = Record(rule.name, node.name, DECLINED, match.reason,
                                                          nodes=covered)
                continue
            name, fusion = node.name, rule.fusion(match)
            done = rule.rewrite(graph, match)
            declined.pop((rule.name, name), None)
            records.append(Record(rule.name, name, APPLIED, done, fusion, covered))
            applied += 1
    return applied
