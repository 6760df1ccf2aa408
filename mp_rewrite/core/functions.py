"""Function bodies: FunctionDef <-> GraphDef (with _Arg/_Retval nodes, as Grappler's function items see them),
and the walk over a library's functions reachable from a graph.

A FunctionDef names tensors "node:output_arg:index" (and plain "arg" for arguments); a GraphDef names them
"node:flat_port". The conversion maps one to the other through each op's signature, so the rewrite can run on a
body exactly as on a graph, and the result goes back into a FunctionDef with the same signature.
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework import versions

from ..errors import GraphError
from .op_support import Signatures, attr_or_default

FUNC_ATTR_KINDS = ("func", "list")
TF_DATA_ATTR = "_tf_data_function"


@dataclasses.dataclass(frozen=True)
class BodyGraph:
    """A function body as a GraphDef, with what is needed to turn it back into a FunctionDef.

    Attributes:
        graph_def: the body: one _Arg node per input (named after the input), the body nodes, one _Retval per output.
        retvals: the _Retval node names, in output order (the fetches of the body).
        control_outputs: the nodes named in the FunctionDef's control_ret (its control outputs), which Grappler
            keeps as they are (GrapplerFunctionItem adds them to keep_ops).
    """

    graph_def: graph_pb2.GraphDef
    retvals: tuple
    control_outputs: tuple = ()

    def preserved(self) -> dict:
        """The nodes a rewrite of this body preserves besides its outputs, each with the reason."""
        return {name: "control output of the function (Grappler keeps control outputs as they are)"
                for name in self.control_outputs}


def _output_ranges(signatures: Signatures, node) -> dict:
    """output arg name -> first flat output port of that arg, for one NodeDef."""
    sig = signatures.get(node.op, node.name)
    ranges, port = {}, 0
    for spec in sig.outputs:
        ranges[spec.name] = port
        if spec.type_list_attr:
            port += len(attr_or_default(node, spec.type_list_attr).list.type)
        elif spec.number_attr:
            port += attr_or_default(node, spec.number_attr).i
        else:
            port += 1
    return ranges


def is_polymorphic(fdef: function_pb2.FunctionDef) -> bool:
    """True if the signature has type attrs (a parametrised function, which Grappler does not optimize)."""
    return any(a.type_attr or a.number_attr or a.type_list_attr
               for a in list(fdef.signature.input_arg) + list(fdef.signature.output_arg))


def function_to_graph(fdef: function_pb2.FunctionDef, signatures: Signatures) -> BodyGraph:
    """Return the body of a (non-parametrised) FunctionDef as a GraphDef with _Arg and _Retval nodes.

    Raises:
        GraphError: a parametrised function, or a body input that names no node or argument.
    """
    name = fdef.signature.name
    if is_polymorphic(fdef):
        raise GraphError(f"function '{name}' is parametrised (its signature has type attrs); it cannot be rewritten")
    graph = graph_pb2.GraphDef()
    args = {a.name for a in fdef.signature.input_arg}
    for i, arg in enumerate(fdef.signature.input_arg):
        graph.node.append(_special_node(arg.name, "_Arg", None, arg.type, i))
    ranges = {n.name: _output_ranges(signatures, n) for n in fdef.node_def}
    for node in fdef.node_def:
        new = graph.node.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(_to_graph_input(text, args, ranges, name) for text in node.input)
    taken = args | set(ranges)
    retvals = []
    for i, arg in enumerate(fdef.signature.output_arg):
        ret_name = unique_name(f"{arg.name}_RetVal", taken)
        source = _to_graph_input(fdef.ret[arg.name], args, ranges, name)
        graph.node.append(_special_node(ret_name, "_Retval", source, arg.type, i))
        retvals.append(ret_name)
    graph.versions.producer = versions.GRAPH_DEF_VERSION  # an old producer makes TF reject the graph
    nodes = set(ranges)
    control_outputs = tuple(dict.fromkeys(n for n in fdef.control_ret.values() if n in nodes))
    return BodyGraph(graph, tuple(retvals), control_outputs)


def graph_to_function(body: graph_pb2.GraphDef, original: function_pb2.FunctionDef,
                      signatures: Signatures) -> function_pb2.FunctionDef:
    """Turn a (rewritten) body GraphDef back into a FunctionDef with the original's signature and attributes."""
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(original)
    del fdef.node_def[:]
    fdef.ClearField("ret")
    nodes = {n.name: n for n in body.node}
    out_names = {}
    for node in body.node:
        if node.op not in ("_Arg", "_Retval"):
            out_names[node.name] = {p: a for a, p in _output_ranges(signatures, node).items()}
    for node in body.node:
        if node.op in ("_Arg", "_Retval"):
            continue
        new = fdef.node_def.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(_to_function_input(text, nodes, out_names) for text in node.input)
    for node in body.node:
        if node.op == "_Retval":
            arg = original.signature.output_arg[node.attr["index"].i].name
            fdef.ret[arg] = _to_function_input(node.input[0], nodes, out_names)
    return fdef


def _special_node(name, op, source, dtype, index) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op)
    if source is not None:
        node.input.append(source)
    node.attr["T"].type = dtype
    node.attr["index"].i = index
    return node


def unique_name(base: str, taken: set) -> str:
    """`base`, or `base_1`, `base_2`, ...: the first not in `taken` (which it joins)."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _to_graph_input(text: str, args: set, ranges: dict, function: str) -> str:
    if text.startswith("^"):
        return text
    parts = text.split(":")
    if len(parts) == 1 and parts[0] in args:
        return f"{parts[0]}:0"
    if len(parts) == 3 and parts[0] in ranges and parts[1] in ranges[parts[0]] and parts[2].isdigit():
        return f"{parts[0]}:{ranges[parts[0]][parts[1]] + int(parts[2])}"
    raise GraphError(f"function '{function}': input '{text}' names no argument or node output")


def _to_function_input(text: str, nodes: dict, out_names: dict) -> str:
    if text.startswith("^"):
        return text
    src, _, port = text.partition(":")
    port = int(port or 0)
    if nodes[src].op == "_Arg":
        return src
    starts = out_names[src]
    start = max(p for p in starts if p <= port)
    return f"{src}:{starts[start]}:{port - start}"


def called_functions(nodes, library_names: set) -> list[str]:
    """Names of library functions that these NodeDefs call: by op name or through func / list(func) attrs."""
    found = []
    for node in nodes:
        if node.op in library_names:
            found.append(node.op)
        for value in node.attr.values():
            if value.HasField("func"):
                found.append(value.func.name)
            elif value.HasField("list"):
                found.extend(f.name for f in value.list.func)
    return [f for f in dict.fromkeys(found) if f in library_names]


def reachable_functions(library: function_pb2.FunctionDefLibrary, roots) -> list[str]:
    """Library functions reachable from the function names `roots` (included), callers before callees."""
    functions = {f.signature.name: f for f in library.function}
    names = set(functions)
    order, todo = [], list(roots)
    while todo:
        name = todo.pop(0)
        if name in order or name not in functions:
            continue
        order.append(name)
        todo.extend(called_functions(functions[name].node_def, names))
    return order


def graph_functions(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Library functions reachable from a graph's nodes, callers before callees."""
    names = {f.signature.name for f in graph_def.library.function}
    return reachable_functions(graph_def.library, called_functions(graph_def.node, names))


def is_tf_data_function(fdef: function_pb2.FunctionDef) -> bool:
    """True for tf.data functions (map/filter bodies), which Grappler's meta-optimizer never rewrites."""
    value = fdef.attr.get(TF_DATA_ATTR)
    return bool(value is not None and value.b)
