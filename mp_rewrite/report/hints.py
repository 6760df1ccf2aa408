"""Near misses: for a type attribute left in float32, what would have made it convert — one function per rule
key, in one table (`NEAR_MISS`), each reading only the Decisions and Reasons the pass recorded."""

from __future__ import annotations

from .palette import dtype_label, primary_decision
from .wording import reason_text

MAX_NEIGHBOURS = 6


def _neighbour(explainer, graph: str, name: str) -> str:
    """"loss/sub is float32 (deny: deny propagated from loss/Log)" for one neighbouring node."""
    row = explainer.tables[graph].rows.get(name)
    decision = primary_decision(row.decisions) if row is not None else None
    if decision is None:
        return f"{name} has no float type"
    return (f"{name} is {dtype_label(decision.dtype_after)} ({row.node_class}: "
            f"{reason_text(decision.reason)})")


def _float_inputs(explainer, row) -> list:
    """Names of the data inputs of a node that carry float tensors (original graph)."""
    rows = explainer.tables[row.graph].rows
    names = []
    for src, _ in row.inputs:
        d = primary_decision(rows[src].decisions) if src in rows else None
        if d is not None and d.dtype_before in ("float", "half", "bfloat16") and src not in names:
            names.append(src)
    return names


def _not_processed(explainer, row, decision) -> list:
    detail = decision.reason.detail
    if "placed on" in detail:
        kind = "cpu" if "placed on CPU" in detail else "gpu"
        return [f"not processed: {detail} — use --device {kind} or --device any"]
    if detail.startswith("fetched"):
        return ["fetched: graph outputs keep their dtype (drop it from the fetches to let it convert)"]
    return [f"not processed: {detail}"]


def _not_between_allow(explainer, row, decision) -> list:
    inputs = _float_inputs(explainer, row)
    out = ["an infer op: it would convert if it sat between two allow ops or directly after one"]
    rows = explainer.tables[row.graph].rows
    for name in inputs[:MAX_NEIGHBOURS]:
        d = primary_decision(rows[name].decisions)
        if d.color == "allow":
            out.append(f"its input {name} is low precision, but another input is deny or float32, "
                       "and an infer op follows an allow input only when no input is deny")
        else:
            out.append(f"its input {_neighbour(explainer, row.graph, name)}")
    return out


def _no_allow_neighbour(explainer, row, decision) -> list:
    graph = row.graph
    names = _float_inputs(explainer, row) + explainer.consumers(graph).get(row.name, [])
    out = ["a clear op: it converts only when connected, through clear ops, to a low-precision node"]
    out += [f"neighbour {_neighbour(explainer, graph, n)}" for n in list(dict.fromkeys(names))[:MAX_NEIGHBOURS]]
    return out


def _deny_list(explainer, row, decision) -> list:
    return [f"{row.op} is on the {explainer.precision} deny list: force this node with --force-low "
            f"'{row.name}' or move {row.op} out of the deny list (--infer {row.op} or --clear {row.op})"]


def _deny_propagated(explainer, row, decision) -> list:
    source = decision.reason.source
    source_row = explainer.tables[row.graph].rows.get(source)
    op = source_row.op if source_row is not None else "the deny op"
    return [f"deny from {op} upstream: add '{source}' to --force-low or remove {op} from the deny list "
            f"(--infer {op} or --clear {op}); deny flows forward through clear and infer ops that lead to another "
            "deny or infer op"]


def _not_in_lists(explainer, row, decision) -> list:
    if not row.inputs:
        return [f"a source of {dtype_label(decision.dtype_before)} tensors ({row.op}): it keeps its dtype, and "
                "consumers in low precision read it through a Cast"]
    return [f"{row.op} is in no op list, so it keeps its dtype; if it is safe in {explainer.precision}, put it in "
            f"a list (--clear {row.op} or --infer {row.op}; `mp-rewrite lists` shows them)"]


def _not_float32(explainer, row, decision) -> list:
    return [f"only float32 tensors are converted; this one is {dtype_label(decision.dtype_before)}"]


def _detail(explainer, row, decision) -> list:
    return [decision.reason.detail or reason_text(decision.reason)]


def _keep_fp32(explainer, row, decision) -> list:
    return ["the node matches a keep_fp32 pattern (--keep-fp32)"]


def _position_angle(explainer, row, decision) -> list:
    return [f"it computes the angle of {decision.reason.source} from integer positions (a rotary or sinusoidal "
            "position embedding): low precision keeps 8 significant bits, so an angle near 1000 radians would move "
            "in steps of 4; the default conversion keeps it float32, --assign lists (Grappler's lists) does not"]


NEAR_MISS = {
    "not_processed": _not_processed,
    "not_between_allow": _not_between_allow,
    "no_allow_neighbour": _no_allow_neighbour,
    "deny_list": _deny_list,
    "deny_propagated": _deny_propagated,
    "not_in_lists": _not_in_lists,
    "not_float32": _not_float32,
    "user_keep_fp32": _keep_fp32,
    "position_angle": _position_angle,
}
"""rule key -> (explainer, row, decision) -> hint lines; other rules show their Reason's detail."""


def near_miss(explainer, row, decision) -> list:
    """What would have made this float32 type attribute of `row` convert, as lines of text."""
    return NEAR_MISS.get(decision.reason.rule, _detail)(explainer, row, decision)
