"""Stand-ins: a copy of a model in which the ops with effects (effects.py) do nothing, for what a conversion runs to
measure and check the model. The written model keeps every op as it was; only these copies are run.

Each op with an effect keeps its name (control edges to it, a function's control outputs still hold) and becomes a
stateful op that does nothing outside (QUIET) and waits for what the op waited for, or, for an op that passes its
first input through (DebugIdentityV2), an Identity of that input: outputs of the same dtype and shape. Each carries
the op it stands for (STOOD_IN), so that a model TensorFlow saved from a copy can be given its ops back. An op
whose outputs are read and that passes nothing through has no stand-in; the copy then cannot stand for the model
(`StandIns.blocked`) and is not run.
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import attr_value_pb2, graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from .effects import LOADING, effect_table, find_effects

# The stand-in of an op without outputs: stateful (it reads the clock) as the op was, so that TensorFlow treats
# what holds it alike -- a function that calls it is traced as a StatefulPartitionedCall with automatic control
# dependencies on it, and is never pruned as stateless -- and without effect. Its output is read by nothing.
QUIET = "Timestamp"
# The attribute a stand-in carries: the op it stands in for, as a serialized NodeDef (with_effects_restored).
STOOD_IN = "_mp_rewrite_stood_in"


@dataclasses.dataclass(frozen=True)
class StandIns:
    """What a copy without effects replaced: `effects` (the Effects found), `blocked` (one text per op whose
    outputs are read and which no stand-in can replace: "WriteThing 'f/w' (its output is read)")."""

    effects: tuple = ()
    blocked: tuple = ()

    @property
    def stands(self) -> bool:
        """Whether the copy stands for the model (every effect has a stand-in)."""
        return not self.blocked


def graph_without_effects(graph_def, effects, fetched=()) -> tuple:
    """A copy of `graph_def` (main graph and library) in which the nodes of `effects` are stand-ins; `fetched`: the
    main graph's tensor names read from outside (signature outputs). `graph_def` is never modified.

    Returns:
        (the copy, or `graph_def` itself when there is nothing to stand in for; StandIns).
    """
    if not effects:
        return graph_def, StandIns()
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    wanted = {}
    for effect in effects:
        wanted.setdefault(effect.function, set()).add(effect.node)
    blocked = _replace(out.node, wanted.pop("", set()), _read_names(out.node, fetched), "")
    for fdef in out.library.function:
        names = wanted.get(fdef.signature.name)
        if names:
            returned = [value for value in fdef.ret.values()]
            blocked += _replace(fdef.node_def, names, _read_names(fdef.node_def, returned), fdef.signature.name)
    return out, StandIns(tuple(effects), tuple(blocked))


def meta_graph_without_effects(meta_graph, keys=None, loading_only: bool = False) -> tuple:
    """A copy of a MetaGraphDef in which the effects of what its signatures (`keys`, else all) and its loading run
    (with `loading_only`, only those of its loading) are stand-ins (the MetaGraph itself when it has none).

    Returns:
        (MetaGraphDef, StandIns).
    """
    effects = tuple(e for e in find_effects(meta_graph, keys) if e.where == LOADING or not loading_only)
    if not effects:
        return meta_graph, StandIns()
    fetched = [info.name for signature in meta_graph.signature_def.values() for info in signature.outputs.values()]
    graph_def, stand_ins = graph_without_effects(meta_graph.graph_def, effects, fetched)
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    out.graph_def.CopyFrom(graph_def)
    return out, stand_ins


def saved_model_without_effects(saved_model, loading_only: bool = False) -> tuple:
    """A copy of a SavedModel proto whose every MetaGraph is meta_graph_without_effects'.

    Returns:
        (SavedModel, or `saved_model` itself when no MetaGraph has effects; StandIns of them all).
    """
    copies = [meta_graph_without_effects(meta_graph, loading_only=loading_only)
              for meta_graph in saved_model.meta_graphs]
    if not any(stand_ins.effects for _, stand_ins in copies):
        return saved_model, StandIns()
    out = saved_model_pb2.SavedModel(saved_model_schema_version=saved_model.saved_model_schema_version)
    for meta_graph, _ in copies:
        out.meta_graphs.add().CopyFrom(meta_graph)
    return out, StandIns(sum((s.effects for _, s in copies), ()), sum((s.blocked for _, s in copies), ()))


def with_effects_restored(saved_model):
    """The SavedModel proto with every stand-in (a node carrying STOOD_IN) made again the op it stood in for: what
    TensorFlow saved from a model loaded without its loading's effects (savedmodel.freeze) holds every op as the
    source did. `saved_model` itself when it holds none; it is never modified."""
    if STOOD_IN.encode() not in saved_model.SerializeToString():
        return saved_model
    out = saved_model_pb2.SavedModel()
    out.CopyFrom(saved_model)
    for meta_graph in out.meta_graphs:
        for fdef in meta_graph.graph_def.library.function:
            _restore(fdef.node_def)
        _restore(meta_graph.graph_def.node)
    return out


def _restore(nodes) -> None:
    """Make the stand-ins among `nodes` the ops they stood in for, in place."""
    for node in nodes:
        if STOOD_IN in node.attr:
            node.CopyFrom(type(node).FromString(node.attr[STOOD_IN].s))


def _read_names(nodes, more=()) -> set:
    """The names of the nodes whose outputs are read: by a data input of `nodes` or by `more` (tensor names)."""
    inputs = [name for node in nodes for name in node.input if not name.startswith("^")]
    return {name.split(":")[0] for name in [*inputs, *more]}


def _replace(nodes, names: set, read: set, function: str) -> list:
    """Make the nodes called `names` stand-ins, in place (ours: a copy); return the texts of those that cannot be."""
    table, blocked = effect_table(), []
    for node in nodes:
        kind = table.kind_of(node) if node.name in names else None
        if kind is None:
            continue
        through = node.op in kind.passes_through and node.input and not node.input[0].startswith("^")
        if not through and node.name in read:
            blocked.append(f"{node.op} '{f'{function}/' if function else ''}{node.name}' (its output is read)")
            continue
        _stand_in(node, through)
    return blocked


def _stand_in(node, through: bool) -> None:
    """Turn `node` into its stand-in: an Identity of its first input, or a QUIET op; control inputs kept."""
    original = node.SerializeToString()
    controls = [name for name in node.input if name.startswith("^")]
    dtype = attr_value_pb2.AttrValue()
    if through and "T" in node.attr:
        dtype.CopyFrom(node.attr["T"])
    first = node.input[0] if through else None
    node.ClearField("attr")
    del node.input[:]
    if through:
        node.op = "Identity"
        node.input.extend([first, *controls])
        node.attr["T"].CopyFrom(dtype)
    else:
        node.op = QUIET
        node.input.extend(controls)
    node.attr[STOOD_IN].s = original
