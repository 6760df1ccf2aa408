"""Colors and the reasons for them.

Grappler keeps two sets, allow and deny; everything else keeps its dtype. Every change to either set here goes
through `Paint.allow`/`Paint.deny`/`Paint.unallow` with a `Reason`, so reports can render why, never re-decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from . import dtypes

ALLOW, DENY, KEEP = "allow", "deny", "keep"


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    """Why a (node, type attribute) has its color.

    Attributes:
        stage: the stage that decided ("seed_allowlist", "propagate_deny_forward", ...).
        rule: a stable key for the rule ("allow_list", "deny_propagated", "between_allow", ...).
        source: the node that started it (the allow-list or deny-list node upstream), or None.
        via: the neighbouring node it came through (follow `via` reasons to get the whole chain), or None.
        detail: specifics in words.
    """

    stage: str
    rule: str
    source: str | None = None
    via: str | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """The final color of one (node, type attribute).

    Attributes:
        node, attr: the node name and type attribute key ("T", "T[1]", "fixed:float").
        op: the node's op type (after Grappler's FusedBatchNorm -> V2 upgrade).
        category: the op's list ("allow", "infer", "deny", "clear") or None.
        color: "allow" (low precision where it was float32), "deny" or "keep".
        dtype_before, dtype_after: dtype names ("float", "half", "bfloat16", "int32", ...).
        reason: the Reason for the color.
    """

    node: str
    attr: str
    op: str
    category: str | None
    color: str
    dtype_before: str
    dtype_after: str
    reason: Reason

    @property
    def converted(self) -> bool:
        """True if this type attribute was float32 and is now low precision."""
        return self.dtype_before != self.dtype_after


class Paint:
    """The mutable allow/deny sets of one run of the pass, with the latest Reason per vertex."""

    def __init__(self):
        self.allow, self.deny, self.reasons = set(), set(), {}

    def paint_allow(self, v: int, reason: Reason) -> bool:
        """Add v to allow; record the reason if it was not there. Returns True if it was added."""
        if v in self.allow:
            return False
        self.allow.add(v)
        self.reasons[v] = reason
        return True

    def paint_deny(self, v: int, reason: Reason) -> bool:
        """Add v to deny (and drop it from allow); record the reason. Returns True if it was added."""
        self.allow.discard(v)
        if v in self.deny:
            return False
        self.deny.add(v)
        self.reasons[v] = reason
        return True

    def unallow(self, v: int, reason: Reason) -> bool:
        """Remove v from allow (it keeps its dtype); record the reason. Returns True if it was removed."""
        if v not in self.allow:
            return False
        self.allow.discard(v)
        self.reasons[v] = reason
        return True


class Coloring(Mapping):
    """Read-only mapping (node name, type attr key) -> Decision for every vertex of the graph.

    Decisions are built on access, so a million-node graph does not pay for objects nobody reads.
    """

    def __init__(self, view, lists, paint: Paint, target: int, fallback_reasons: dict):
        self._view, self._lists, self._paint, self._target = view, lists, paint, target
        self._fallback = fallback_reasons

    def color_of(self, v: int) -> str:
        """Return the color of vertex v."""
        return ALLOW if v in self._paint.allow else DENY if v in self._paint.deny else KEEP

    def decision(self, v: int) -> Decision:
        """Return the Decision of vertex v."""
        view = self._view
        node = view.v_node[v]
        before = view.v_dtype[v]
        color = self.color_of(v)
        after = self._target if color == ALLOW and before == dtypes.FLOAT else before
        reason = self._paint.reasons.get(v) or self._fallback(v)
        op = view.ops[node]
        return Decision(view.names[node], view.v_key[v], op, self._lists.category(op), color,
                        dtypes.name(before), dtypes.name(after), reason)

    def __getitem__(self, key) -> Decision:
        v = self._view.vertex(*key)
        if v is None:
            raise KeyError(key)
        return self.decision(v)

    def __iter__(self):
        view = self._view
        return ((view.names[view.v_node[v]], view.v_key[v]) for v in range(view.num_vertices))

    def __len__(self) -> int:
        return self._view.num_vertices

    def for_node(self, name: str) -> list[Decision]:
        """Return the Decisions of every type attribute of one node (empty if there is no such node)."""
        index = self._view.node_index.get(name)
        return [] if index is None else [self.decision(v) for v in self._view.node_vids[index].values()]
