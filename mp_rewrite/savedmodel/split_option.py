"""The `--split` option of `convert --freeze` (batch_split.py), parsed without TensorFlow: the command line checks
it before anything slow starts."""

from __future__ import annotations

from ..errors import OptionError

import re

SPLIT_FORMS = ("auto", "off")
# The name of a split signature's function (its FunctionDef: "__inference_split_batch_in_2_123", or
# "__inference_split_batch_in_2_from_32_123" where batches below 32 run whole): what `inspect` finds in a written model.
_SPLIT_DEF = re.compile(r"__inference_split_batch_in_(\d+)(?:_from_(\d+))?_\d+$")
# What routes batch 1 to the token rows: a frozen graph's Switch (row_split.routed_rows, "<input>/token_rows_in_2"),
# or in place, the wrapper's If (split_wrapper.split_wrapper, "one_sample/token_rows_in_2").
ROW_ROUTE = "token_rows_in_{}"
_ROW_ROUTE = re.compile(r"/token_rows_in_(\d+)$")
SERVE = ("serve it with one intra-op thread: TF_NUM_INTRAOP_THREADS=1, "
         "tf.config.threading.set_intra_op_parallelism_threads(1), or TF Serving's "
         "--tensorflow_intra_op_parallelism=1")


def parse_split(value) -> str | int:
    """"auto", "off", or a number of branches >= 2 (given as text on the command line, or an int).

    Raises:
        OptionError: anything else.
    """
    text = str(value).strip().lower()
    if text in SPLIT_FORMS:
        return text
    if text.isdigit() and int(text) >= 2:
        return int(text)
    raise OptionError(f"unknown --split {value!r}: use auto, off, or a number of branches (2 or more)")


def split_function(branches: int, least: int = 0) -> str:
    """The name of the function of a signature split in `branches`, from batch `least` (0: `branches`) up."""
    return f"split_batch_in_{branches}" + (f"_from_{least}" if least else "")


def split_branches(function_names) -> tuple[int, int] | None:
    """(the number of branches a model's split signatures run, the smallest batch they split) of the split with the
    most branches, from its function names; None if none is split."""
    found = [(int(m.group(1)), int(m.group(2) or m.group(1))) for m in map(_SPLIT_DEF.match, function_names) if m]
    return max(found) if found else None


def row_branches(functions) -> int | None:
    """The number of token-row branches batch 1 runs in (the largest), from the Switch (frozen) and If (in place)
    nodes of `functions` (FunctionDefs); None if no signature splits its rows."""
    found = [int(m.group(1)) for f in functions for n in f.node_def if n.op in ("Switch", "If")
             for m in [_ROW_ROUTE.search(n.name)] if m]
    return max(found) if found else None
