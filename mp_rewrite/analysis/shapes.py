"""Static shapes of a rewritten graph and its function bodies, from TensorFlow's own shape inference.

The graph is imported into a `tf.Graph` (only the nodes that matter, without control inputs). A function body is
imported with its `_Arg` nodes turned into Placeholders whose shapes come from the call sites (what the caller
feeds), the `_output_shapes` attribute of the `_Arg` node, or the FunctionDef's `arg_attr` / `_input_shapes`
attributes; a resource argument that the caller feeds from a `VarHandleOp` gives its `ReadVariableOp`s the
variable's shape. `_output_shapes` attributes (``graph.as_graph_def(add_shapes=True)``) refine everything.
mp_rewrite.flops counts FLOPs from these shapes.
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2, graph_pb2, tensor_shape_pb2, types_pb2

from ..core.graph_view import parse_input

CALL_OPS = {"PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0),
            "While": (("body", "cond"), 0), "StatelessWhile": (("body", "cond"), 0),
            "If": (("then_branch", "else_branch"), 1), "StatelessIf": (("then_branch", "else_branch"), 1),
            "Case": (("branches",), 1), "StatelessCase": (("branches",), 1)}
RESOURCE_READS = ("ReadVariableOp",)
Shape = tuple  # of int | None; None instead of a Shape means unknown rank


def _to_shape(proto) -> Shape | None:
    """TensorShapeProto -> tuple of dims (None for -1), or None for an unknown rank."""
    if proto.unknown_rank:
        return None
    return tuple(d.size if d.size >= 0 else None for d in proto.dim)


def _to_proto(shape: Shape | None) -> tensor_shape_pb2.TensorShapeProto:
    if shape is None:
        return tensor_shape_pb2.TensorShapeProto(unknown_rank=True)
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=-1 if d is None else d)
                                                  for d in shape])


def _tf_shape(tensor_shape) -> Shape | None:
    return None if tensor_shape.rank is None else tuple(tensor_shape.as_list())


def _merge(inferred: Shape | None, declared: Shape | None) -> Shape | None:
    """The more specific of two compatible shapes (the inferred one wins a conflict)."""
    if declared is None:
        return inferred
    if inferred is None or len(inferred) != len(declared):
        return declared if inferred is None else inferred
    return tuple(a if a is not None else b for a, b in zip(inferred, declared))


def _ancestors(graph_def, roots) -> set:
    """Names of the nodes whose outputs the `roots` read, directly or not (data inputs only), and the roots."""
    inputs = {n.name: [t for t in n.input if not t.startswith("^")] for n in graph_def.node}
    seen, stack = set(), [r for r in roots if r in inputs]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(parse_input(t)[0] for t in inputs[name])
    return seen


def _with_batch(shape: Shape | None, batch: int | None, others: int | None = None) -> Shape | None:
    """`shape` with an unknown leading dimension taken as `batch` and an unknown later one as `others` (where
    given)."""
    if not shape:
        return shape
    first = batch if shape[0] is None and batch is not None else shape[0]
    return (first,) + tuple(others if d is None and others is not None else d for d in shape[1:])


def _prepared(graph_def, arg_shapes: dict, resource_shapes: dict, keep: set | None,
              batch: int | None = None, others: int | None = None) -> graph_pb2.GraphDef:
    """A copy of the graph that imports anywhere: only the `keep` nodes (all if None) without control inputs or
    colocation (`_class`: a tf_keras body's embedding lookup is colocated with its argument by a name the body
    does not hold, and TF's importer refuses it), _Arg -> Placeholder (with its shape), no _Retval, a
    ResourceGather of a variable of known shape as the GatherV2 of a Placeholder of that shape (TF infers no rows
    from a handle), and the variable shape of resource arguments as
    `_output_shapes` on the ReadVariableOps that read them. With `batch`, an unknown leading dimension of a
    Placeholder or argument becomes `batch`; with `others`, an unknown later one becomes `others`."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.op == "_Retval" or (keep is not None and node.name not in keep):
            continue
        new = out.node.add()
        new.CopyFrom(node)
        if any(t.startswith("^") for t in node.input):
            data = [t for t in node.input if not t.startswith("^")]
            del new.input[:]
            new.input.extend(data)
        if "_class" in node.attr:
            del new.attr["_class"]
        if node.op == "_Arg":
            new.op = "Placeholder"
            shape = _with_batch(arg_shapes.get(node.name, _declared(node, 0)), batch, others)
            new.ClearField("attr")
            new.attr["dtype"].type = node.attr.get("T", attr_value_pb2.AttrValue()).type
            new.attr["shape"].shape.CopyFrom(_to_proto(shape))
        elif node.op == "Placeholder" and (batch, others) != (None, None) and "shape" in node.attr:
            new.attr["shape"].shape.CopyFrom(_to_proto(_with_batch(_to_shape(node.attr["shape"].shape), batch,
                                                                   others)))
        elif node.op in RESOURCE_READS and node.input:
            var_shape = resource_shapes.get(parse_input(node.input[0])[0])
            if var_shape is not None and "_output_shapes" not in node.attr:
                new.attr["_output_shapes"].list.shape.add().CopyFrom(_to_proto(var_shape))
        elif node.op == "ResourceGather" and len(node.input) > 1 and not new.attr["batch_dims"].i:
            var_shape = resource_shapes.get(parse_input(node.input[0])[0])
            if var_shape is not None:
                _gather_of_placeholder(out, new, var_shape)
    return out


def _gather_of_placeholder(out, node, var_shape) -> None:
    """Make `node` (a ResourceGather copied into `out`) the GatherV2 of a Placeholder of the variable's shape, on
    axis 0, for shape inference alone."""
    params, axis = out.node.add(), out.node.add()
    params.name, axis.name = f"{node.name}/params_shaped", f"{node.name}/axis_0"
    params.op, axis.op = "Placeholder", "Const"
    params.attr["dtype"].type = node.attr["dtype"].type
    params.attr["shape"].shape.CopyFrom(_to_proto(var_shape))
    axis.attr["dtype"].type = types_pb2.DT_INT32
    axis.attr["value"].tensor.dtype, axis.attr["value"].tensor.int_val[:] = types_pb2.DT_INT32, [0]
    indices, dtype, index_type = node.input[1], node.attr["dtype"].type, node.attr["Tindices"].type
    node.op = "GatherV2"
    del node.input[:]
    node.input.extend([params.name, indices, axis.name])
    node.ClearField("attr")
    node.attr["Tparams"].type, node.attr["Tindices"].type = dtype, index_type
    node.attr["Taxis"].type = types_pb2.DT_INT32
    node.attr["batch_dims"].i = 0


def _all_declared(node) -> list:
    value = node.attr.get("_output_shapes")  # never node.attr[...]: a map lookup would add the key
    return [] if value is None else [_to_shape(s) for s in value.list.shape]


def _declared(node, port: int) -> Shape | None:
    value = node.attr.get("_output_shapes")
    if value is None or port >= len(value.list.shape):
        return None
    return _to_shape(value.list.shape[port])


def node_shapes(graph_def: graph_pb2.GraphDef, arg_shapes: dict | None = None,
                resource_shapes: dict | None = None, library=None, needed=None, batch: int | None = None,
                others: int | None = None) -> dict:
    """Return {node name: [shape or None per output]} from TensorFlow's shape inference.

    Args:
        graph_def: a graph or a function body (with _Arg/_Retval nodes); never modified.
        arg_shapes: _Arg node name -> shape (a tuple, None dims unknown); defaults to the _Arg's `_output_shapes`.
        resource_shapes: name of a node yielding a resource handle (e.g. a resource _Arg) -> the variable's shape.
        library: the FunctionDefLibrary holding the functions the graph calls; defaults to the graph's own.
        needed: node names whose shapes matter; only they and the nodes they read (directly or not) are imported,
            and only they and their direct inputs are read back, which is several times faster on training graphs.
            None imports and reads every node.
        batch: if given, an unknown leading dimension of every Placeholder and argument is taken as `batch`, so
            shapes computed from it (reshapes to [batch * time, features]...) become known.
        others: if given, an unknown later dimension of every Placeholder and argument (a sequence's length) is
            taken as `others`, the same way.

    Returns:
        Every node's output shapes as tuples of ints/None (None for an unknown rank). Nodes not read back, and
        every node when TensorFlow cannot import the graph, get the shapes of their `_output_shapes` attribute.
    """
    import tensorflow as tf
    keep = None if needed is None else _ancestors(graph_def, needed)
    prepared = _prepared(graph_def, arg_shapes or {}, resource_shapes or {}, keep, batch, others)
    called = _called_library(prepared, graph_def.library if library is None else library)
    if called is not None:
        prepared.library.CopyFrom(called)
    shapes = {n.name: _all_declared(n) for n in graph_def.node}
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(prepared, name="")
    except (ValueError, TypeError, tf.errors.OpError):
        return shapes
    declared = {n.name: n for n in prepared.node}
    for name in declared if needed is None else _with_inputs(declared, needed):
        node, op = declared[name], graph.get_operation_by_name(name)
        shapes[name] = [_merge(_tf_shape(t.shape), _declared(node, i)) for i, t in enumerate(op.outputs)]
    return shapes


def _with_inputs(nodes: dict, names) -> set:
    """The `names` (those in `nodes`) and the nodes their data inputs come from."""
    found = {n for n in names if n in nodes}
    found |= {parse_input(t)[0] for n in list(found) for t in nodes[n].input if not t.startswith("^")}
    return found


def _called(node, library_names: set) -> list:
    """(function name, index of the input feeding its argument 0) for each function a node calls."""
    if node.op in library_names:
        return [(node.op, 0)]
    attrs, offset = CALL_OPS.get(node.op, ((), 0))
    found = []
    for attr in attrs:
        value = node.attr.get(attr)
        if value is not None:
            found += [(f.name, offset) for f in ([value.func] if value.HasField("func") else value.list.func)]
    return [(name, offset) for name, offset in found if name in library_names]


def _feed_call_sites(graph_def, shapes: dict, resources: dict, library_names: set, feeds: dict) -> None:
    """Record what each call in the graph feeds the arguments of the function it calls: feeds[function] =
    {arg index: (shape, variable shape or None)}; the first call site of a function wins."""
    for node in graph_def.node:
        calls = _called(node, library_names)
        if not calls:
            continue
        data = [parse_input(t) for t in node.input if not t.startswith("^")]
        for name, offset in calls:
            args = feeds.setdefault(name, {})
            for index, (src, port) in enumerate(data[offset:]):
                outs = shapes.get(src) or []
                args.setdefault(index, (outs[port] if port < len(outs) else None, resources.get(src)))


def _var_handles(graph_def) -> dict:
    """VarHandleOp node name -> the shape of its variable."""
    return {n.name: _to_shape(n.attr.get("shape", attr_value_pb2.AttrValue()).shape)
            for n in graph_def.node if n.op == "VarHandleOp"}


def _function_args(body, fdef, fed: dict) -> tuple:
    """(arg_shapes, resource_shapes) of a body's _Arg nodes: what the callers feed, else the FunctionDef's
    arg_attr `_output_shapes`, else its `_input_shapes` attribute."""
    declared = list(fdef.attr["_input_shapes"].list.shape) if fdef and "_input_shapes" in fdef.attr else []
    arg_shapes, resources = {}, {}
    for node in body.node:
        if node.op != "_Arg":
            continue
        index = node.attr.get("index", attr_value_pb2.AttrValue()).i
        shape, var_shape = fed.get(index, (None, None))
        if shape is None and fdef is not None and index in fdef.arg_attr:
            shapes = fdef.arg_attr[index].attr.get("_output_shapes")
            shape = _to_shape(shapes.list.shape[0]) if shapes is not None and shapes.list.shape else None
        if shape is None and index < len(declared):
            shape = _to_shape(declared[index])
        arg_shapes[node.name] = shape if shape is not None else _declared(node, 0)
        if var_shape is not None:
            resources[node.name] = var_shape
    return arg_shapes, resources


def _called_library(graph_def, library):
    """The part of `library` a graph calls (None when it calls nothing), to import the graph with."""
    from ..core.functions import called_functions, reachable_functions
    names = {f.signature.name for f in library.function}
    roots = called_functions(graph_def.node, names)
    if not roots:
        return None
    keep = set(reachable_functions(library, roots))
    subset = type(library)()
    subset.function.extend(f for f in library.function if f.signature.name in keep)
    subset.gradient.extend(library.gradient)
    return subset


def _needed(graph_def, library_names: set, ops) -> list:
    """The nodes whose shapes matter: those of the `ops` types and the function calls (for their callees)."""
    return [n.name for n in graph_def.node if n.op in ops or _called(n, library_names)]


def called_body_shapes(graph_def, bodies: list, batch: int | None = None, others: int | None = None) -> dict:
    """{node: [shape per output]} of the last body of `bodies` [(FunctionDef, its body GraphDef)], each called by
    the one before it and the first by `graph_def` (a MetaGraph's main graph, whose library holds them all): the
    arguments of each shaped by what its caller feeds, the variables' shapes included (a signature's wrapper, then
    the traced function it calls). `batch` and `others` as node_shapes takes them."""
    library = graph_def.library
    names = {f.signature.name for f in library.function}
    graph, shapes, resources = graph_def, node_shapes(graph_def, batch=batch, others=others), _var_handles(graph_def)
    for fdef, body in bodies:
        feeds = {}
        _feed_call_sites(graph, shapes, resources, names, feeds)
        arg_shapes, resources = _function_args(body, fdef, feeds.get(fdef.signature.name, {}))
        shapes = node_shapes(body, arg_shapes, resources, library, batch=batch, others=others)
        resources.update(_var_handles(body))
        graph = body
    return shapes


def result_shapes(result, batch: int | None = 1, ops=None) -> dict:
    """{graph: {node: [shape per output]}} for a RewriteResult: "" is the main graph, then every rewritten
    function by name (its arguments shaped by what its callers feed).

    Args:
        result: a RewriteResult.
        batch: an unknown leading dimension of the inputs is taken as `batch` (None leaves it unknown).
        ops: op types whose shapes matter (only they, the function calls and what they read are imported);
            None imports every node.
    """
    main = result.graph_def
    library = main.library
    names = {f.signature.name for f in library.function}
    fdefs = {f.signature.name: f for f in library.function}
    shapes = {"": node_shapes(main, needed=None if ops is None else _needed(main, names, ops), batch=batch)}
    feeds = {}
    _feed_call_sites(main, shapes[""], _var_handles(main), names, feeds)
    for name, sub in result.functions.items():
        body = sub.graph_def
        arg_shapes, resources = _function_args(body, fdefs.get(name), feeds.get(name, {}))
        shapes[name] = node_shapes(body, arg_shapes, resources, library,
                                   None if ops is None else _needed(body, names, ops), batch)
        resources.update(_var_handles(body))
        _feed_call_sites(body, shapes[name], resources, names, feeds)
    return shapes
