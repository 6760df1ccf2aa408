"""One signature of a loaded SavedModel as one frozen graph: `freeze_signature(loaded, key)` -> FrozenSignature.

TensorFlow's variable folding turns the variables the signature reads into constants and inlines the functions it
calls, so a body node "model/dense/MatMul" becomes "StatefulPartitionedCall/model/dense/MatMul". Built once here
and shared by `convert --freeze` (freeze.py) and the accuracy guard (guard/saved_model.py); the names of the
inlined graph are mapped back to the SavedModel's own with `inlined_patterns` / `name_suffixes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from ..core.effects import effects_awaited
from ..core.op_facts import MUTATING_OPS
from ..errors import ModelError


@dataclasses.dataclass
class FrozenSignature:
    """A signature frozen into one GraphDef.

    Attributes:
        key: the signature key.
        graph_def: the frozen graph (functional control flow kept; its function library as TF left it).
        inputs: [(TensorSpec, placeholder tensor name)] in the signature's flat (tf.nest) order.
        feeds: input name -> placeholder tensor name.
        outputs: output key -> tensor name.
        captured: [(placeholder tensor name, the restored object owning the resource)] for the captures freezing
            left (lookup tables, whose contents are not constants).
        variables: with keep_variables, {capture placeholder name: variable} for the variables kept as captures.
        shapes: output key -> its static shape in the signature (what the frozen graph must still promise).
    """

    key: str
    graph_def: object
    inputs: list
    feeds: dict
    outputs: dict
    captured: list
    variables: dict = dataclasses.field(default_factory=dict)
    shapes: dict = dataclasses.field(default_factory=dict)

    @property
    def fetches(self) -> list:
        """The output tensor names, each once."""
        return list(dict.fromkeys(self.outputs.values()))


def freeze_signature(loaded, key: str, keep_variables: bool = False) -> FrozenSignature:
    """Freeze `loaded.signatures[key]` (a model loaded with tf.saved_model.load): its functions inlined into one
    graph, the variables it reads folded into constants -- or, with keep_variables, left as captured resources
    (variable_weights.py: for weights over protobuf's 2 GB limit).

    Raises:
        ModelError: the signature changes state, TensorFlow's folding refuses it, or it captures a resource no
            object of the model owns.
    """
    import tensorflow as tf

    from .variable_weights import variable_captures

    signature = loaded.signatures[key]
    check_stateless(signature.graph.as_graph_def(), key)
    variables = variable_captures(signature, loaded) if keep_variables else {}
    graph_def, placeholders = _frozen_graph_def(signature, key, set(variables))
    check_stateless(graph_def, key)
    captured = _captured_resources(signature, key, placeholders, loaded, variables)
    # A signature returns a dict; its tensors are the function's outputs in tf.nest order (sorted keys).
    outputs = {name: tensor.name for name, tensor in zip(sorted(signature.structured_outputs), signature.outputs)}
    graph_def = effects_awaited(graph_def, list(outputs.values()))  # what the source did, the frozen model does
    specs = tf.nest.flatten(signature.structured_input_signature, expand_composites=True)
    inputs = list(zip(specs, placeholders))
    keyword = signature.structured_input_signature[1]
    feeds = dict(zip(sorted(keyword), placeholders)) if isinstance(keyword, dict) and keyword else {
        spec.name: name for spec, name in inputs}
    shapes = {name: spec.shape for name, spec in signature.structured_outputs.items()}
    return FrozenSignature(key, graph_def, inputs, feeds, outputs, captured, variables, shapes)


def _frozen_graph_def(signature, key: str, kept=frozenset()):
    """The signature's graph with every variable it reads folded into a constant, and the names of the tensors
    that feed its arguments (the arguments' placeholders, then those of the captures that are not variables, or
    whose placeholder names are `kept`).

    TensorFlow's `convert_variables_to_constants_v2` does the folding, then builds a ConcreteFunction of the result
    (10 of 11 s on ResNet-50), which is thrown away here: the graph is rewritten and imported again. So its two
    steps are called without the last one.
    """
    from tensorflow.python.framework import convert_to_constants as freezing

    try:
        # Functional control flow stays functional: lowered v1 loops do not survive re-import into a tf.function.
        with _collections_not_serialized_unlogged():
            data = freezing._FunctionConverterDataInEager(func=signature, lower_control_flow=False,
                                                          aggressive_inlining=False,
                                                          variable_names_denylist=set(kept) or None)
        graph_def, converted = freezing._replace_variables_by_constants(converter_data=data)
    except Exception as e:  # TF raises ValueError, TypeError, InvalidArgumentError, ... for what it cannot fold
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"signature '{key}' cannot be frozen: {line}; convert without --freeze") from None
    captures = signature.graph.internal_captures
    folded = {id(captures[index]) for index in converted}
    return graph_def, [t.name for t in signature.inputs if id(t) not in folded]


@contextlib.contextmanager
def _collections_not_serialized_unlogged():
    """Leave out the warnings TensorFlow logs while it folds a TF1 signature. The signature's graph carries the
    MetaGraph's variable collections, which the folding exports for Grappler's inlining and cannot serialize:
    "Issue encountered when serializing variables ... probably safe to ignore", three lines each, four times."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Issue encountered when serializing")
    logger = logging.getLogger("tensorflow")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _captured_resources(signature, key: str, feeds: list, loaded, variables=()) -> list:
    """[(placeholder name, owner)] for the captures freezing left; the frozen function captures the same object.

    Raises:
        ModelError: a capture that no object of the loaded model owns (it could not be saved), naming its reader.
    """
    from tensorflow.python.checkpoint import graph_view

    arguments = len(signature.inputs) - len(signature.graph.internal_captures)
    left = [name for name in feeds[arguments:] if name.split(":")[0] not in variables]
    if not left:
        return []
    objects = graph_view.ObjectGraphView(loaded).breadth_first_traversal()[0]
    owners = {id(getattr(obj, "resource_handle", None)): obj for obj in reversed(objects)}  # the first owner wins
    external = {internal.name: capture for capture, internal in signature.graph.captures}
    found = [(name, owners.get(id(external.get(name)))) for name in left]
    for name, owner in found:
        if owner is None:
            readers = [n.name for n in signature.graph.as_graph_def().node if name.split(":")[0] in n.input]
            raise ModelError(f"signature '{key}' cannot be frozen: it captures {name} (read by "
                             f"{', '.join(readers) or 'nothing'}), a resource no object of the model owns; "
                             "convert without --freeze")
    return found


def check_stateless(graph_def, key: str) -> None:
    """Refuse a signature whose graph (or a function it calls) changes state.

    Raises:
        ModelError: naming the first state-changing op and where it is.
    """
    places = [("", graph_def.node)] + [(f.signature.name, f.node_def) for f in graph_def.library.function]
    for function, nodes in places:
        for node in nodes:
            if node.op in MUTATING_OPS:
                where = f" in function '{function}'" if function else ""
                raise ModelError(f"signature '{key}' cannot be frozen: node '{node.name}' ({node.op}){where} changes "
                                 "state, which a frozen graph cannot do; convert without --freeze")


def traced_identity(signature) -> tuple:
    """Equal for two signatures that run the same function with the same interface."""
    calls = [n.attr["f"].func.name for n in signature.graph.as_graph_def().node if "f" in n.attr]
    return (tuple(calls), repr(signature.structured_input_signature), repr(sorted(signature.structured_outputs)))


def inlined_patterns(patterns) -> tuple:
    """keep_fp32/force_low patterns written for the SavedModel's own names, widened to match the same nodes under
    inlining prefixes ("dense_1" also matches "StatefulPartitionedCall/model/dense_1/MatMul")."""
    out = []
    for p in ([patterns] if isinstance(patterns, str) else patterns):
        if p.startswith("="):
            out += [p, f"*/{p[1:]}"]
        elif any(c in p for c in "*?["):
            out += [p, f"*/{p}"]
        else:
            scope = p.rstrip("/")
            out += [p, f"*/{scope}", f"*/{scope}/*"]
    return tuple(out)


def name_suffixes(names) -> set:
    """Every "/"-suffix of every name: the names a node of the SavedModel could have had before inlining, to check
    that a user's pattern matches something in a frozen graph."""
    return {"/".join(parts[i:]) for name in names for parts in [name.split("/")] for i in range(len(parts))}
