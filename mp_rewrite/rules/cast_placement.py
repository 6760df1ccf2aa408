"""`cast_after_gather`: a Cast of a whole table to the low precision, read only by gathers, moves after them.

The precision pass retypes a GatherV2 (a clear-list op) to the precision of what reads its output, so an Embedding
in a function whose variables stay float32 (the in-place conversion) casts its whole table at every call: 8000 x 256
values for a 128-token batch of 8 that gathers 1024 rows of it. A Cast commutes with a gather (both move values,
the Cast rounds each one the same wherever it runs), so `Gather(Cast(table), ids)` becomes `Cast(Gather(table,
ids))`: exact, and it casts the gathered rows instead of the table. It moves when the gather reads fewer rows than
the table has, a dimension the graph leaves unknown (the batch) counted as BATCH_GUESS.
"""

from __future__ import annotations

import numpy as np

from ..core.dtypes import FLOAT, LOW
from .graph import EditableGraph, is_first_output, node_name
from .record import Match

BATCH_GUESS = 32  # the largest batch the benchmarks serve; a larger one only makes the two placements closer
GATHERS = ("GatherV2",)


def match_cast_after_gather(graph: EditableGraph, cast) -> Match | None:
    """A Cast from float32 to a low precision whose readers are all gathers of its output along axis 0."""
    if cast.attr["SrcT"].type != FLOAT or cast.attr["DstT"].type not in LOW or graph.is_kept(cast):
        return None
    readers = graph.readers(cast.name)
    if not is_first_output(cast.input[0]) or not readers or any(
            r.op not in GATHERS or [node_name(t) for t in graph.data_inputs(r)].count(cast.name) != 1
            or node_name(r.input[0]) != cast.name for r in readers):
        return None
    table = graph.weight_shape(cast.input[0]) or graph.inferred_shape(cast.input[0])
    if table is None or not table or table[0] is None:
        return Match().fail(f"the number of rows of '{cast.input[0]}' is unknown")
    for gather in readers:
        axis = graph.constant(gather.input[2])
        if axis is None or int(axis) != 0 or gather.attr["batch_dims"].i != 0:
            return Match().fail(f"'{gather.name}' does not gather rows (axis 0, no batch dimensions)")
        ids = graph.inferred_shape(gather.input[1])
        if ids is None:
            return Match().fail(f"the shape of the indices of '{gather.name}' is unknown")
        rows = int(np.prod([BATCH_GUESS if d is None else d for d in ids]))
        if rows >= table[0]:
            return Match().fail(f"'{gather.name}' gathers {rows} rows (unknown dimensions counted as {BATCH_GUESS}) "
                                f"of {table[0]}: casting the table is no more work")
    return Match(nodes={"cast": cast}, values={"gathers": readers, "rows": table[0]})


def rewrite_cast_after_gather(graph: EditableGraph, match: Match) -> str:
    """Each gather reads the float32 table under a new name; its old name becomes the Cast of what it gathered."""
    cast, gathers = match.nodes["cast"], match.values["gathers"]
    for gather in gathers:
        moved = graph.add_node(f"{gather.name}/float32", gather.op, [cast.input[0], *gather.input[1:]],
                               gather.device, {key: value for key, value in gather.attr.items()})
        moved.attr["Tparams"].type = FLOAT
        gather.op = "Cast"
        gather.attr.clear()
        for key, value in cast.attr.items():
            gather.attr[key].CopyFrom(value)
        graph.set_inputs(gather, [moved.name])
    graph.remove([cast.name])
    return f"the Cast of the {match.values['rows']}-row table now follows {len(gathers)} gather(s)"
