"""Batch 1's token rows in place (`convert --split auto|N` without --freeze): the traced function a signature's
wrapper calls, split on one sample's token rows (analysis/token_rows.py plans it, row_split.split_rows builds it),
added to the library beside the function as it was. The wrapper then routes a batch of 1 to it
(split_wrapper.split_wrapper's `rows`); every function the pass rewrote stays as written, and both read the same
variables, so the model is no larger but for the split function's nodes.

The plan is made on the function's body as the pass wrote it: its weights are ReadVariableOps of its resource
arguments (their shapes come from the main graph's VarHandleOps, through the wrapper: shapes.called_body_shapes),
and what Grappler would fold (Tensordot's permutation, a ConcatV2 of constants) is read as the constant it is
(batch_row_states.folded_ints). Protos in, protos out; what is written is decided by split_in_place.py.
"""

from __future__ import annotations

import dataclasses

from ..analysis.shapes import called_body_shapes
from ..analysis.token_rows import token_rows
from ..core.functions import function_to_graph, graph_to_function
from ..core.graph_view import parse_input
from ..core.op_support import Signatures
from ..errors import GraphError
from .row_split import copied, split_rows
from .split_option import ROW_ROUTE
from .split_wrapper import CALL_OPS, DIGITS


@dataclasses.dataclass(frozen=True)
class RowsBody:
    """The token-row split of the function a wrapper calls.

    Attributes:
        function: the split function (a FunctionDef with the called function's signature, under a new name).
        called: the name of the function it splits.
        arg: the wrapper's argument holding the tokens.
        parts: the number of branches.
        unknown_length: the function leaves the token count unknown: only samples long enough go to the rows.
    """

    function: object
    called: str
    arg: int
    parts: int
    unknown_length: bool


def _named(function, called: str, route: str, functions: dict) -> str:
    """The split function's name: "__inference_<called>_token_rows_in_2_<digits>" (ending in digits, as TF's loader
    wants), the name of the same function where another wrapper of `called` made it already (Keras' "serve" and
    "serving_default": one split function for both), or else one no function of the library holds."""
    stem = DIGITS.sub("", called.removeprefix("__inference_"))
    name = base = f"__inference_{stem}_{route}_{(DIGITS.search(called) or [None, '0'])[1]}"
    n = 1
    while name in functions:
        function.signature.name = name
        if functions[name] == function:
            return name
        name, n = f"{base}{n}", n + 1
    return name


def rows_body(meta_graph, wrapper: str, positions: dict, parts: int, length: int) -> tuple[RowsBody | None, str]:
    """(the token-row split of the function `wrapper` calls, "") or (None, why not).

    Args:
        meta_graph: the MetaGraphDef (never modified); wrapper: a signature's wrapper function (signature_wrapper).
        positions: {signature input: the wrapper argument it feeds}.
        parts: the number of branches; length: the stand-in token count where the function leaves it unknown.
    """
    library = meta_graph.graph_def.library
    functions = {f.signature.name: f for f in library.function}
    outer = functions[wrapper]
    calls = [n for n in outer.node_def if n.op in CALL_OPS]
    called = functions.get(calls[0].attr["f"].func.name) if len(calls) == 1 else None
    if called is None:
        return None, "its wrapper does not call one traced function"
    signatures = Signatures(library)
    try:
        outer_body, body = function_to_graph(outer, signatures), function_to_graph(called, signatures)
    except GraphError as e:
        return None, str(e)
    shapes = called_body_shapes(meta_graph.graph_def, [(outer, outer_body.graph_def), (called, body.graph_def)],
                                batch=1, others=length)
    args = [a.name for a in outer.signature.input_arg]
    fed = [t for t in calls[0].input if not t.startswith("^")]
    inputs = {}  # the called function's argument tensor -> the wrapper's argument position
    for position in sorted(positions.values()):
        if args[position] in fed:
            inputs[f"{called.signature.input_arg[fed.index(args[position])].name}:0"] = position
    nodes = {n.name: n for n in body.graph_def.node}
    for i, arg in enumerate(called.signature.input_arg):  # the shapes the arguments declare: an unknown length
        if i in called.arg_attr and "_output_shapes" in called.arg_attr[i].attr:  # stays unknown to the plan
            nodes[arg.name].attr["_output_shapes"].CopyFrom(called.arg_attr[i].attr["_output_shapes"])
    outputs = [nodes[name].input[0] for name in body.retvals]
    plan = token_rows(body.graph_def, list(inputs), outputs, shapes, parts)
    if not plan.splittable:
        return None, plan.reason
    split, fetched = split_rows(body.graph_def, plan)
    made, todo = {n.name for n in split.node}, list(body.control_outputs)
    while todo:  # a control output the outputs do not need (a variable's read), and what it reads, kept as it is
        name = todo.pop()
        if name not in made:
            made.add(name)
            split.node.append(nodes[name])
            todo += [parse_input(t.lstrip("^"))[0] for t in nodes[name].input]
    split.node.extend(copied(nodes[name], name, [fetched[output]]) for name, output in zip(body.retvals, outputs))
    function = graph_to_function(split, called, signatures)
    function.signature.name = _named(function, called.signature.name, ROW_ROUTE.format(parts), functions)
    return RowsBody(function, called.signature.name, inputs[plan.source], parts, plan.unknown_length), ""

