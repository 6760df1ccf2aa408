"""The accuracy guard's attribution: which low-precision units the output error comes from, in one run.

The side-by-side graph holds the float32 graph, the mixed graph beside it (sharing inputs and weights), and per unit
a variant where only that unit computes in low precision: it reads the float32 graph's values through Casts (or,
where it reads its own effect back, as a residual Add does, the variant's copies) and feeds float32 copies of
everything downstream of it. One execution thus gives the mixed graph's outputs and region
boundaries (its Cast-to-float32 tensors against the same float32 tensors), and for each unit the error it alone adds
to the outputs and at its own output boundary. Function bodies, which the copies cannot see into, are measured
whole, one run each.
"""

from __future__ import annotations

import dataclasses
import math

from tensorflow.core.framework import graph_pb2, node_def_pb2

from ..core.graph_view import parse_input
from .screen import LOW_DTYPES, GraphInfo, Unit, by_region, converted_units, node_of
from .search import Checker, OutputError, output_error, relative_error
from ..core.body import RewriteResult


@dataclasses.dataclass
class SideBySide:
    """The attribution graph and what to fetch from it.

    Attributes:
        graph_def: float32 graph + mixed copy + one variant per unit.
        fetches: every tensor to fetch; the index lists below point into it.
        outputs: the reference outputs; mixed: the mixed copy's outputs (or None when not included).
        boundaries: (mixed Cast-to-float32 tensor, reference tensor) pairs of the mixed copy.
        units: per unit, its outputs (the reference's where the unit cannot reach them) and its boundary pairs.
    """

    graph_def: graph_pb2.GraphDef
    fetches: list
    outputs: list
    mixed: list | None
    boundaries: list
    units: list


def descendants(info: GraphInfo, roots) -> set:
    """Nodes reachable from `roots` over data edges, roots excluded."""
    roots = set(roots)
    seen, stack = set(), [c for r in roots for c in info.readers(r)]
    while stack:
        name = stack.pop()
        if name not in seen and name not in roots:
            seen.add(name)
            stack.extend(info.readers(name))
    return seen


def side_by_side_size(ref: GraphInfo, units) -> int:
    """How many nodes the variants of `units` add to the attribution graph."""
    return sum(len(u.nodes) + len(descendants(ref, u.nodes)) for u in units)


class _Builder:
    def __init__(self, ref_gd, ref: GraphInfo, mixed_gd, mixed: GraphInfo, casts):
        self.out = graph_pb2.GraphDef()
        self.out.CopyFrom(ref_gd)
        self.ref, self.mixed = ref, mixed
        self.gdefs = {n.name: n for n in ref_gd.node}
        self.mdefs = {n.name: n for n in mixed_gd.node}
        self.cast_src = {c.name: (c.src, c.src_port) for c in casts}
        base, n = "mp_guard", 0
        while any(name == base or name.startswith(base + "/") for name in self.gdefs):
            n += 1
            base = f"mp_guard_{n}"
        self.base, self.casts = base, 0

    def copy(self, nd, prefix: str, data, control) -> None:
        new = self.out.node.add()
        new.CopyFrom(nd)
        new.name = prefix + nd.name
        del new.input[:]
        for text in nd.input:
            if text.startswith("^"):
                mapped = control(text[1:])
                if mapped is not None:
                    new.input.append("^" + mapped)
            else:
                new.input.append(data(*parse_input(text)))

    def cast(self, tensor: str, src_dtype: int, dst_dtype: int, prefix: str) -> str:
        node = node_def_pb2.NodeDef(name=f"{prefix}cast_{self.casts}", op="Cast", input=[tensor])
        node.attr["SrcT"].type, node.attr["DstT"].type = src_dtype, dst_dtype
        node.attr["Truncate"].b = False
        self.casts += 1
        self.out.node.append(node)
        return node.name + ":0"

    def add_mixed(self, mixed_gd, outputs, casts):
        prefix = f"{self.base}/mixed/"
        shared = {name for name, nd in self.mdefs.items()
                  if not nd.input and name in self.gdefs and self.gdefs[name] == nd}
        for nd in mixed_gd.node:
            if nd.name not in shared:
                self.copy(nd, prefix, lambda s, p: f"{s if s in shared else prefix + s}:{p}",
                          lambda s: s if s in shared else prefix + s)
        mixed = [t if node_of(t) in shared else prefix + t for t in outputs]
        boundaries = [(f"{prefix}{c.name}:0", f"{c.src}:{c.src_port}") for c in casts if not c.to_low]
        return mixed, boundaries

    def add_variant(self, index: int, unit: Unit, outputs):
        prefix = f"{self.base}/u{index}/"
        inside = set(unit.nodes)
        below = descendants(self.ref, inside)
        copied = inside | below
        ref, mixed = self.ref, self.mixed

        def unit_input(src, port):  # the float32 value, in the dtype the mixed graph feeds the unit
            if src in inside:
                return f"{prefix}{src}:{port}"
            g_src, g_port = (src, port) if src in self.gdefs else self.cast_src[src]
            have, want = ref.dtypes[g_src][g_port], mixed.dtypes[src][port]
            # A unit can read its own effect back (a residual Add reading the attention that read the unit).
            tensor = f"{prefix if g_src in below else ''}{g_src}:{g_port}"
            return tensor if have == want else self.cast(tensor, have, want, prefix)

        def below_input(src, port):  # float32 copies downstream read the unit's output cast back
            if src in below:
                return f"{prefix}{src}:{port}"
            if src not in inside:
                return f"{src}:{port}"
            have, want = mixed.dtypes[src][port], ref.dtypes[src][port]
            tensor = f"{prefix}{src}:{port}"
            return tensor if have == want else self.cast(tensor, have, want, prefix)

        for name in unit.nodes:
            self.copy(self.mdefs[name], prefix, unit_input,
                      lambda s: prefix + s if s in inside else (s if s in self.gdefs else None))
        for name in ref.names:
            if name in below:
                self.copy(self.gdefs[name], prefix, below_input, lambda s: prefix + s if s in copied else s)
        reached = [prefix + t if node_of(t) in copied else t for t in outputs]
        boundaries = [(f"{prefix}{name}:{port}", f"{name}:{port}") for name in unit.nodes
                      for port, dtype in enumerate(mixed.dtypes[name])
                      if dtype in LOW_DTYPES and any(c not in inside for c in mixed.consumers.get((name, port), ()))]
        return reached, boundaries


def side_by_side(ref_gd, ref: GraphInfo, mixed_gd, mixed: GraphInfo, casts, units, outputs,
                 include_mixed: bool) -> SideBySide:
    """Build the attribution graph (see the module docstring).

    Args:
        ref_gd, ref: the float32 GraphDef and its GraphInfo; mixed_gd, mixed, casts: the rewrite being attributed.
        units: the Units to isolate; outputs: output tensor names; include_mixed: add the mixed copy too.
    """
    builder = _Builder(ref_gd, ref, mixed_gd, mixed, casts)
    mixed_outputs, boundaries = builder.add_mixed(mixed_gd, outputs, casts) if include_mixed else (None, [])
    per_unit = [builder.add_variant(i, unit, outputs) for i, unit in enumerate(units)]
    fetches = list(dict.fromkeys(list(outputs) + (mixed_outputs or []) + [t for pair in boundaries for t in pair]
                                 + [t for reached, pairs in per_unit for t in reached + [x for p in pairs for x in p]]))
    return SideBySide(builder.out, fetches, list(outputs), mixed_outputs, boundaries, per_unit)


@dataclasses.dataclass(frozen=True)
class UnitError:
    """What the side-by-side run measured for one unit (or region, or function body).

    Attributes:
        unit: the Unit; alone: the outputs' error with only this unit in low precision (None: not measured).
        local: the largest relative error at the unit's own output boundary (exact inputs); where: that tensor.
        share: its part of the summed `alone` errors of the units measured with it (non-finite ones share it all).
    """

    unit: Unit
    alone: OutputError | None
    local: float
    where: str
    share: float | None = None


def with_shares(errors: list) -> list:
    """The UnitErrors with `share` set over the list."""
    ratios = [e.alone.ratio for e in errors]
    infinite = sum(math.isinf(r) for r in ratios)
    total = sum(r for r in ratios if not math.isinf(r))
    if infinite:
        shares = [1.0 / infinite if math.isinf(r) else 0.0 for r in ratios]
    else:
        shares = [r / total if total else 0.0 for r in ratios]
    return [dataclasses.replace(e, share=s) for e, s in zip(errors, shares)]


def measure(sbs: SideBySide, values, units, refs, rtol: float, atol: float):
    """(mixed OutputError or None, [(boundary tensor, relative error)], [UnitError]) from the side-by-side run."""
    got = dict(zip(sbs.fetches, values))
    mixed = None
    if sbs.mixed is not None:
        mixed = output_error(refs, [got[t] for t in sbs.mixed], sbs.outputs, rtol, atol)
    boundaries = [(b, relative_error(got[r], got[b])) for b, r in sbs.boundaries]
    errors = []
    for unit, (reached, pairs) in zip(units, sbs.units):
        alone = output_error(refs, [got[t] for t in reached], sbs.outputs, rtol, atol)
        local = [(relative_error(got[r], got[v]), r) for v, r in pairs]
        worst = max(local, default=(0.0, ""))
        errors.append(UnitError(unit, alone, worst[0], worst[1]))
    return mixed, boundaries, errors


@dataclasses.dataclass
class Attribution:
    """What attribution found for the rewrite keeping the screen's nodes.

    Attributes:
        units: every Unit of that rewrite; measured: UnitErrors of what was isolated (units, or regions).
        boundaries: (mixed Cast-to-float32 tensor, relative error against float32) per region boundary.
        level: "unit", "region" (the unit-by-unit copies would have been too big), or "" (not attributed:
            v1 control flow, or too big even by region).
    """

    units: list
    measured: list
    boundaries: list
    level: str


def isolate(graph_def, ref: GraphInfo, checker: Checker, base: frozenset, candidates, outputs,
            include_mixed: bool = False, noun: str = "units"):
    """One side-by-side run isolating `candidates` in the rewrite keeping `base`: (mixed error, boundaries,
    UnitErrors with shares)."""
    current = checker.result(base)
    mixed = GraphInfo(current.graph_def)
    include_mixed = include_mixed and current.graph_def.library == graph_def.library  # copies share the library
    sbs = side_by_side(graph_def, ref, current.graph_def, mixed, current.casts, candidates, outputs, include_mixed)
    what = f"attribution: side by side, {len(candidates)} {noun} isolated" + (
        ", screen keeps checked" if include_mixed else "")
    # Unoptimized: Grappler would spend 4x the run itself on the copies, and with the remapper off it does not
    # change values (see execution.py), so the copies compute what the graphs they copy compute.
    values = checker.runner(sbs.graph_def, sbs.fetches, what, optimize=False)
    mixed_error, boundaries, measured = measure(sbs, values, candidates, checker.refs, checker.rtol, checker.atol)
    return mixed_error, boundaries, with_shares(measured)


def attribute(graph_def, ref: GraphInfo, checker: Checker, base: frozenset, outputs, max_nodes: int,
              granularity: str = "auto", region_factor: int = 10) -> Attribution:
    """Units of the rewrite keeping `base`, and (one side-by-side run) the error each adds alone; the mixed
    copy's output error is recorded in the checker for `base`.

    Args:
        max_nodes: the most nodes the copies may add; beyond it, regions are isolated instead of units, and
            beyond that nothing is (the search is then blind).
        granularity: "unit", "region" (whole regions, refined to units after the search), or "auto": units
            unless their copies exceed `region_factor` times the graph (each copy costs a partial forward pass)
            and there are at least 4 regions whose copies cost at most half as much.
    """
    current = checker.result(base)
    units = converted_units(GraphInfo(current.graph_def), set(current.converted_nodes), seeds_of(current))
    if ref.has_v1_control_flow():  # tensors inside loop frames cannot be fed to copies of the graph
        return Attribution(units, [], [], "")
    regions = by_region(units)
    size = side_by_side_size(ref, units)
    # Regions pay off when there are several to tell apart (a CNN or a bfloat16 graph is often one region).
    worth = len(regions) >= 4 and 2 * side_by_side_size(ref, regions) <= size
    by_unit = {"unit": size <= max_nodes, "region": False}.get(
        granularity, size <= max_nodes and (size <= region_factor * len(ref.names) or not worth))
    candidates = units if by_unit or len(regions) == len(units) else regions
    if not by_unit and side_by_side_size(ref, candidates) > max_nodes:
        return Attribution(units, [], [], "")
    level = "unit" if candidates is units else "region"
    mixed_error, boundaries, measured = isolate(graph_def, ref, checker, base, candidates, outputs, True, level + "s")
    if mixed_error is not None:
        checker.record(base, mixed_error, "screen")
    return Attribution(units, measured, boundaries, level)


def function_units(result: RewriteResult, most: int = 4) -> list:
    """One Unit per rewritten function body with converted nodes (all of them in one Unit beyond `most`): the
    side-by-side graph cannot isolate inside a body, so each is measured whole."""
    bodies = [Unit(f"function {name}", tuple(sub.converted_nodes), -1)
              for name, sub in sorted(result.functions.items()) if sub.converted_nodes]
    if len(bodies) > most:
        bodies = [Unit("functions", tuple(n for u in bodies for n in u.nodes), -1)]
    return bodies


def measure_alone(checker: Checker, base: frozenset, units, bodies) -> list:
    """UnitErrors of function bodies: one run each with only that body in low precision."""
    everything = base | frozenset(n for u in list(units) + bodies for n in u.nodes)
    return [UnitError(body, checker.error(everything - frozenset(body.nodes), "attribution", force=True),
                      math.nan, "") for body in bodies]


def seeds_of(result: RewriteResult) -> set:
    """Converted nodes painted allow by the seeding stage (allow-list ops, force_low, UNSAFE_FORCE_ALL)."""
    seeds = set()
    for name in result.converted_nodes:
        if any(d.reason.stage == "seed_allowlist" for d in result.coloring.for_node(name)):
            seeds.add(name)
    return seeds


def node_flops(graph_def, nodes) -> dict:
    """node -> matmul/conv FLOPs (0 for other ops or unknown shapes; per example when the batch is unknown)."""
    from ..analysis.flops import FLOP_RULES, flops_by_node, node_shapes
    nodes = set(nodes)
    heavy = [n.name for n in graph_def.node if n.op in FLOP_RULES and n.name in nodes]
    if not heavy:
        return {}
    return {n: v or 0 for n, v in flops_by_node(graph_def, node_shapes(graph_def, needed=heavy)).items() if n in nodes}


def unit_flops(graph_def, units):
    """A function candidate -> matmul/conv FLOPs of its unit (units or regions made of `units`)."""
    per_node = node_flops(graph_def, [n for u in units for n in u.nodes])
    return lambda candidate: sum(per_node.get(n, 0) for n in candidate.unit.nodes)
