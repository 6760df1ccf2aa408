"""Precision assignment by measured cost: an exact s-t minimum cut over a cost table given as plain data.

Grappler's lists decide which (node, type attribute) vertices may be low precision (its allow set, after deny
propagation, keep_fp32, preserved nodes, loops and TensorLists). This stage then chooses, among those, which really
are: each candidate node is float32 or low precision; its own cost is its time in that precision; a tensor whose
producer and some consumer differ costs one Cast (one per tensor and direction, however many consumers); a fusion
TF performs (Conv2D/MatMul + BiasAdd + activation) costs what it saves when its two ends differ. All these costs are
non-negative and submodular, so the cheapest assignment is a minimum s-t cut, found exactly (networkx).

The cut can only move a vertex from low precision to float32, never the other way: everything outside the allow
set is fixed to its side with infinite capacity. Ties go to float32; but a cut that saves less than RESOLUTION of
the lists' predicted time keeps the lists' coloring (a gain within the timing's noise is no evidence).

Cost model: source side = float32, sink side = low precision. A variable x pays `low` (edge s->x, cut when x is
low) or `fp32` (edge x->t, cut when x stays float32). A tensor of producer u read by v1..vk: the cast to low is an
auxiliary node a with u->a (its cost) and a->vi (infinite); the cast back to float32 is b with vi->b (infinite)
and b->u (its cost). A fusion u-v: u->v and v->u, each its cost.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

from ..errors import OptionError
from .coloring import Reason

ASSIGN_MODES = ("lists", "cost")
FP32, LOW = -1, -2  # fixed ends: a vertex that must stay float32 / must stay low precision
LOOP_OPS = frozenset({"Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond"})
DEFAULT_CAST_MS = 0.001  # a tensor the table does not know: a cast is cheap but never free, so ties stay put
_SCALE = 1e6  # ms -> integer ns: integer capacities make the cut exact and deterministic
# The share of the lists' predicted time a cut must save to replace Grappler's coloring: measured op times vary by
# a few percent from run to run, and a cut that saves less is within that noise.
RESOLUTION = 0.01
SOURCE = "source"  # a CostTable's keep: the model as given, without the graph rules


@dataclasses.dataclass(frozen=True)
class CostTable:
    """The costs the assignment reads, as plain data (mp_rewrite.analysis.op_costs measures and builds them).

    Attributes:
        precision: "bfloat16" or "float16", the low precision the times were measured in.
        nodes: graph label -> node name -> (float32 ms, low precision ms). The label is "graph" for the main graph
            and the function's name for a function body. A node not listed costs the same in both precisions
            (neutral: the casts around it decide).
        casts: graph label -> (node name, output port) -> (ms of a cast to low, ms of a cast to float32).
        fusions: graph label -> (producer, consumer) -> ms lost when the two run in different precisions.
        low_units: False when the machine has no low-precision units: every candidate then stays float32.
        note: one line on where the numbers come from (machine, or why everything stays float32).
        keep: "lists" or "float32" when the graph was run with the cut's choice and that coloring ran faster (the
            prediction checked against the run, analysis.graph_profile); the assignment then keeps it. SOURCE
            ("source"): the model as given, before the graph rules rewrote it, ran fastest; every candidate stays
            float32, and the caller writes the model without the rules (savedmodel.in_place).
        runs: what running the model measured beside the costs (analysis.run_times.RunTimes: every op's time, the
            whole runs), for reports; None when the table was not measured in the model. The assignment never
            reads it.
        decision: where variants were raced, what was written and why in a user's words ("wrote float32: bfloat16
            measured 1.31x slower at batch 1 ..."), the line a conversion says first; else "".
        together: graph label -> node name -> a key: the candidates of one key go to one side together (the nodes
            of one op type, priced by their op type's pooled times: analysis.graph_costs.pooled_pairs), so that
            the noise of one measurement moves no single node; {} (the default) lets each node go its own way.
    """

    precision: str
    nodes: Mapping = dataclasses.field(default_factory=dict)
    casts: Mapping = dataclasses.field(default_factory=dict)
    fusions: Mapping = dataclasses.field(default_factory=dict)
    low_units: bool = True
    note: str = ""
    keep: str = ""
    runs: object = None
    decision: str = ""
    together: Mapping = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Problem:
    """One assignment problem over variables 0..n-1 (fixed ends are FP32 and LOW).

    Attributes:
        node_ms: per variable, (float32 ms, low ms).
        tensors: (producer, consumers, ms to low, ms to float32); producer and consumers are variables or FP32/LOW.
        fusions: (a, b, ms) paid when a and b end on different sides.
        together: (a, b) pairs of variables that must end on one side.
    """

    node_ms: list
    tensors: list = dataclasses.field(default_factory=list)
    fusions: list = dataclasses.field(default_factory=list)
    together: list = dataclasses.field(default_factory=list)


def total_cost(problem: Problem, low) -> float:
    """The cost of an assignment (low[i] True: variable i in low precision), evaluated term by term."""
    def side(x):
        return x == LOW if x < 0 else bool(low[x])
    total = sum(ms[1] if low[i] else ms[0] for i, ms in enumerate(problem.node_ms))
    for producer, consumers, to_low, to_fp32 in problem.tensors:
        sides = {side(c) for c in consumers}
        if side(producer):
            total += to_fp32 if False in sides else 0.0
        else:
            total += to_low if True in sides else 0.0
    return total + sum(ms for a, b, ms in problem.fusions if side(a) != side(b))


def solve(problem: Problem) -> list[bool]:
    """The cheapest assignment (low[i] per variable), exactly, by one minimum s-t cut; ties go to float32.

    Raises:
        OptionError: a negative cost.
    """
    import networkx as nx
    from networkx.algorithms.flow import preflow_push

    n = len(problem.node_ms)
    if n == 0:
        return []
    graph, s, t = nx.DiGraph(), "s", "t"
    terminal = {FP32: s, LOW: t}
    name = lambda x: terminal.get(x, x)  # noqa: E731
    edges = []
    for i, (fp32, low) in enumerate(problem.node_ms):
        edges += [(s, i, _units(low)), (i, t, _units(fp32))]
    inf = "inf"
    for k, (producer, consumers, to_low, to_fp32) in enumerate(problem.tensors):
        u = name(producer)
        edges += [(u, ("to_low", k), _units(to_low)), (("to_fp32", k), u, _units(to_fp32))]
        for c in consumers:
            edges += [(("to_low", k), name(c), inf), (name(c), ("to_fp32", k), inf)]
    for a, b, ms in problem.fusions:
        edges += [(name(a), name(b), _units(ms)), (name(b), name(a), _units(ms))]
    for a, b in problem.together:
        edges += [(a, b, inf), (b, a, inf)]
    big = 1 + sum(c for _, _, c in edges if c != inf)
    for u, v, c in edges:
        c = big if c == inf else c
        if u == v or u == t or v == s or c == 0:
            continue
        if graph.has_edge(u, v):
            graph[u][v]["capacity"] += c
        else:
            graph.add_edge(u, v, capacity=c)
    graph.add_nodes_from((s, t, *range(n)))
    residual = preflow_push(graph, s, t)
    low_side = _reaching(residual, t)
    return [i in low_side for i in range(n)]


def _units(ms: float) -> int:
    if ms < 0:
        raise OptionError(f"a cost table holds a negative time ({ms} ms); times are measured, never negative")
    return int(round(ms * _SCALE))


def _reaching(residual, t) -> set:
    """The nodes from which t is reachable in the residual graph: the smallest sink side of a minimum cut."""
    reached, stack = {t}, [t]
    while stack:
        y = stack.pop()
        for x, attrs in residual.pred[y].items():
            if x not in reached and attrs["capacity"] - attrs["flow"] > 0:
                reached.add(x)
                stack.append(x)
    return reached


@dataclasses.dataclass(frozen=True)
class Assignment:
    """What the cost assignment of one graph decided, in predicted milliseconds (from the cost table).

    Attributes:
        candidates: nodes Grappler's lists made low precision that the cut could move.
        demoted: those the cut moved to float32.
        cost, lists_cost, fp32_cost: the predicted time of the cut's choice, of Grappler's (every candidate low) and
            of every candidate in float32 (the same terms, casts included).
        bound: the sum over candidates of the faster precision's time, casts not counted.
        note: one line when the table says why everything stays float32.
        source: where the table's numbers come from (its note).
        decision: the table's decision line (what was written and why, where variants were raced), else "".
    """

    candidates: tuple
    demoted: tuple
    cost: float
    lists_cost: float
    fp32_cost: float
    bound: float
    note: str = ""
    source: str = ""
    decision: str = ""


def assign_by_cost(ctx, paint, clusters, table: CostTable, label: str = "graph") -> Assignment:
    """The cost stage: demote the allow vertices the minimum cut puts in float32, and restate every candidate's
    Reason with its numbers. Loop ops, TensorList clusters, the user's force_low nodes and every vertex outside the
    allow set keep their color.

    Args:
        ctx, paint: the pass context and the paint after Grappler's stages.
        clusters: the TensorList clusters (tensor_lists.find_clusters), fixed to their color.
        table: the CostTable; `label` selects the graph in it ("graph", or a function's name).

    Returns:
        An Assignment summary.
    """
    view = ctx.view
    fixed = {n for cluster in clusters for n in cluster}
    fixed.update(n for n, op in enumerate(view.ops) if op in LOOP_OPS or ctx.override[n] == "force_low")
    var_of, groups = {}, {}  # vertex -> variable; node -> its candidate vertices
    for v in sorted(paint.allow):
        node = view.v_node[v]
        if ctx.is_float32(v) and node not in fixed:
            groups.setdefault(node, []).append(v)
    nodes = list(groups)
    for i, node in enumerate(nodes):
        var_of.update((v, i) for v in groups[node])
    node_costs = table.nodes.get(label, {})
    problem = Problem([tuple(node_costs.get(view.names[n], (0.0, 0.0))) for n in nodes])
    together = table.together.get(label, {})
    keys, first = [together.get(view.names[n]) for n in nodes], {}  # key -> its first variable, the others tied to it
    for i, key in enumerate(keys):
        if key is not None and first.setdefault(key, i) != i:
            problem.together.append((first[key], i))
    sizes = Counter(keys)
    held = [f"; placed with the {sizes[k] - 1} other {k or 'unnamed'} node(s), priced at their op type's ratio"
            if k is not None and sizes[k] > 1 else "" for k in keys]
    _add_tensors(ctx, paint, var_of, table.casts.get(label, {}), problem)
    _add_fusions(ctx, paint, var_of, groups, table.fusions.get(label, {}), problem)
    note = "" if table.low_units else table.note or "this machine has no low-precision units"
    low = solve(problem) if table.low_units else [False] * len(nodes)
    everything = [True] * len(nodes)
    low_why, fp32_why = f"cheaper in {table.precision}", note or "cheaper in float32 with the casts it needs"
    lists_cost, fp32_cost = total_cost(problem, everything), total_cost(problem, [False] * len(nodes))
    unresolved = total_cost(problem, low) > (1 - RESOLUTION) * lists_cost
    if table.low_units and table.keep:
        # The model was run with the cut's choice, and the lists' coloring (or float32) ran faster: it stays.
        low = [table.keep == "lists"] * len(nodes)
        low_why = fp32_why = (f"the model ran faster with {table.keep} than with the cut, so {table.keep} stays"
                              if table.keep != SOURCE else "the model as given, without the graph rules, ran "
                              "fastest, so it is written unchanged")
    elif table.low_units and unresolved and lists_cost <= fp32_cost:
        # A gain the timing cannot resolve is no evidence against Grappler's choice (and casts cost what the
        # table does not see): the lists' coloring stays.
        gain = lists_cost - total_cost(problem, low)
        gained = f"would gain {_ms(gain)}, under" if gain > 0 else "would gain nothing over the lists, within"
        low, low_why = everything, (f"the cut {gained} {RESOLUTION:.0%} of the graph's predicted time: Grappler's "
                                    "choice kept")
    measured = [view.names[n] in node_costs for n in nodes]
    _record(ctx, paint, problem, nodes, groups, low, table.precision, measured, held, low_why, fp32_why)
    return Assignment(tuple(view.names[n] for n in nodes),
                      tuple(view.names[n] for n, is_low in zip(nodes, low) if not is_low),
                      total_cost(problem, low), lists_cost, fp32_cost, sum(min(ms) for ms in problem.node_ms), note,
                      table.note, table.decision)


def _side(ctx, paint, var_of, v):
    return var_of.get(v, LOW if v in paint.allow and ctx.is_float32(v) else FP32)


def _add_tensors(ctx, paint, var_of, casts, problem) -> None:
    """One term per float32 tensor that touches a variable: its producer and the sides of its consumers."""
    view, tensors = ctx.view, {}
    for e, (u, v) in enumerate(zip(view.e_u, view.e_v)):
        if not ctx.is_float32(u):
            continue
        key = (view.e_src[e], view.e_src_port[e])
        entry = tensors.get(key)
        if entry is None:
            entry = tensors[key] = (_side(ctx, paint, var_of, u), set())
        entry[1].add(_side(ctx, paint, var_of, v))
    for (src, port), (producer, consumers) in tensors.items():
        if producer >= 0 or any(c >= 0 for c in consumers):
            to_low, to_fp32 = casts.get((view.names[src], port), (DEFAULT_CAST_MS, DEFAULT_CAST_MS))
            problem.tensors.append((producer, sorted(consumers), to_low, to_fp32))


def _add_fusions(ctx, paint, var_of, groups, fusions, problem) -> None:
    view = ctx.view

    def side(name):
        node = view.node_index.get(name)
        if node is None:
            return None
        if node in groups:
            return var_of[groups[node][0]]
        vids = view.node_vids[node].values()
        return LOW if any(v in paint.allow and ctx.is_float32(v) for v in vids) else FP32
    for (producer, consumer), ms in sorted(fusions.items()):
        a, b = side(producer), side(consumer)
        if a is not None and b is not None and (a >= 0 or b >= 0):
            problem.fusions.append((a, b, ms))


def _record(ctx, paint, problem, nodes, groups, low, precision, measured, held, low_why, fp32_why) -> None:
    """Demote the float32 variables; restate every candidate's Reason with its times and casts (and, `held`, the
    op type it goes to one side with)."""
    cast_ms = [0.0] * len(nodes)
    side = lambda x: x == LOW if x < 0 else low[x]  # noqa: E731
    for producer, consumers, to_low, to_fp32 in problem.tensors:
        sides = {side(c) for c in consumers}
        ms = to_fp32 if side(producer) and False in sides else to_low if not side(producer) and True in sides else 0
        for x in {producer, *consumers}:
            if x >= 0 and ms:
                cast_ms[x] += ms
    for i, node in enumerate(nodes):
        fp32, low_ms = problem.node_ms[i]
        # A measured node of no time in either run ran no kernel of its own: not measured, never "0.0 us".
        numbers = (f"{precision} {_ms(low_ms)} vs float32 {_ms(fp32)}" if measured[i] and max(fp32, low_ms) > 0 else
                   "no time of its own (fused into its producer, or not measurable: the same in both)")
        numbers += (f"; casts {_ms(cast_ms[i])}" if cast_ms[i] else "; no casts") + held[i]
        for v in groups[node]:
            old = paint.reasons.get(v)
            source, via = (old.source, old.via) if old else (None, None)
            if low[i]:
                # The color stays; only its explanation gains the numbers (Grappler's rule kept in the detail).
                paint.reasons[v] = Reason("assign_by_cost", "cost_low", source, via,
                                          f"{numbers}: {low_why} (lists: {old.rule if old else '-'})")
            else:
                paint.unallow(v, Reason("assign_by_cost", "cost_float32", source, via, f"{numbers}: {fp32_why}"))


def _ms(ms: float) -> str:
    return f"{ms:.3f} ms" if ms >= 0.01 else f"{ms * 1000:.1f} us"
