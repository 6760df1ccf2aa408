"""Per-core branches in place (`convert --split` without --freeze): a TF2 signature's wrapper function rewritten,
as protos, to call its own body once per slice of the batch.

A TF2 SavedModel's signature is a call in the MetaGraph's main graph (StatefulPartitionedCall, what TF Serving
runs) into a wrapper function (`__inference_signature_wrapper_123`, what `tf.saved_model.load(...).signatures[key]`
restores), which calls the traced function. The split leaves every function the pass rewrote as it is and changes
only the wrapper:

    wrapper(args) = If(batch >= least, split_batch_in_N(args), whole_batch(args))   (least: N, or more)
    split_batch_in_N(args) = concat_0(whole_batch(slice_0(args)), ..., whole_batch(slice_N-1(args)))

and where batch 1 runs in token rows (rows_in_place.py), the wrapper first routes one sample to them:

    wrapper(args) = If(batch == 1, one_sample_token_rows_in_2(args), batches(args))

`whole_batch` is the wrapper's original body under a new name; the slices are SplitV on axis 0 of the arguments that
carry the batch (uneven where N does not divide the batch); the other arguments (the variables' handles, inputs the
analysis found not to carry the batch) go whole to every branch, so the variables are read, not copied. The If is
lowered into Switch/Merge and the calls inlined by TensorFlow, so the branches run at once on its inter-op pool.
Only protos are read and written here; what may be split is decided by batch_rows and checked by split_in_place.
"""

from __future__ import annotations

import re

from ..errors import ModelError
from .split_option import ROW_ROUTE, split_function

CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")
DIGITS = re.compile(r"_(\d+)$")


def signature_wrapper(meta_graph, key: str) -> tuple[str, dict]:
    """(the wrapper function's name, {signature input name: the position of the argument it feeds}).

    Raises:
        ModelError: the signature does not compute in one call of a library function (a TF1 signature computes in
            the main graph), or an argument of the wrapper is typed by an attribute.
    """
    signature = meta_graph.signature_def[key]
    nodes = {node.name: node for node in meta_graph.graph_def.node}
    callers = {info.name.split(":")[0] for info in signature.outputs.values()}
    call = nodes.get(next(iter(callers))) if len(callers) == 1 else None
    if call is None or call.op not in CALL_OPS:
        raise ModelError("it computes in the main graph, not in one function call (a TF1 signature): only a TF2 "
                         "signature's wrapper is split in place (--freeze splits the frozen graph)")
    functions = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    wrapper = functions.get(call.attr["f"].func.name)
    if wrapper is None or any(arg.type_attr or arg.number_attr or arg.type_list_attr
                              for arg in [*wrapper.signature.input_arg, *wrapper.signature.output_arg]):
        raise ModelError(f"it calls '{call.attr['f'].func.name}', which is not a traced function of the library")
    data = [_tensor(name) for name in call.input if not name.startswith("^")]
    fed = {name: _tensor(info.name) for name, info in signature.inputs.items()}
    if any(tensor not in data for tensor in fed.values()):
        raise ModelError(f"an input does not feed its call '{call.name}' directly")
    return wrapper.signature.name, {name: data.index(tensor) for name, tensor in fed.items()}


def output_shapes(meta_graph, key: str) -> list | None:
    """The static shapes (TensorShapeProtos) of the signature's call outputs, in order; None where one is unknown."""
    outputs = {info.name: info for info in meta_graph.signature_def[key].outputs.values()}
    node = next(iter(outputs)).split(":")[0]
    found = [outputs.get(f"{node}:{j}") for j in range(len(outputs))]
    return None if any(info is None or not info.HasField("tensor_shape") for info in found) else \
        [info.tensor_shape for info in found]


def split_wrapper(meta_graph, wrapper: str, carried: list[bool], branches: int, shapes=None, least: int = 0,
                  rows=None, rows_least: int = 0):
    """A copy of `meta_graph` whose function `wrapper` runs its body once per slice of the batch, and/or batch 1 in
    the token rows of `rows`.

    Args:
        meta_graph: a MetaGraphDef (never modified).
        wrapper: the signature wrapper's name (signature_wrapper).
        carried: per argument of the wrapper, whether it carries the batch on axis 0 (at least one does).
        branches: N >= 2, or 1: the batch is not split (then `rows` is given).
        shapes: the wrapper's outputs' static shapes (TensorShapeProtos: output_shapes), kept on the If; None:
            unknown.
        least: the smallest batch split (0: `branches`); a smaller one runs whole.
        rows: a rows_in_place.RowsBody: a batch of one sample calls its token-row split of the function the wrapper
            calls (where the length is unknown, a sample of `rows_least` tokens or more); None: batch 1 runs whole.

    Returns:
        The new MetaGraphDef.
    """
    new = type(meta_graph)()
    new.CopyFrom(meta_graph)
    library = new.graph_def.library
    index = next(i for i, f in enumerate(library.function) if f.signature.name == wrapper)
    original = type(library.function[index])()
    original.CopyFrom(library.function[index])
    taken = {f.signature.name for f in library.function}
    digits = (DIGITS.search(wrapper) or [None, "0"])[1]
    whole_name = unique_function(f"__inference_whole_batch_{digits}", taken)
    _renamed(library.function.add(), original, whole_name)
    batch_arg = carried.index(True) if branches > 1 else 0
    if branches > 1:
        split_name = unique_function(f"__inference_{split_function(branches, least)}_{digits}", taken)
        _fill_split(library.function.add(), original, split_name, whole_name, carried, branches)
        batches = (library.function[index] if rows is None else
                   _renamed(library.function.add(), original, unique_function(f"__inference_batches_{digits}",
                                                                              taken)))
        int32 = _type("int32")
        condition = [*_dimension(original.signature.input_arg[batch_arg], "split_batch/batch", 0),
                     _node("split_batch/least", "Const", [], dtype=int32, value=_int_tensor(least or branches)),
                     _node("split_batch/enough", "GreaterEqual", ["split_batch/batch:output:0",
                                                                  "split_batch/least:output:0"], T=int32)]
        _fill_dispatch(batches, "split_batch/dispatch", condition, "split_batch/enough:z:0", split_name, whole_name,
                       shapes)
        whole_name = batches.signature.name
    if rows is None:
        return new
    if rows.function.signature.name not in taken:  # else made for another wrapper of the same function
        library.function.add().CopyFrom(rows.function)
    rows_name = unique_function(f"__inference_one_sample_{ROW_ROUTE.format(rows.parts)}_{digits}", taken)
    for node in _renamed(library.function.add(), original, rows_name).node_def:
        if node.op in CALL_OPS and node.attr["f"].func.name == rows.called:
            node.attr["f"].func.name = rows.function.signature.name
    _fill_dispatch(library.function[index], f"one_sample/{ROW_ROUTE.format(rows.parts)}",
                   *_one_sample(original.signature.input_arg[rows.arg], rows_least if rows.unknown_length else 0),
                   rows_name, whole_name, shapes)
    return new


def _renamed(function, original, name: str):
    """`function` made a copy of `original` named `name` (returned)."""
    function.CopyFrom(original)
    function.signature.name = name
    return function


def unique_function(name: str, taken: set) -> str:
    base, n = name, 1
    while name in taken:
        name, n = f"{base}{n}", n + 1  # still ends in digits: TF's loader strips "__inference_" and "_<digits>"
    taken.add(name)
    return name


def _tensor(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def _types(args) -> list[int]:
    return [arg.type for arg in args]


def _fill_dispatch(function, name: str, condition: list, tensor: str, then_name: str, else_name: str,
                   shapes) -> None:
    """The function's body replaced (its signature, argument attributes and attributes kept) by the `condition`
    nodes and If(`tensor`, then_name(args), else_name(args)), the If named `name`."""
    args = [arg.name for arg in function.signature.input_arg]
    outputs = function.signature.output_arg
    del function.node_def[:]
    function.ret.clear()
    dispatch = _node(name, "If", [tensor, *args], Tcond=_type("bool"),
                     Tin=_type_list(_types(function.signature.input_arg)), Tout=_type_list(_types(outputs)),
                     then_branch=_func(then_name), else_branch=_func(else_name), _lower_using_switch_merge=True)
    if shapes is not None and len(shapes) == len(outputs):
        dispatch.attr["output_shapes"].list.shape.extend(shapes)
    else:
        dispatch.attr["output_shapes"].list.SetInParent()
    # An Identity per output, as tf.cond writes them: once the If is lowered, each reads its own Merge.
    prefix = name.split("/")[0]
    nodes = [*condition, dispatch, *(_node(f"{prefix}/output_{j}", "Identity", [f"{name}:output:{j}"],
                                           T=_dtype(out.type)) for j, out in enumerate(outputs))]
    function.node_def.extend(nodes)
    for j, out in enumerate(outputs):
        function.ret[out.name] = f"{prefix}/output_{j}:output:0"
    for control in list(function.control_ret):
        function.control_ret[control] = name


def _one_sample(arg, least: int) -> tuple[list, str]:
    """(nodes, their boolean tensor): whether the argument `arg` (an OpDef.ArgDef) holds one sample, and where
    `least` is given, at least `least` long on axis 1 (its tokens)."""
    int32 = _type("int32")
    nodes = [*_dimension(arg, "one_sample/batch", 0),
             _node("one_sample/one", "Const", [], dtype=int32, value=_int_tensor(1)),
             _node("one_sample/is_one", "Equal", ["one_sample/batch:output:0", "one_sample/one:output:0"], T=int32)]
    if not least:
        return nodes, "one_sample/is_one:z:0"
    nodes += [*_dimension(arg, "one_sample/length", 1),
              _node("one_sample/least", "Const", [], dtype=int32, value=_int_tensor(least)),
              _node("one_sample/is_long", "GreaterEqual", ["one_sample/length:output:0", "one_sample/least:output:0"],
                    T=int32),
              _node("one_sample/rows", "LogicalAnd", ["one_sample/is_one:z:0", "one_sample/is_long:z:0"])]
    return nodes, "one_sample/rows:z:0"


def _fill_split(function, original, name: str, whole_name: str, carried: list[bool], branches: int) -> None:
    """The then-branch: slices of the carried arguments, one call of the whole body per slice, outputs concatenated."""
    function.signature.CopyFrom(original.signature)
    function.signature.name = name
    del function.signature.control_output[:]
    for key, value in original.arg_attr.items():
        function.arg_attr[key].CopyFrom(value)
    arg_types = _types(original.signature.input_arg)
    out_types = _types(original.signature.output_arg)
    args = [arg.name for arg in original.signature.input_arg]
    first = carried.index(True)
    nodes = _dimension(original.signature.input_arg[first], "split_batch/batch", 0)
    int32 = _type("int32")
    nodes += [
        _node("split_batch/branches", "Const", [], dtype=int32, value=_int_tensor(branches)),
        _node("split_batch/each", "FloorDiv", ["split_batch/batch:output:0", "split_batch/branches:output:0"],
              T=int32),
        _node("split_batch/left", "FloorMod", ["split_batch/batch:output:0", "split_batch/branches:output:0"],
              T=int32),
        _node("split_batch/index", "Const", [], dtype=int32, value=_int_tensor(list(range(branches)))),
        # The first `batch % N` slices take one sample more: 7 in two is 4 + 3.
        _node("split_batch/more", "Less", ["split_batch/index:output:0", "split_batch/left:z:0"], T=int32),
        _node("split_batch/one_more", "Cast", ["split_batch/more:z:0"], SrcT=_type("bool"), DstT=int32,
              Truncate=False),
        _node("split_batch/sizes", "AddV2", ["split_batch/each:z:0", "split_batch/one_more:y:0"], T=int32),
        _node("split_batch/axis", "Const", [], dtype=int32, value=_int_tensor(0)),
    ]
    for i, (arg, dtype) in enumerate(zip(args, arg_types)):
        if carried[i]:
            nodes.append(_node(f"split_batch/slices_{i}", "SplitV", [arg, "split_batch/sizes:z:0",
                                                                     "split_batch/axis:output:0"],
                               num_split=branches, T=_dtype(dtype), Tlen=int32))
    for b in range(branches):
        inputs = [f"split_batch/slices_{i}:output:{b}" if carried[i] else arg for i, arg in enumerate(args)]
        nodes.append(_node(f"split_batch/branch_{b}", "StatefulPartitionedCall", inputs, Tin=_type_list(arg_types),
                           Tout=_type_list(out_types), f=_func(whole_name), config="", config_proto=b"",
                           executor_type=""))
    for j, (out, dtype) in enumerate(zip(original.signature.output_arg, out_types)):
        pieces = [f"split_batch/branch_{b}:output:{j}" for b in range(branches)]
        nodes.append(_node(f"split_batch/concat_{j}", "ConcatV2", [*pieces, "split_batch/axis:output:0"],
                           N=branches, T=_dtype(dtype), Tidx=int32))
        function.ret[out.name] = f"split_batch/concat_{j}:output:0"
    function.node_def.extend(nodes)


def _dimension(arg, name: str, axis: int) -> list:
    """Nodes computing the size (a scalar int32) of the argument `arg`'s `axis` as `name`."""
    int32 = _type("int32")
    return [
        _node(f"{name}/shape", "Shape", [arg.name], T=_dtype(arg.type), out_type=int32),
        _node(f"{name}/begin", "Const", [], dtype=int32, value=_int_tensor([axis])),
        _node(f"{name}/end", "Const", [], dtype=int32, value=_int_tensor([axis + 1])),
        _node(f"{name}/stride", "Const", [], dtype=int32, value=_int_tensor([1])),
        _node(name, "StridedSlice", [f"{name}/shape:output:0", f"{name}/begin:output:0", f"{name}/end:output:0",
                                     f"{name}/stride:output:0"],
              T=int32, Index=int32, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=1),
    ]


def _node(name: str, op: str, inputs: list, **attrs):
    from tensorflow.core.framework import node_def_pb2
    node = node_def_pb2.NodeDef(name=name, op=op, input=inputs)
    for key, value in attrs.items():
        _set_attr(node.attr[key], value)
    return node


def _set_attr(attr, value) -> None:
    from tensorflow.core.framework import attr_value_pb2, tensor_pb2
    if isinstance(value, attr_value_pb2.AttrValue):
        attr.CopyFrom(value)
    elif isinstance(value, tensor_pb2.TensorProto):
        attr.tensor.CopyFrom(value)
    elif isinstance(value, bool):
        attr.b = value
    elif isinstance(value, int):
        attr.i = value
    elif isinstance(value, bytes):
        attr.s = value
    elif isinstance(value, str):
        attr.s = value.encode()
    else:
        raise TypeError(f"no attribute value for {value!r}")


def _type(name: str):
    from tensorflow.core.framework import types_pb2
    return _dtype({"int32": types_pb2.DT_INT32, "bool": types_pb2.DT_BOOL}[name])


def _dtype(enum: int):
    from tensorflow.core.framework import attr_value_pb2
    return attr_value_pb2.AttrValue(type=enum)


def _type_list(types: list):
    from tensorflow.core.framework import attr_value_pb2
    value = attr_value_pb2.AttrValue()
    value.list.type.extend(types)
    value.list.SetInParent()
    return value


def _func(name: str):
    from tensorflow.core.framework import attr_value_pb2
    return attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=name))


def _int_tensor(values):
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    scalar = isinstance(values, int)
    values = [values] if scalar else list(values)
    shape = tensor_shape_pb2.TensorShapeProto(dim=[] if scalar else [tensor_shape_pb2.TensorShapeProto.Dim(
        size=len(values))])
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape=shape, int_val=values)
