"""The batch dispatch in place (issue 39, item 2; batch_dispatch.py is the frozen one): where the race's winner
changes with the batch size, each signature wrapper's call of its entry function (a Keras export's
`__inference___call___N`) becomes a choice on the batch dimension between the entry's float32 body and the entry as
rewritten, both in the function library and both reading the same variables (the call's resource arguments): the
model grows by one copy of the function bodies, not of the weights.

`dispatch_meta_graph` is the proto surgery (no TensorFlow runtime): in each wrapper the call node keeps its name
and becomes `If(shape(first input)[0] < threshold, E_float32, E)`, E_float32 the float32 body of the entry E with
every function it reaches copied under names of its own. The entry is left as it is: the object graph can name
tensors inside it (EfficientNetB0's export names one of its BatchNorms', which a replaced body lost), and
`loaded.serve` (the object graph's function) runs the rewrite as a conversion without the dispatch would.
`dispatched_in_place` times the source MetaGraph, the rewritten one and the dispatch, each a SavedModel copy
linked to the source's variables, loaded as TF2 serves it, and keeps the dispatch as dispatch_verdict says
(MP_REWRITE_DISPATCH as for --freeze).
"""

from __future__ import annotations

import dataclasses
import tempfile

from ..core.functions import called_functions, reachable_functions
from ..core.meta_graph import INTERNAL_PREFIX, signature_nodes
from .dispatch_verdict import (FLOAT32, FLOAT32_SUFFIX, LOW, dispatch_verdict,
                               kept_line, refused_line, segments_of, winners_of)

_RESOURCE, _INT32, _BOOL = 20, 3, 10  # DataType enums


def entry_functions(meta_graph, keys=None) -> dict:
    """{signature wrapper: [the entry functions it calls]} (a Keras export's `__inference___call___N`): each
    signature's output call node in the main graph runs a wrapper, which calls an entry."""
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    selected = [k for k in meta_graph.signature_def if not k.startswith(INTERNAL_PREFIX) and (keys is None or k in keys)]
    outputs = set(signature_nodes(meta_graph, selected, True))
    wrappers = called_functions([n for n in meta_graph.graph_def.node if n.name in outputs], set(library))
    return {w: called_functions(library[w].node_def, set(library)) for w in wrappers}


def dispatch_meta_graph(float32_mg, low_mg, entries: dict, threshold: int, first_low: bool = False):
    """A copy of `low_mg` (the rewrite of `float32_mg`, function names alike) in which each signature wrapper's
    call of an entry function becomes If(batch < `threshold`, the entry's float32 body, the entry as rewritten)
    (`first_low`: the other way round); the entry itself, which the object graph may name tensors of, is left
    as it is. Returns None where a wrapper cannot dispatch (no argument with a batch dimension, an entry not in
    both)."""
    out = type(low_mg)()
    out.CopyFrom(low_mg)
    float32_lib = {f.signature.name: f for f in float32_mg.graph_def.library.function}
    low_lib = {f.signature.name: f for f in out.graph_def.library.function}
    called = {e for found in entries.values() for e in found}
    if any(e not in float32_lib or e not in low_lib for e in called) or \
            any(_batch_arg(low_lib[w]) is None for w in entries):
        return None
    copied = {}
    for entry in called:
        names = reachable_functions(float32_mg.graph_def.library, [entry])
        renamed = {n: n + FLOAT32_SUFFIX for n in names}
        copied.update({renamed[n]: _renamed(float32_lib[n], renamed) for n in names if renamed[n] not in copied})
    for wrapper in entries:
        _dispatch_calls(low_lib[wrapper], threshold, first_low)
    out.graph_def.library.function.extend(copied.values())
    return out


def _renamed(fdef, names: dict):
    """A copy of a FunctionDef named names[its name], every call of a function in `names` renamed too."""
    copy = type(fdef)()
    copy.CopyFrom(fdef)
    copy.signature.name = names.get(copy.signature.name, copy.signature.name)
    for node in copy.node_def:
        if node.op in names:
            node.op = names[node.op]
        for value in node.attr.values():
            if value.HasField("func") and value.func.name in names:
                value.func.name = names[value.func.name]
            for func in value.list.func:
                func.name = names.get(func.name, func.name)
    return copy


def _batch_arg(fdef):
    """The index of the first argument that is not a resource and whose traced shape (`_input_shapes`, where the
    function has it) has an unknown first dimension; None where there is none."""
    shapes = fdef.attr["_input_shapes"].list.shape if "_input_shapes" in fdef.attr else None
    for i, arg in enumerate(fdef.signature.input_arg):
        if arg.type == _RESOURCE or arg.type_attr or arg.number_attr:
            continue
        if shapes is not None and i < len(shapes) and not (shapes[i].dim and shapes[i].dim[0].size < 0):
            continue
        return i
    return None


CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")
_CALL_ONLY = ("f", "config", "config_proto", "executor_type")


def _dispatch_calls(fdef, threshold: int, first_low: bool) -> None:
    """In place: each call node of a wrapper becomes If(batch < threshold, the callee's float32 copy, the callee)
    under the same name (its outputs, "name:output:i", read as before), the batch read from the wrapper's first
    batch argument."""
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.python.framework import tensor_util

    first = fdef.signature.input_arg[_batch_arg(fdef)]

    def node(name, op, inputs=(), **attrs):
        made = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))
        for key, value in attrs.items():
            made.attr[key].CopyFrom(value)
        fdef.node_def.append(made)
        return made

    def const(name, value):
        node(name, "Const", dtype=_attr(type=_INT32), value=_attr(tensor=tensor_util.make_tensor_proto(value, "int32")))
    calls = [n for n in fdef.node_def if n.op in CALL_OPS]
    node("mp_dispatch/batch_shape", "Shape", [first.name], T=_attr(type=first.type), out_type=_attr(type=_INT32))
    for name, value in (("begin", [0]), ("end", [1]), ("strides", [1]), ("threshold", threshold)):
        const(f"mp_dispatch/{name}", value)
    node("mp_dispatch/batch_size", "StridedSlice", [f"mp_dispatch/{n}:output:0" for n in (
         "batch_shape", "begin", "end", "strides")], T=_attr(type=_INT32), Index=_attr(type=_INT32),
         shrink_axis_mask=_attr(i=1))
    node("mp_dispatch/below", "Less", ["mp_dispatch/batch_size:output:0", "mp_dispatch/threshold:output:0"],
         T=_attr(type=_INT32))
    for call in calls:
        callee = call.attr["f"].func.name
        branches = (callee + FLOAT32_SUFFIX, callee)
        branches = branches[::-1] if first_low else branches
        for key in _CALL_ONLY:
            if key in call.attr:
                del call.attr[key]
        call.op = "If"
        call.input.insert(0, "mp_dispatch/below:z:0")
        call.attr["Tcond"].CopyFrom(_attr(type=_BOOL))
        call.attr["then_branch"].CopyFrom(_attr(func=branches[0]))
        call.attr["else_branch"].CopyFrom(_attr(func=branches[1]))
        # Lowered to Switch/Merge and inlined, as TF lowers a tf.cond: an If that is not runs each branch as a
        # function instantiated on its own, without Grappler (MobileNetV2's bfloat16 body ran 3-6x its time so).
        call.attr["_lower_using_switch_merge"].CopyFrom(_attr(b=True))


def _attr(type=None, i=None, tensor=None, func=None, b=None):
    from tensorflow.core.framework import attr_value_pb2
    value = attr_value_pb2.AttrValue()
    if b is not None:
        value.b = b
    if type is not None:
        value.type = type
    if i is not None:
        value.i = i
    if tensor is not None:
        value.tensor.CopyFrom(tensor)
    if func is not None:
        value.func.name = func
    return value


def dispatched_in_place(result, float32_mg, options, source_dir, keys=None, machine=None) -> None:
    """Where the race's winner changes with the batch: `result.meta_graph_def` (the rewrite of `float32_mg`)
    becomes the dispatch where it measured faster (dispatch_verdict), and the first line says what was written;
    `result.dispatch` holds a batch_dispatch.DispatchChoice, or None where it was not tried (in place as in
    batch_dispatch._not_tried, with the in-place strategy's own limits: one threshold, and a TF2 SavedModel whose
    signatures call their entry functions through wrappers)."""
    from .batch_dispatch import DispatchChoice, dispatch_mode
    mode = dispatch_mode()
    result.dispatch = None
    costs = getattr(machine or options, "costs", None)
    table = options.costs
    if mode == "off" or getattr(costs, "batch", None):
        return
    if mode == "auto" and not (options.assign == "cost" and getattr(table, "runs", None) is not None
                               and getattr(table, "low_units", False) and getattr(table, "decision", "")):
        return
    from ..core.effects import effects_policy, find_effects
    if not effects_policy().run and find_effects(float32_mg, keys):  # timing the copies would perform them
        return
    entries = entry_functions(float32_mg, keys)
    low_result = _low_variant(result, float32_mg, options, keys) if any(entries.values()) else None
    if low_result is None:
        return
    key = next(k for k in sorted(float32_mg.signature_def) if not k.startswith(INTERNAL_PREFIX)
               and (keys is None or k in keys))
    with tempfile.TemporaryDirectory(prefix="mp_rewrite_dispatch_") as work:
        choice, written = _measured(float32_mg, low_result.meta_graph_def, entries, key, source_dir, work, mode,
                                    options.precision, written=LOW if low_result is result else FLOAT32,
                                    dim=getattr(costs, "dim", None))
    if choice is None:
        return
    if choice.kept:
        result.meta_graph_def = written
    result.dispatch = DispatchChoice(choice.kept, choice.why, choice.segments, choice.alone, choice.times)
    if choice.segments:  # where one variant won everywhere, the race's line stands alone
        _say(result, choice)


def _low_variant(result, float32_mg, options, keys):
    """The rewrite in the low precision: `result` where it converted a node, else the cut's (or the lists')."""
    from ..core.rewrite import rewrite_meta_graph_def
    if any(r.converted_nodes for r in (result, *result.functions.values())):
        return result
    # Where the model as given (no graph rules) won, the table's node names are not this graph's: the lists' then.
    keeps = ("lists",) if getattr(options.costs, "keep", "") == "source" else ("", "lists")
    for keep in keeps if options.assign == "cost" else ():
        made = rewrite_meta_graph_def(float32_mg, options=dataclasses.replace(
            options, costs=dataclasses.replace(options.costs, keep=keep)), signatures=keys)
        if any(r.converted_nodes for r in (made, *made.functions.values())):
            return made
    return None


def _measured(float32_mg, low_mg, entries, key, source_dir, work, mode, precision, written, dim=None):
    """(DispatchChoice or None, the dispatching MetaGraph or None): the variants and the dispatch timed as TF2
    serves them, each a SavedModel copy linked to the source's variables, unknown dimensions but the batch `dim`
    (--seq-len) long."""
    import os

    from ..analysis.graph_runs import VariantError, saved_model_copy
    from ..analysis.profile_cache import graph_bytes
    from ..analysis.variant_race import RACE_BATCHES
    from .batch_dispatch import DISPATCH_ENV, LOCATING_ROUNDS, DispatchChoice, KeptRaces, raced_calls
    from .inputs import DEFAULT_DIM, made_tensors
    copies = [saved_model_copy(str(source_dir), mg, tempfile.mkdtemp(dir=work)) for mg in (float32_mg, low_mg)]
    calls = [_signature_call(path, key, float32_mg) for path in copies]
    specs = calls[0][1]
    feeds = {b: made_tensors(specs, b, dim=dim or DEFAULT_DIM) for b in RACE_BATCHES}
    races = KeptRaces(graph_bytes(float32_mg.graph_def), graph_bytes(low_mg.graph_def), key, dim or DEFAULT_DIM,
                      mode, "in place")
    try:
        alone = races.alone(lambda: {b: raced_calls([c for c, _ in calls], feeds[b], b, LOCATING_ROUNDS)
                                     for b in RACE_BATCHES})
        segments = segments_of(winners_of(alone, written))
        if mode == "force":
            segments = ((1, FLOAT32), (RACE_BATCHES[1], LOW))
        if len(segments) != 2:
            why = ("the other variant ran faster (alone, beyond the noise) at no batch raced" if len(segments) == 1
                   else "more than one threshold")
            return DispatchChoice(False, f"{why}: nothing dispatched in place{races.note}", (), alone), None
        written_mg = dispatch_meta_graph(float32_mg, low_mg, entries, segments[1][0], first_low=segments[0][1] == LOW)
        if written_mg is None:
            return None, None

        def race_it():  # the dispatch timed as served: a SavedModel copy of its own
            dispatch, _ = _signature_call(saved_model_copy(str(source_dir), written_mg, tempfile.mkdtemp(dir=work)),
                                          key, float32_mg)
            return {b: raced_calls([*(c for c, _ in calls), dispatch], feeds[b], b) for b in RACE_BATCHES}
        times = races.with_dispatch(race_it)
    except VariantError as e:
        return DispatchChoice(False, f"not tried: {e}"), None
    verdict = dispatch_verdict(times)
    sizes = (os.path.getsize(os.path.join(copies[0], "saved_model.pb")) / 1e6,
             os.path.getsize(os.path.join(copies[1], "saved_model.pb")) / 1e6)
    if verdict.kept or mode == "force":
        forced = "" if verdict.kept else f"written as {DISPATCH_ENV}=force asks, though its times would not keep it"
        line = kept_line(verdict, times, segments, precision, sizes, forced,
                         "both bodies of the functions are stored and read the same variables (saved_model.pb)")
        return DispatchChoice(True, line + races.note, segments, alone, times), written_mg
    line = refused_line(verdict, times, segments, precision, written).removeprefix("; ") + races.note
    return DispatchChoice(False, line, segments, alone, times), None


def _signature_call(path: str, key: str, meta_graph):
    """(a function calling signature `key` of the SavedModel at `path` with positional inputs in its keyword
    order, those inputs' TensorSpecs)."""
    import tensorflow as tf
    loaded = tf.saved_model.load(path, tags=list(meta_graph.meta_info_def.tags))
    signature = loaded.signatures[key]
    keyword = signature.structured_input_signature[1]
    names = sorted(keyword)
    specs = [tf.TensorSpec(keyword[n].shape, keyword[n].dtype, name=n) for n in names]

    def call(*args, _loaded=loaded):  # the loaded object stays alive with the function
        return signature(**dict(zip(names, args)))
    return call, specs


def _say(result, choice) -> None:
    """Every rewritten body's first line (its assignment's decision) made the dispatch's (kept), or the race's with
    the dispatch's after it (not kept)."""
    for body in (result, *result.functions.values()):
        if body.assignment is not None and body.assignment.decision:
            line = choice.why if choice.kept else f"{body.assignment.decision}; {choice.why}"
            body.assignment = dataclasses.replace(body.assignment, decision=line)
