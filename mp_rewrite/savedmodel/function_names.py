"""Function names that do not depend on what the converting process traced before (`--freeze`'s SavedModel).

TensorFlow names every traced function after a process-wide counter (`__inference_run_9550`). A frozen model is
traced anew, so its functions' names -- and with them the bytes of saved_model.pb -- moved with whatever the process
had traced before: converting the same model twice in one process, or once measuring the costs and once reading them
from the cache, wrote the same graphs under other names. `canonical_names` renames each traced function to its base
name and its rank among those of that base (`__inference_run_1`) in the order a walk of the model first reaches it
-- the top-level graph's nodes, then the object graph's functions, each function's nodes in order, depth first into
what they call -- everywhere the name is used (the library, calls, the object graph's concrete functions), so that
the same conversion writes the same bytes whatever the process traced before, and in whatever order. (Ranking by
tracing order held only while every code path traced the written functions in the same relative order: a conversion
that read its split times from the cache and skipped a trace wrote other names.) Functions the walk does not reach
follow, in tracing order. The names still end in digits, as TensorFlow's loader expects of a traced function. The
nodes' debug info names the source's functions as this process loaded them (with its counter too): it keeps their
base names.
"""

from __future__ import annotations

import re

TRACED = re.compile(r"^(.+)_(\d+)$")  # __inference_run_9550, and tf.cond's cond_true_9438: all traced here


def canonical_names(saved_model) -> None:
    """Rename, in place, the traced functions of every MetaGraph of the SavedModel proto (a frozen model's: every
    function in it was traced by this process)."""
    for meta_graph in saved_model.meta_graphs:
        library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
        traced = {f.signature.name: m for f in library.values() for m in [TRACED.match(f.signature.name)] if m}
        reached = [name for name in _walk(meta_graph, library) if name in traced]
        rest = sorted(set(traced) - set(reached), key=lambda name: int(traced[name].group(2)))
        ranks = {}  # per base name: __inference_run_0, __inference_run_1, __inference_body_0
        for old in reached + rest:
            ranks.setdefault(traced[old].group(1), []).append(old)
        _rename(meta_graph, {old: f"{base}_{rank}" for base, olds in ranks.items() for rank, old in enumerate(olds)})
        # TensorFlow lists the library in the order of the names it gave: by the new names, the same every time.
        meta_graph.graph_def.library.function.sort(key=lambda f: f.signature.name)


def _walk(meta_graph, library: dict) -> list[str]:
    """The library's function names in the order a depth-first walk first reaches them from the top-level graph's
    nodes and then the object graph's functions (its nodes in order), each function's nodes in order."""
    order, seen = [], set()

    def visit(name: str) -> None:
        pending = [name]
        while pending:
            name = pending.pop()
            if name in library and name not in seen:
                seen.add(name)
                order.append(name)
                pending.extend(reversed([c for node in library[name].node_def for c in _callees(node)]))
    for node in meta_graph.graph_def.node:
        for callee in _callees(node):
            visit(callee)
    for obj in meta_graph.object_graph_def.nodes:
        kind = obj.WhichOneof("kind")
        names = obj.function.concrete_functions if kind == "function" else \
            [obj.bare_concrete_function.concrete_function_name] if kind == "bare_concrete_function" else []
        for name in names:
            visit(name)
    return order


def _callees(node) -> list[str]:
    """The functions a NodeDef may call: its op, and its function-valued attrs (f, then_branch, body, ...), in the
    attrs' name order."""
    found = [node.op]
    for key in sorted(node.attr):
        value = node.attr[key]
        kind = value.WhichOneof("value")
        if kind == "func":
            found.append(value.func.name)
        elif kind == "list":
            found.extend(f.name for f in value.list.func)
    return found


def _rename(message, names: dict) -> None:
    """Replace every string field (and string map key) of `message` that is an old name in `names`."""
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _rename_map(value, field.message_type.fields_by_name["value"], names)
        elif field.type == field.TYPE_MESSAGE:
            for item in (value if field.is_repeated else [value]):
                _rename(item, names)
        elif field.name == "original_func_names":  # debug info: the source functions, as this process loaded them
            value[:] = [TRACED.sub(r"\1", item) for item in value]
        elif field.type == field.TYPE_STRING:
            if field.is_repeated:
                value[:] = [names.get(item, item) for item in value]
            elif value in names:
                setattr(message, field.name, names[value])


def _rename_map(mapping, value_field, names: dict) -> None:
    """_rename for a map field: its values, and its keys, all at once (a new name may be another's old one)."""
    is_message = value_field.type == value_field.TYPE_MESSAGE
    moved = {}
    for key in list(mapping):
        if is_message:
            _rename(mapping[key], names)
        elif isinstance(mapping[key], str) and mapping[key] in names:
            mapping[key] = names[mapping[key]]
        if isinstance(key, str) and key in names:
            value = mapping[key]
            if is_message:
                value = type(value)()
                value.CopyFrom(mapping[key])
            moved[names[key]] = value
            del mapping[key]
    for key, value in moved.items():
        if is_message:
            mapping[key].CopyFrom(value)
        else:
            mapping[key] = value
