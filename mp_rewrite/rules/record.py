"""What a rule decided: `Match` (a pattern found, or why a rule declines it) and `Record` (the outcome, for reports).

Modelled on onnxscript's rewriter: a rule's matcher returns `Match()` holding the nodes it bound, or
`Match().fail(reason)` when the pattern is there but a condition does not hold; only the second is worth a line in a
report ("not per-channel", "read by 2 nodes"), a node that is not the pattern's root at all says nothing.
"""

from __future__ import annotations

import dataclasses

APPLIED = "applied"
DECLINED = "declined"
LEFT_OUT = "left out"  # a rule whose rewrite failed the check (rules.graph_check): the graph converted without it


@dataclasses.dataclass
class Match:
    """The nodes a rule's pattern bound (by role), the values its conditions computed, or why it declines."""

    nodes: dict = dataclasses.field(default_factory=dict)
    values: dict = dataclasses.field(default_factory=dict)
    reason: str | None = None

    def fail(self, reason: str) -> "Match":
        """Mark the match as declined because of `reason`; returns self (for `return Match().fail(...)`)."""
        self.reason = reason
        return self

    @property
    def ok(self) -> bool:
        """Whether every condition held."""
        return self.reason is None


@dataclasses.dataclass(frozen=True)
class Record:
    """One rule's outcome at one node: applied (and the fusion it enables) or declined (and why).

    Attributes:
        rule: the rule's name ("dense_reshape", "batchnorm_fold", ...).
        node: the node the pattern is rooted at, as named in the input graph.
        status: "applied", "declined" or "left out" (its rewrite failed the check; the graph went on without it).
        reason: for a declined rule, why; for an applied one, what it did.
        fusion: the fusion the rewrite enables for TensorFlow's remapper, e.g. "MatMul + BiasAdd + GeluExact".
        nodes: the names of the nodes the pattern covered (input graph names).
    """

    rule: str
    node: str
    status: str
    reason: str
    fusion: str = ""
    nodes: tuple = ()

    @property
    def applied(self) -> bool:
        return self.status == APPLIED

    def as_dict(self) -> dict:
        """Plain data for JSON reports."""
        return dataclasses.asdict(self) | {"nodes": list(self.nodes)}

    def __str__(self) -> str:
        what = f" ({self.fusion})" if self.fusion else ""
        return f"{self.rule} {self.status} at '{self.node}'{what}: {self.reason}"
