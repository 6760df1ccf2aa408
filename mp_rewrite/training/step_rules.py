"""The graph rules a traced training step takes before its precision rewrite (the cost assignment only).

Two kinds. Keras 3's training BatchNormalization layers are fused into FusedBatchNormV3 and its gradient (rules.
batchnorm_training). Then, opted in with MP_REWRITE_STEP_RULES=1 (rules_on: measured, they did not make a
Transformer's step faster), the rewrite rules of rules/ run on the step's body with the weights as variables
(rules.canonicalize, told each variable's shape by the traced function: its resource arguments carry their
variable's shape and dtype as handle data): Keras 3's Dense on 3-D inputs and MultiHeadAttention's projections
become MatMul + BiasAdd, which TensorFlow's remapper fuses in the forward pass, and the batched matmuls of a weight
become MatMuls. A training step differs from an inference function in one way that matters here: the gradient reads
forward values (an activation's input, a LayerNorm's mean and inverse deviation). Every forward node a gradient op
reads is given to the rules as kept (name, op and value stay), so a rule that would rewrite one does not apply
(in a Keras step dense_activation declines and says why; layer_norm and gelu find no region whose inner values
only the region reads, so they match nothing); the rules that move Reshapes and bias adds apply. The FuncGraph's
shapes no longer fit every node of the changed body (a rule may give an old name to a node of another shape), so
the cost model is given shapes inferred again (rewritten_shapes). Grappler's lists (assign="lists") rewrite the
step as traced.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

logger = logging.getLogger("mp_rewrite")

RULES_ENV = "MP_REWRITE_STEP_RULES"  # "1": run the rewrite rules on training steps (rules_on)
# Rules left out of a training step, with why.
NOT_IN_TRAINING = {
    "grouped_conv": "it inlines a call of Keras 3's _conv_xla, whose gradient function reads the call's outputs",
    "batchnorm_into_filter": "it scales a filter that the step also updates (an inference BatchNorm's rewrite)",
    # The IdentityNs of a step are tf.custom_gradient's (swish) and Keras 3's optimizer's: the gradient reads the
    # activation's input anyway, so removing them fuses nothing, and a step they alone change would be raced
    # against itself as traced for no gain.
    "identity_n": "it fuses nothing in a training step (the gradient reads the activation's input anyway)",
}
# The name scopes TensorFlow puts gradient ops in: tf.GradientTape's and tf.gradients' (`gradients_1`, ...).
_GRADIENT_SCOPE = re.compile(r"(^|/)(gradient_tape|gradients(_\d+)?)/")


def training_rules():
    """The rules of rules.RULES that run on a training step (all but NOT_IN_TRAINING)."""
    from ..rules import RULES
    return tuple(rule for rule in RULES if rule.name not in NOT_IN_TRAINING)


def rewritten_step(atomic, traced, options, name: str):
    """(body, changes): the traced body (core.functions.BodyGraph) with Keras 3's training BatchNorms fused and the
    training rules applied, and what changed (one phrase per fused layer or applied rule; empty: `traced` itself).
    With assign="lists", or when a step of the rules fails or leaves a node reading one that is gone, that stage is
    left out (one warning). `atomic` is the traced AtomicFunction (its FuncGraph gives the arguments' shapes) or
    None (the rules that need a weight's shape then decline)."""
    if options.assign != "cost":
        return traced, ()
    body, fused = fused_batch_norms(traced, name)
    records = []
    if rules_on():
        body, records = canonicalized(body, argument_shapes(atomic, body.graph_def), name)
    applied = (f"{r.rule} at '{r.node}'" for r in records if r.applied)
    return body, (*(f"BatchNormalization '{layer}' fused" for layer in fused), *applied)


def rules_on() -> bool:
    """Whether the rewrite rules run on training steps: only when RULES_ENV is "1" (read at each step's rewrite).
    Off by default: measured on a Transformer encoder's step (docs/bench_training.md), the default rewrite ran
    3-8% slower with them than without, though every forward MatMul + BiasAdd ran fused."""
    return os.environ.get(RULES_ENV, "").strip() == "1"


def fused_batch_norms(body, name: str):
    """(body, [fused layer scopes]): Keras 3's training BatchNormalizations in the body fused into FusedBatchNormV3
    and its gradient (rules.batchnorm_training)."""
    from ..rules import fuse_training_batch_norms
    from ..rules.graph_check import orphaned_input
    graph_def, fused = fuse_training_batch_norms(body.graph_def, keep=(*body.retvals, *body.control_outputs))
    broken = orphaned_input(graph_def) if fused else None
    if broken:  # e.g. a dead Shape node of a step traced with an unknown batch size, left reading a removed node
        logger.warning("mp_rewrite: %s: fusing its BatchNormalization layers failed the check (%s); the step is "
                       "rewritten without the fusion", name, broken.reason)
        return body, []
    if fused:
        logger.info("mp_rewrite: %s: %d BatchNormalization layers fused (forward and gradient)", name, len(fused))
    return dataclasses.replace(body, graph_def=graph_def), fused


def canonicalized(body, shapes: dict, name: str):
    """(body, [rules.Record]): the training rules (rules.canonicalize) on a step's body, told the shapes of its
    arguments (`shapes`, the variables' included), keeping its outputs, its control outputs and every forward node a
    gradient reads (gradient_reads); the records say what applied and what declined, and why. The body as it was
    (and no record) when the rules failed; a rule whose rewrite failed the check is left out (its record says why)."""
    from ..rules import canonicalize
    from ..rules.record import LEFT_OUT
    keep = (*body.retvals, *body.control_outputs, *sorted(gradient_reads(body.graph_def)))
    try:
        graph_def, records = canonicalize(body.graph_def, keep, training_rules(), fold_batch_norms=False,
                                          shapes=shapes)
    except Exception as error:  # noqa: BLE001 -- the hook must never break training
        logger.warning("mp_rewrite: %s: the graph rules failed (%s: %s); the step is rewritten without them", name,
                       type(error).__name__, str(error)[:200])
        return body, []
    counts = {}
    for record in records:
        if record.applied:
            counts[record.rule] = counts.get(record.rule, 0) + 1
        elif record.status == LEFT_OUT:  # its rewrite failed rules.graph_check: the step went on without it
            logger.warning("mp_rewrite: %s: rule '%s' %s", name, record.rule, record.reason)
    if not counts:
        return body, records
    logger.info("mp_rewrite: %s: graph rules applied: %s", name,
                ", ".join(f"{rule} ×{count}" for rule, count in counts.items()))
    return dataclasses.replace(body, graph_def=graph_def), records


def gradient_reads(graph_def) -> set:
    """The names of the forward nodes (outside the gradient's name scopes) that a gradient op reads, as data or
    control: the values backpropagation needs, which a rule must not rename, remove or compute differently."""
    def is_gradient(name: str) -> bool:
        return bool(_GRADIENT_SCOPE.search(name))
    names = {node.name for node in graph_def.node}
    read = set()
    for node in graph_def.node:
        if is_gradient(node.name):
            read.update(source for source in (text.lstrip("^").split(":")[0] for text in node.input)
                        if source in names and not is_gradient(source))
    return read


def argument_shapes(atomic, graph_def) -> dict:
    """{_Arg node name: shape} of a body's arguments from the traced FuncGraph: a resource argument's variable shape
    (its handle data), another argument's static shape (None for an unknown dimension); {} without a FuncGraph."""
    from tensorflow.python.ops import handle_data_util
    graph = getattr(atomic, "graph", None)
    arg_nodes = sorted((n for n in graph_def.node if n.op == "_Arg"), key=lambda n: n.attr["index"].i)
    if graph is None or len(graph.inputs) != len(arg_nodes):
        return {}
    shapes = {}
    for tensor, node in zip(graph.inputs, arg_nodes):
        if tensor.dtype.name == "resource":
            data = handle_data_util.get_resource_handle_data(tensor)
            if data.is_set and len(data.shape_and_type) == 1 and not data.shape_and_type[0].shape.unknown_rank:
                dims = [d.size for d in data.shape_and_type[0].shape.dim]
                if all(d >= 0 for d in dims):
                    shapes[node.name] = dims
        elif tensor.shape.rank is not None:
            shapes[node.name] = tensor.shape.as_list()
    return shapes


def rewritten_shapes(atomic, traced, graph_def, traced_shapes: dict) -> dict:
    """{node name: [TensorShape]} of `graph_def`, a rewrite of the traced body's GraphDef `traced`: the FuncGraph's
    shapes (`traced_shapes`) for the nodes that still compute what they did (unchanged_nodes), TensorFlow's shape
    inference (analysis.shapes.node_shapes, the arguments' and variables' shapes from the FuncGraph) for the
    others, which a rule may have given an old name."""
    import tensorflow as tf
    from ..analysis.shapes import node_shapes
    same = unchanged_nodes(traced, graph_def)
    shapes = {name: shape for name, shape in traced_shapes.items() if name in same}
    given = argument_shapes(atomic, graph_def)
    resources = {n.name for n in graph_def.node if n.op == "_Arg" and n.attr["T"].type == tf.resource.as_datatype_enum}
    inferred = node_shapes(graph_def, {k: tuple(v) for k, v in given.items() if k not in resources},
                           {k: tuple(v) for k, v in given.items() if k in resources})
    for node in graph_def.node:
        if node.name not in shapes and inferred.get(node.name):
            shapes[node.name] = [tf.TensorShape(shape) for shape in inferred[node.name]]
    return shapes


def unchanged_nodes(traced, graph_def) -> set:
    """The names of the nodes of `graph_def` (a rewrite of the GraphDef `traced`) that compute what the node of the
    same name in `traced` does: the same op, attributes and inputs, and every node they read unchanged too."""
    before = {node.name: node for node in traced.node}
    nodes = {node.name: node for node in graph_def.node}
    state = {}  # name -> unchanged (False while being visited: a cycle counts as changed)
    for root in nodes:
        stack = [root]
        while stack:
            name = stack[-1]
            if name in state and state[name] is not None:
                stack.pop()
                continue
            node, old = nodes[name], before.get(name)
            if old is None or old.op != node.op or old.input != node.input or old.attr != node.attr:
                state[name] = False
                stack.pop()
                continue
            sources = {text.lstrip("^").split(":")[0] for text in node.input}
            waiting = [source for source in sources if source in nodes and source not in state]
            if waiting and name not in state:
                state[name] = None
                stack.extend(waiting)
                continue
            state[name] = all(state.get(source) for source in sources)
            stack.pop()
    return {name for name, same in state.items() if same}


