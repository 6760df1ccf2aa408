"""What batch 1 runs in a frozen split signature (`convert --freeze --split auto|N`): one sample's token rows in
ROW_PARTS branches (analysis/token_rows.py plans them, row_split.py builds the graph), or the whole graph.

A batch split cannot help one sample; the token-row split can, on a Transformer served with one intra-op thread
(docs/batch_one.md: 2.4 ms against 3.3 ms whole). It is written only where the plan exists and the signature with
it equals the whole one at batch 1 (bit for bit in float32, within round-off in low precision); for "auto" only
where it also measured faster at batch 1 beyond the noise (split_verdict.row_verdict). It is decided apart from the
batch split: a model may split its batch and not its rows, or its rows alone. The signature then calls one graph, the
whole one and its row split side by side (row_split.routed_rows: a Switch on the batch, each output a Merge), which
shares the weights: they are stored once.
"""

from __future__ import annotations

import dataclasses

from ..analysis.shapes import node_shapes
from ..analysis.token_rows import token_rows
from .frozen_function import imported_function
from .row_split import routed_rows
from .split_option import SERVE

ROW_PARTS = 2  # three branches lost on two cores (docs/batch_one.md); more cores than two are not measured
ROW_CALLS = 16  # calls per timed block at batch 1: a call is a few ms, a block about what a batch-8 block lasts


@dataclasses.dataclass(frozen=True)
class RowChoice:
    """What batch 1 became, and why.

    Attributes:
        rows: token-row branches at batch 1 (1: the graph runs whole).
        why: "token rows in 2 branches, ..." or "runs whole: ...".
        times: {(1, 1): whole ms per call, (1, ROW_PARTS): the row split's} where timed.
    """

    rows: int
    why: str
    times: dict = dataclasses.field(default_factory=dict)


def row_function(graph_def, frozen, captured, length: int, least: int = 0):
    """(a concrete function like frozen_function.imported_function's, running the row split at batch 1 and the
    whole graph at any other batch, the GraphDef it runs, the plan) or (None, why not, None).

    Args:
        graph_def: the frozen graph; frozen: its FrozenSignature; captured: as frozen_function.as_function takes.
        length: the token count the plan is made at where the graph leaves it unknown (a stand-in: the plan holds
            at every length); least: there, the fewest tokens a sample needs to run in rows (routed_rows).
    """
    inputs = [name for _, name in frozen.inputs]
    shapes = node_shapes(graph_def, batch=1, others=length)
    plan = token_rows(graph_def, inputs, list(frozen.outputs.values()), shapes, ROW_PARTS)
    if not plan.splittable:
        return None, plan.reason, None
    graph, fetched = routed_rows(graph_def, plan, least)
    outputs = {key: fetched[tensor] for key, tensor in frozen.outputs.items()}
    try:
        imported, _ = imported_function(graph, frozen.inputs, outputs, captured)
    except ValueError as e:  # TensorFlow refused the graph built: batch 1 runs whole, and the line says why
        return None, (f"the row split did not import ({str(e).splitlines()[0]}); this is a bug of mp-rewrite, "
                      "please report it with the model"), None
    return imported, graph, plan


def rows_least(split, dim: int) -> int:
    """The fewest tokens a sample of a length the graph leaves unknown needs to run in rows: for "auto", `dim`
    (--seq-len), the length it is timed at (a split's gain grows with its rows); as asked, 2 per branch."""
    return max(dim if split == "auto" else 0, 2 * ROW_PARTS)


def with_rows(choice, row: RowChoice):
    """The batch's SplitChoice (split_verdict.py) with batch 1's RowChoice: the line saying both (joined), the row
    branches, and the times of both. Frozen and in place."""
    times = {s: {**row.times.get(s, {}), **choice.times.get(s, {})} for s in {**row.times, **choice.times}}
    return dataclasses.replace(choice, why=joined(choice.why, choice.branches, row), times=times, rows=row.rows)


def joined(batch_why: str, branches: int, row: RowChoice) -> str:
    """The convert line for a batch split (split_verdict's or the "as asked" line) and batch 1's choice."""
    why = batch_why.removesuffix(f"; {SERVE}")
    if row.rows > 1 and branches == 1:  # what splits comes first: a line opening "not split" would mislead
        larger = why.removeprefix("not split: ")
        return f"batch 1: {row.why}; larger batches run whole ({larger}); {SERVE}"
    at_one = f"batch 1: {row.why}" if row.rows > 1 else f"batch 1 {row.why}"
    return f"{why}; {at_one}" + (f"; {SERVE}" if branches > 1 or row.rows > 1 else "")
