"""Node classes for pictures and tables: one class per node, from its Decisions (rendered, never re-decided)."""

from __future__ import annotations

from ..core.coloring import ALLOW, DENY

# Classes in legend order: (class, fill colour, legend text).
CLASSES = (
    ("allow", "#8fd694", "allow: computes in low precision"),
    ("deny", "#f28b82", "deny: kept float32 (deny list or deny propagated)"),
    ("infer-kept", "#fdd663", "infer op kept float32"),
    ("clear-kept", "#aecbfa", "clear op kept float32"),
    ("allow-kept", "#d7aefb", "allow-list op kept float32"),
    ("untouched", "#eeeeee", "untouched: no float32 type, in no list, or not processed"),
    ("cast", "#ffffff", "Cast inserted by the rewrite"),
)
FILL = {name: fill for name, fill, _ in CLASSES}
LEGEND = {name: text for name, _, text in CLASSES}
CLASS_NAMES = tuple(name for name, _, _ in CLASSES)
LOW_DTYPES = ("half", "bfloat16")
DTYPE_NAMES = {"float": "float32", "half": "float16", "double": "float64"}


def dtype_label(name: str) -> str:
    """A DataType short name as users write it ("half" -> "float16", "float" -> "float32")."""
    return DTYPE_NAMES.get(name, name)


def primary_decision(decisions):
    """The Decision that stands for the node: the first allow, else the first deny, else the first float32 type
    attribute, else the first one (None for a node without type attributes)."""
    for test in (lambda d: d.color == ALLOW, lambda d: d.color == DENY, lambda d: d.dtype_before == "float"):
        found = next((d for d in decisions if test(d)), None)
        if found is not None:
            return found
    return decisions[0] if decisions else None


def node_class(decisions, category: str | None) -> str:
    """The picture class of a node from its Decisions and its op's list (see CLASSES)."""
    if any(d.color == ALLOW for d in decisions):
        return "allow"
    if any(d.color == DENY for d in decisions):
        return "deny"
    if any(d.dtype_before == "float" for d in decisions) and category in ("infer", "clear", "allow"):
        return f"{category}-kept"
    return "untouched"


# The time view's heat scale (light to dark orange; black text reads on every step), one step per halving of the
# slowest layer's time: layer times spread over three orders of magnitude, so equal steps would leave all but a
# few boxes white.
HEAT = ("#fff5eb", "#fee6ce", "#fdd0a2", "#fdae6b", "#fd8d3c", "#f16913")
NO_TIME_FILL = "#e8eaed"


def heat_steps(top: float) -> list:
    """[(from ms, to ms, fill)] of the heat scale when the slowest layer takes `top` ms: the last step is its upper
    half, each step before it half the one after."""
    edges = [0.0] + [top / 2 ** k for k in range(len(HEAT) - 1, 0, -1)] + [top]
    return [(lo, hi, fill) for lo, hi, fill in zip(edges, edges[1:], HEAT)]


def heat_fill(ms: float | None, top: float) -> str:
    """The fill of a layer taking `ms` (None: no time measured) when the slowest takes `top`."""
    if ms is None:
        return NO_TIME_FILL
    return next((fill for _, hi, fill in heat_steps(top) if ms < hi), HEAT[-1])
