"""`explain`: why one node has its dtype — its Decisions, the chain of Reasons that decided them (followed node to
node through `Reason.via`), and for a node left in float32 what would have made it convert."""

from __future__ import annotations

import collections
import dataclasses
import difflib

from ..errors import GraphError
from .palette import dtype_label, primary_decision
from .wording import reason_text

# Rules whose Reason.via names the neighbour the color came through.
CHAINED_RULES = ("deny_propagated", "between_allow", "follows_allow", "allow_through_clear")
MAX_CHAIN = 500


@dataclasses.dataclass
class Explanation:
    """Why one node of one graph has its dtypes.

    Attributes:
        graph: "" for the main graph, else the function's name.
        node, op, category, node_class: the node, its op, the op's list and its picture class.
        lines: one per type attribute (or one for the node when all agree): "float16 — allow list".
        chains: per line, the nodes the decision came through, source first (empty when not chained).
        hints: what would have made a float32 node convert (near misses), or notes.
        also_in: the other graphs with a node of this name.
    """

    graph: str
    node: str
    op: str
    category: str | None
    node_class: str
    lines: list
    chains: list
    hints: list
    also_in: list = dataclasses.field(default_factory=list)

    def headline(self) -> str:
        """"dense/BiasAdd: float32 — infer op; deny propagated from ..." (the first line)."""
        return f"{self.node}: {self.lines[0]}" if self.lines else f"{self.node}: no type attributes"

    def text(self) -> str:
        """The explanation as indented text (headline, more type attributes, hints, where else it is)."""
        where = f"function {self.graph}" if self.graph else "main graph"
        listed = f"{self.category} list" if self.category else "in no op list"
        out = [self.headline(), f"  op {self.op} ({listed}), {where}, color {self.node_class}"]
        out += [f"  {line}" for line in self.lines[1:]]
        out += [f"  near miss: {h}" if not h.startswith(("note:", "cast:", "time:")) else f"  {h}" for h in self.hints]
        if self.also_in:
            out.append(f"  also a node of: {', '.join(g or '(main graph)' for g in self.also_in)} (use --function)")
        return "\n".join(out)

    def as_dict(self) -> dict:
        """A JSON-ready dict (see docs/json_schema.md, "explanation")."""
        return {"graph": self.graph, "node": self.node, "op": self.op, "category": self.category,
                "class": self.node_class, "text": self.text(), "lines": list(self.lines),
                "chains": [list(c) for c in self.chains], "hints": list(self.hints)}


def _pick(decisions, color: str, source: str | None):
    """The decision of a `via` node that continues a chain: same color and source, else same color."""
    same = [d for d in decisions if d.color == color]
    return next((d for d in same if d.reason.source == source), same[0] if same else None)


COST_RULES = ("cost_low", "cost_float32")  # the cost assignment's reasons, which already state the node's times


class Explainer:
    """Explains nodes of a set of GraphTables; builds each graph's consumer index once.

    `times` (node_times.node_times: graph -> node -> (float32 ms, ms as converted)), when a cost table exists,
    adds a node's times in one line where its reason does not already give them.
    """

    def __init__(self, tables, precision: str, times: dict | None = None):
        self.tables = {t.name: t for t in tables}
        self.precision = precision
        self.times = times or {}
        self._consumers = {}

    def time_hint(self, row) -> list:
        """["time: bfloat16 0.780 ms vs float32 1.420 ms per call ..."] when the node has times and its reason
        does not say them (the cost assignment's does), else []."""
        from ..core.assignment import _ms
        t = self.times.get(row.graph, {}).get(row.name)
        if t is None or any(d.reason.rule in COST_RULES for d in row.decisions):
            return []
        if row.cast is not None:
            if not t[1]:
                return ["time: not measured (no kernel of its own ran: TF folded or fused it)"]
            return [f"time: {_ms(t[1])} per call (priced by its tensor's size from this machine's cast times)"]
        if not max(t):  # not a time of zero: no kernel of the node's own was timed
            return ["time: not measured (no kernel of its own ran in the timed runs: fused into another, or folded)"]
        low = row.node_class == "allow"
        where = f"it computes in {self.precision}" if low else "it computes in float32 here"
        return [f"time: {self.precision} {_ms(t[1] if low else t[0])} vs float32 {_ms(t[0])} per call ({where})"]

    def consumers(self, graph: str) -> dict:
        """node -> names of the nodes reading it (original graph, inserted Casts looked through)."""
        if graph not in self._consumers:
            index = collections.defaultdict(list)
            for row in self.tables[graph].rows.values():
                if row.cast is None:
                    for src, _ in row.inputs:
                        index[src].append(row.name)
            self._consumers[graph] = index
        return self._consumers[graph]

    def chain(self, graph: str, node: str, decision) -> list:
        """Node names along which the decision's color came, in data-flow order ([] if not chained).

        deny_propagated and follows_allow: source -> ... -> node. between_allow: source, "…", node -> ... ->
        the allow node downstream (the pass records the way down only). allow_through_clear: source to node
        through clear ops, either direction.
        """
        rule = decision.reason.rule
        if rule not in CHAINED_RULES:
            return []
        rows, path, current = self.tables[graph].rows, [node], decision
        while current.reason.via and current.reason.via not in path and len(path) < MAX_CHAIN:
            via = current.reason.via
            path.append(via)
            nxt = _pick(rows[via].decisions, current.color, decision.reason.source) if via in rows else None
            if nxt is None or nxt.reason.rule != rule:
                break
            current = nxt
        source = decision.reason.source
        if rule == "between_allow":
            return ([source, "…"] if source else []) + path
        path.reverse()
        return path if not source or path[0] == source else [source, "…"] + path

    def line(self, graph: str, row, decision, chain: list) -> str:
        """"float32 — infer op; deny propagated from loss/Log (Log, deny list) via loss/sub -> dense/BiasAdd"."""
        reason, dtype = decision.reason, dtype_label(decision.dtype_after)
        kind = f"{row.category} op; " if row.category in ("infer", "clear") else ""
        if reason.rule == "deny_propagated" and chain:
            source = self.tables[graph].rows.get(chain[0])
            what = f"{chain[0]} ({source.op}, deny list)" if source else chain[0]
            return f"{dtype} — {kind}deny propagated from {what} via {' -> '.join(chain[1:])}"
        if reason.rule == "between_allow" and chain:
            return f"{dtype} — {kind}between allow nodes {reason.source} and {chain[-1]}: {' -> '.join(chain)}"
        if reason.rule == "allow_through_clear" and len(chain) > 2:
            return f"{dtype} — {kind}{reason_text(reason)} through clear ops: {' — '.join(chain)}"
        return f"{dtype} — {kind}{reason_text(reason)}"

    def explain_row(self, row, also_in=()) -> Explanation:
        """The Explanation of one NodeRow."""
        if row.cast is not None:
            return self._explain_cast(row, also_in)
        decisions = list(row.decisions)
        primary = primary_decision(decisions)
        shown = [primary] if primary is not None else []
        shown += [d for d in decisions if d is not primary and (d.dtype_before == "float" or d.color != "keep")]
        chains = [self.chain(row.graph, row.name, d) for d in shown]
        lines = [self.line(row.graph, row, d, c) for d, c in zip(shown, chains)]
        if len(shown) > 1:
            lines = [f"{d.attr}: {text}" for d, text in zip(shown, lines)]
        kept = primary is not None and primary.dtype_before == primary.dtype_after == "float"
        hints = self.hints(row, [d for d in shown if d.dtype_after == "float"]) if kept else []
        hints += self.time_hint(row)
        return Explanation(row.graph, row.name, row.op, row.category, row.node_class, lines, chains, hints,
                           list(also_in))

    def _explain_cast(self, row, also_in) -> Explanation:
        cast = row.cast
        line = (f"inserted Cast {dtype_label(cast.from_dtype)} -> {dtype_label(cast.to_dtype)} of "
                f"{cast.src}:{cast.src_port}")
        consumers = ", ".join(n for n, _ in cast.consumers)
        hint = f"cast: {cast.src} and its consumer(s) {consumers} differ in precision, so the rewrite casts between"
        return Explanation(row.graph, row.name, "Cast", None, "cast", [line], [[]], [hint, *self.time_hint(row)],
                           list(also_in))

    def hints(self, row, kept) -> list:
        """Near misses: for each type attribute kept in float32, what would have converted it."""
        from .hints import near_miss
        found = []
        for d in kept:
            for hint in near_miss(self, row, d):
                if hint not in found:
                    found.append(hint)
        return found

    def find(self, node: str, function: str | None = None) -> list:
        """The rows named `node` (in `function` only, if given), main graph first.

        Raises:
            GraphError: no such node; the message names the closest node names.
        """
        graphs = [function] if function is not None else list(self.tables)
        rows = [self.tables[g].rows[node] for g in graphs if node in self.tables[g].rows]
        if rows:
            return rows
        close = closest_names(node, [n for g in graphs for n in self.tables[g].rows])
        where = f"function '{function}'" if function else (
            "the main graph" + (f" or its {len(self.tables) - 1} rewritten functions" if len(self.tables) > 1 else ""))
        hint = f"; closest: {', '.join(close)}" if close else ""
        raise GraphError(f"no node named '{node}' in {where}{hint}")


def closest_names(query: str, names, n: int = 5) -> list:
    """Names most like `query`: same last name-scope component first, then containing it, then difflib's."""
    names = list(dict.fromkeys(names))
    low = query.lower()
    found = [m for m in names if m.rsplit("/", 1)[-1].lower() == low.rsplit("/", 1)[-1]]
    found += [m for m in names if low in m.lower() and m not in found]
    found += [m for m in difflib.get_close_matches(query, names, n=n, cutoff=0.5) if m not in found]
    return found[:n]


def explain_all(result, node: str, function: str | None = None, tables=None, costs=None) -> list[Explanation]:
    """Explain every node named `node`: in the main graph and each rewritten function (or only `function`).

    Args:
        result: a RewriteResult.
        node: the node name (function body nodes keep their FunctionDef names).
        function: look only in this rewritten function.
        tables: node_table.build_tables(result), if already built.
        costs: the CostTable the rewrite read: the node's times are added where its reason lacks them.

    Returns:
        One Explanation per graph holding the node, main graph first.

    Raises:
        GraphError: no such node (the message names the closest names).
        OptionError: an unknown function.
    """
    from .node_table import build_tables
    if tables is None:
        tables = build_tables(result, function, with_flops=False)
    from .node_times import explained_times
    explainer = Explainer(tables, result.precision, explained_times(tables, costs, result))
    rows = explainer.find(node, function)
    graphs = [r.graph for r in rows]
    return [explainer.explain_row(r, [g for g in graphs if g != r.graph]) for r in rows]


def explain(result, node: str, function: str | None = None) -> Explanation:
    """Explain one node: the first match of explain_all (the main graph's, if it has the node).

    Raises:
        GraphError, OptionError: as explain_all.
    """
    return explain_all(result, node, function)[0]
