"""The batch dispatch in place (issue 39, item 2; batch_dispatch.py is the frozen one): where the race's winner
changes with the batch size, each function a signature wrapper calls becomes a choice on the batch dimension
between its float32 body and its low-precision body, both kept in the function library and both reading the same
variables (the call's resource arguments): the model grows by one copy of the function bodies, not of the weights.

`dispatch_meta_graph` is the proto surgery (no TensorFlow runtime): the entry function E keeps its name and
interface -- the signature wrappers, the object graph and a TF1 session of the main graph call it as before -- and
its body becomes `If(shape(first input)[0] < threshold, E_float32, E_low)`; E_float32 is the float32 body with every
function it reaches copied under names of its own, E_low the rewritten body. `dispatched_in_place` times the source
MetaGraph, the rewritten one and the dispatch, each a SavedModel copy linked to the source's variables, loaded as
TF2 serves it, and keeps the dispatch as dispatch_verdict says (MP_REWRITE_DISPATCH as for --freeze).
"""

from __future__ import annotations

import dataclasses
import tempfile

from ..core.functions import called_functions, reachable_functions
from ..core.meta_graph import INTERNAL_PREFIX, signature_nodes
from .dispatch_verdict import FLOAT32, LOW, dispatch_verdict, kept_line, refused_line, segments_of, winners_of

FLOAT32_SUFFIX, LOW_SUFFIX = "_mp_dispatch_float32", "_mp_dispatch_low"
_RESOURCE, _INT32, _BOOL = 20, 3, 10  # DataType enums


def entry_functions(meta_graph, keys=None) -> list[str]:
    """The functions the signatures' wrappers call (a Keras export's `__inference___call___N`): each signature's
    output call node in the main graph runs a wrapper, which calls one entry."""
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    selected = [k for k in meta_graph.signature_def if not k.startswith(INTERNAL_PREFIX) and (keys is None or k in keys)]
    outputs = set(signature_nodes(meta_graph, selected, True))
    wrappers = called_functions([n for n in meta_graph.graph_def.node if n.name in outputs], set(library))
    return list(dict.fromkeys(f for w in wrappers for f in called_functions(library[w].node_def, set(library))))


def dispatch_meta_graph(float32_mg, low_mg, entries, threshold: int, first_low: bool = False):
    """A copy of `low_mg` (the rewrite of `float32_mg`, function names alike) in which each entry function runs
    its float32 body below batch `threshold` and its low-precision body from it (`first_low`: the other way
    round). Returns None where an entry cannot dispatch (no first input with a batch dimension, or not in both)."""
    out = type(low_mg)()
    out.CopyFrom(low_mg)
    float32_lib = {f.signature.name: f for f in float32_mg.graph_def.library.function}
    low_lib = {f.signature.name: f for f in out.graph_def.library.function}
    if any(e not in float32_lib or e not in low_lib or _batch_arg(low_lib[e]) is None for e in entries):
        return None
    copied = {}
    for entry in entries:
        names = reachable_functions(float32_mg.graph_def.library, [entry])
        renamed = {n: n + FLOAT32_SUFFIX for n in names}
        for name in names:
            if name not in copied:
                copied[name] = _renamed(float32_lib[name], renamed)
        low_copy = _renamed(low_lib[entry], {entry: entry + LOW_SUFFIX})
        branches = (entry + FLOAT32_SUFFIX, low_copy.signature.name)
        _dispatch_body(low_lib[entry], threshold, branches[::-1] if first_low else branches)
        copied[entry + LOW_SUFFIX] = low_copy
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


def _dispatch_body(fdef, threshold: int, branches) -> None:
    """Replace, in place, a FunctionDef's body by If(batch < threshold, branches[0], branches[1]) over its args."""
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.python.framework import tensor_util

    args = fdef.signature.input_arg
    first = args[_batch_arg(fdef)]
    del fdef.node_def[:]
    fdef.ClearField("control_ret")
    del fdef.signature.control_output[:]

    def node(name, op, inputs=(), **attrs):
        made = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))
        for key, value in attrs.items():
            made.attr[key].CopyFrom(value)
        fdef.node_def.append(made)

    def const(name, value):
        node(name, "Const", dtype=_attr(type=_INT32), value=_attr(tensor=tensor_util.make_tensor_proto(value, "int32")))
    node("batch_shape", "Shape", [first.name], T=_attr(type=first.type), out_type=_attr(type=_INT32))
    const("begin", [0])
    const("end", [1])
    const("strides", [1])
    node("batch_size", "StridedSlice", ["batch_shape:output:0", "begin:output:0", "end:output:0", "strides:output:0"],
         T=_attr(type=_INT32), Index=_attr(type=_INT32), shrink_axis_mask=_attr(i=1))
    const("threshold", threshold)
    node("below", "Less", ["batch_size:output:0", "threshold:output:0"], T=_attr(type=_INT32))
    types = _attr()
    types.list.type.extend(a.type for a in args)
    out_types = _attr()
    out_types.list.type.extend(a.type for a in fdef.signature.output_arg)
    # Lowered to Switch/Merge and inlined, as TF lowers a tf.cond: an If that is not runs each branch as a function
    # instantiated on its own, without Grappler (MobileNetV2's bfloat16 body ran 3-6x its time so, at batch 8-32).
    node("dispatch_on_batch", "If", ["below:z:0", *(a.name for a in args)], Tcond=_attr(type=_BOOL), Tin=types,
         Tout=out_types, then_branch=_attr(func=branches[0]), else_branch=_attr(func=branches[1]),
         _lower_using_switch_merge=_attr(b=True))
    fdef.ret.clear()
    for i, out in enumerate(fdef.signature.output_arg):
        fdef.ret[out.name] = f"dispatch_on_batch:output:{i}"


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
    if mode == "off" or getattr(costs, "batch", None) or getattr(table, "keep", "") == "source":
        return
    if mode == "auto" and not (options.assign == "cost" and getattr(table, "runs", None) is not None
                               and getattr(table, "low_units", False) and getattr(table, "decision", "")):
        return
    from ..core.effects import effects_policy, find_effects
    if not effects_policy().run and find_effects(float32_mg, keys):  # timing the copies would perform them
        return
    entries = entry_functions(float32_mg, keys)
    low_result = _low_variant(result, float32_mg, options, keys) if entries else None
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
    for keep in ("", "lists") if options.assign == "cost" else ():
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
    from ..analysis.variant_race import RACE_BATCHES
    from .batch_dispatch import DISPATCH_ENV, DispatchChoice, raced_calls
    from .inputs import DEFAULT_DIM, made_tensors
    copies = [saved_model_copy(str(source_dir), mg, tempfile.mkdtemp(dir=work)) for mg in (float32_mg, low_mg)]
    calls = [_signature_call(path, key, float32_mg) for path in copies]
    specs = calls[0][1]
    feeds = {b: made_tensors(specs, b, dim=dim or DEFAULT_DIM) for b in RACE_BATCHES}
    try:
        alone = {b: raced_calls([c for c, _ in calls], feeds[b], b, 5) for b in RACE_BATCHES}
        segments = segments_of(winners_of(alone, written))
        if mode == "force":
            segments = ((1, FLOAT32), (RACE_BATCHES[1], LOW))
        if len(segments) != 2:
            why = ("the other variant ran faster (alone, beyond the noise) at no batch raced" if len(segments) == 1
                   else "more than one threshold")
            return DispatchChoice(False, f"{why}: nothing dispatched in place", (), alone), None
        written_mg = dispatch_meta_graph(float32_mg, low_mg, entries, segments[1][0], first_low=segments[0][1] == LOW)
        if written_mg is None:
            return None, None
        path = saved_model_copy(str(source_dir), written_mg, tempfile.mkdtemp(dir=work))
        dispatch, _ = _signature_call(path, key, float32_mg)
        times = {b: raced_calls([*(c for c, _ in calls), dispatch], feeds[b], b) for b in RACE_BATCHES}
    except VariantError as e:
        return DispatchChoice(False, f"not tried: {e}"), None
    verdict = dispatch_verdict(times)
    sizes = (os.path.getsize(os.path.join(copies[0], "saved_model.pb")) / 1e6,
             os.path.getsize(os.path.join(copies[1], "saved_model.pb")) / 1e6)
    if verdict.kept or mode == "force":
        forced = "" if verdict.kept else f"written as {DISPATCH_ENV}=force asks, though its times would not keep it"
        line = kept_line(verdict, times, segments, precision, sizes, forced,
                         "both bodies of the functions are stored and read the same variables (saved_model.pb)")
        return DispatchChoice(True, line, segments, alone, times), written_mg
    line = refused_line(verdict, times, segments, precision, written).removeprefix("; ")
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
