"""Function names that do not depend on what the converting process traced before (`--freeze`'s SavedModel).

TensorFlow names every traced function after a process-wide counter (`__inference_run_9550`). A frozen model is
traced anew, so its functions' names -- and with them the bytes of saved_model.pb -- moved with whatever the
process had traced before: converting the same model twice in one process, or once measuring the costs and once
reading them from the cache, wrote the same graphs under other names. `canonical_names` renames each traced
function to its base name and its rank among them in tracing order (`__inference_run_3`), everywhere the name is
used (the library, calls, the object graph's concrete functions), so that the same conversion writes the same bytes.
The names still end in digits, as TensorFlow's loader expects of a traced function. The nodes' debug info names
the source's functions as this process loaded them (with its counter too): it keeps their base names.
"""

from __future__ import annotations

import re

TRACED = re.compile(r"^(.+)_(\d+)$")  # __inference_run_9550, and tf.cond's cond_true_9438: all traced here


def canonical_names(saved_model) -> None:
    """Rename, in place, the traced functions of every MetaGraph of the SavedModel proto (a frozen model's: every
    function in it was traced by this process)."""
    for meta_graph in saved_model.meta_graphs:
        traced = [(int(m.group(2)), m.group(1), f.signature.name) for f in meta_graph.graph_def.library.function
                  for m in [TRACED.match(f.signature.name)] if m]
        _rename(meta_graph, {old: f"{base}_{rank}" for rank, (_, base, old) in enumerate(sorted(traced))})
        # TensorFlow lists the library in the order of the names it gave: by the new names, the same every time.
        meta_graph.graph_def.library.function.sort(key=lambda f: f.signature.name)


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
