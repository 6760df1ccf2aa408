"""Property tests: random graphs of real TF ops (tests/random_graphs.py), rewritten for float16 and bfloat16 with
device="cpu" and device="any", must satisfy the pass's invariants:

- the rewrite never raises (not even an MpRewriteError: every drawn graph is valid);
- the input GraphDef is untouched, and two rewrites give byte-identical GraphDefs (and the same casts);
- every data edge of the output graph (function bodies too) joins ports of the same dtype;
- a Cast sits exactly on the edges whose ends differ in low precision (allow vs. not), one per (src, port), and
  nothing else changes: only low-precision type attrs are retyped, no other attr, input or control input moves;
- fetched nodes keep their NodeDefs' attrs and output dtypes, and are never low precision;
- every allow-list node that is not fetched is low precision; no deny-list node and no node of no list is;
- the result imports and runs in TF with the same fetches; the outputs have the float32 graph's dtypes and
  shapes, and values agree within a low-precision tolerance (scaled by the magnitude of the values upstream)
  wherever the float32 graph's values are finite and moderate;
- (differential, device="cpu") TF 2.21's own pass retypes exactly the same attrs and adds as many Casts;
- a fresh process with another PYTHONHASHSEED produces the same bytes.

Each drawn graph is checked under all four configurations; a failure message names the configuration and the
property. Hypothesis prints the falsifying GraphSpec; `build_graph(spec)` rebuilds that exact graph.
"""

from __future__ import annotations


import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry

import mp_rewrite
from test_differential import type_attrs
from mp_rewrite.core import dtypes
from mp_rewrite.analysis.execution import ExecutionError, run_graph_def
from mp_rewrite.core.functions import function_to_graph
from mp_rewrite.core.op_support import Signatures
from random_graphs import BuiltGraph, GraphSpec, Step, build_graph, graph_specs

CONFIGS = (("float16", "cpu"), ("float16", "any"), ("bfloat16", "cpu"), ("bfloat16", "any"))
# |low - float32| <= RTOL * max(1, largest |float32| value upstream of the output).
# Measured on 2,000 drawn graphs: at most 1.6e-3 (float16) and 1.2e-2 (bfloat16).
RTOL = {"float16": 1e-2, "bfloat16": 6e-2}
# Values are compared only when every float32 pool tensor is finite and below this, and every Log input is
# at least LOG_FLOOR (a half Softmax/Sigmoid may underflow to 0 where float32 has 1e-9; Log then gives -inf).
MODERATE = 1e3
LOG_FLOOR = 1e-2

PROPERTY_SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- ports and dtypes from the OpDefs (independent of mp_rewrite's GraphView) ----------------------------------

def _attr_type(node, op_def, attr_name):
    if attr_name in node.attr:
        return node.attr[attr_name]
    return next(a.default_value for a in op_def.attr if a.name == attr_name)


def port_types(node, outputs: bool) -> list[tuple[int, str]]:
    """(dtype, type attr key) per input or output port of a NodeDef, keys named as in result.coloring."""
    op_def = op_def_registry.get(node.op)
    assert op_def is not None, f"no OpDef for {node.op}"
    ports = []
    for arg in op_def.output_arg if outputs else op_def.input_arg:
        if arg.type_list_attr:
            types = _attr_type(node, op_def, arg.type_list_attr).list.type
            ports += [(t, f"{arg.type_list_attr}[{i}]") for i, t in enumerate(types)]
            continue
        if arg.type_attr:
            port = (_attr_type(node, op_def, arg.type_attr).type, arg.type_attr)
        else:
            port = (arg.type, "fixed:" + dtypes.name(arg.type))
        ports += [port] * (_attr_type(node, op_def, arg.number_attr).i if arg.number_attr else 1)
    return ports


def parse_input(text: str) -> tuple[str, int]:
    name, _, port = text.partition(":")
    return name, int(port or 0)


def data_inputs(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def edge_dtype_mismatches(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Every data edge src:port -> dst:i whose output dtype differs from the input dtype dst expects."""
    nodes = {n.name: n for n in graph_def.node}
    outputs = {name: port_types(n, outputs=True) for name, n in nodes.items()}
    bad = []
    for node in graph_def.node:
        expected = port_types(node, outputs=False)
        for i, text in enumerate(data_inputs(node)):
            src, port = parse_input(text)
            got = outputs[src][port][0]
            if got != expected[i][0]:
                bad.append(f"{text} ({dtypes.name(got)}) -> {node.name}:{i} (expects {dtypes.name(expected[i][0])})")
    return bad


def is_low(coloring, node: str, key: str) -> bool:
    decision = coloring[node, key]
    return decision.color == "allow" and decision.dtype_before == "float"


# --- the structural properties of one rewrite -----------------------------------------------------------------

# Grappler upgrades the batch norms it processes so that scale/offset/mean/variance keep float32 through attr U.
UPGRADES = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}


def as_seen_by_the_pass(node, new, where):
    """The original NodeDef, with Grappler's FusedBatchNorm -> V2 upgrade (U = float) applied if the output has it."""
    if new.op == node.op:
        return node
    assert UPGRADES.get(node.op) == new.op, f"{where}: {node.name} changed op {node.op} -> {new.op}"
    seen = type(node)()
    seen.CopyFrom(node)
    seen.op = new.op
    seen.attr["U"].type = dtypes.FLOAT
    return seen


def check_casts_exactly_at_boundaries(original: graph_pb2.GraphDef, result, target: int, where: str) -> None:
    """Casts sit exactly on the edges whose ends differ in low precision, one per boundary (src, port); every
    original node keeps its op, device, control inputs and non-boundary inputs; only low attrs are retyped."""
    out_nodes = {n.name: n for n in result.graph_def.node}
    orig_nodes = {n.name: n for n in original.node}
    casts = {c.name: c for c in result.casts}
    assert len(casts) == len(result.casts), f"{where}: two CastRecords share a name"
    added = set(out_nodes) - set(orig_nodes)
    assert set(orig_nodes) <= set(out_nodes), f"{where}: nodes lost: {sorted(set(orig_nodes) - set(out_nodes))}"
    assert added == set(casts), f"{where}: added nodes {sorted(added)} != cast records {sorted(casts)}"
    orig_nodes = {name: as_seen_by_the_pass(node, out_nodes[name], where) for name, node in orig_nodes.items()}
    out_ports = {name: port_types(n, outputs=True) for name, n in orig_nodes.items()}
    boundary_ports, boundary_edges = set(), set()
    for node in orig_nodes.values():
        new = out_nodes[node.name]
        assert (new.op, new.device) == (node.op, node.device), f"{where}: {node.name} changed op or device"
        assert [i for i in new.input if i.startswith("^")] == [i for i in node.input if i.startswith("^")], \
            f"{where}: control inputs of {node.name} changed"
        in_ports = port_types(node, outputs=False)
        new_inputs = data_inputs(new)
        assert len(new_inputs) == len(data_inputs(node)), f"{where}: {node.name} changed its input count"
        for i, text in enumerate(data_inputs(node)):
            src, port = parse_input(text)
            src_low = is_low(result.coloring, src, out_ports[src][port][1])
            dst_low = is_low(result.coloring, node.name, in_ports[i][1])
            if src_low == dst_low:
                assert parse_input(new_inputs[i]) == (src, port), \
                    f"{where}: edge {text} -> {node.name}:{i} joins two {'low' if src_low else 'float32'} ends " \
                    f"but was rewired to {new_inputs[i]}"
                continue
            boundary_ports.add((src, port))
            boundary_edges.add((src, port, node.name, i))
            cast = casts.get(parse_input(new_inputs[i])[0])
            assert cast is not None, \
                f"{where}: edge {text} -> {node.name}:{i} goes from {'low' if src_low else 'float32'} to " \
                f"{'low' if dst_low else 'float32'} with no Cast (input is {new_inputs[i]})"
            assert (cast.src, cast.src_port) == (src, port), f"{where}: {cast.name} casts the wrong tensor"
            want = (dtypes.name(target), "float") if src_low else ("float", dtypes.name(target))
            assert (cast.from_dtype, cast.to_dtype) == want, f"{where}: {cast.name} casts {cast.from_dtype} -> " \
                                                             f"{cast.to_dtype}, expected {want[0]} -> {want[1]}"
    recorded = {(c.src, c.src_port, dst, i) for c in result.casts for dst, i in c.consumers}
    assert recorded == boundary_edges, \
        f"{where}: cast consumers {sorted(recorded - boundary_edges)} are not boundary edges, or boundary edges " \
        f"{sorted(boundary_edges - recorded)} have no cast"
    assert len(result.casts) == len(boundary_ports), \
        f"{where}: {len(result.casts)} casts for {len(boundary_ports)} boundary output ports"
    for cast in result.casts:
        node = out_nodes[cast.name]
        assert node.op == "Cast" and list(node.input) == [f"{cast.src}:{cast.src_port}"], f"{where}: {cast.name}"
        assert dtypes.name(node.attr["SrcT"].type) == cast.from_dtype, f"{where}: {cast.name} SrcT"
        assert dtypes.name(node.attr["DstT"].type) == cast.to_dtype, f"{where}: {cast.name} DstT"
        assert node.device == orig_nodes[cast.src].device, f"{where}: {cast.name} is not on its source's device"
    check_retyped_attrs(orig_nodes, out_nodes, result, target, where)


def check_retyped_attrs(orig_nodes, out_nodes, result, target, where) -> None:
    """Exactly the low-precision type attrs changed (to the target dtype); every other attr is as it was."""
    for name, node in orig_nodes.items():
        new = out_nodes[name]
        assert set(new.attr) == set(node.attr), f"{where}: {name} gained or lost attrs"
        for attr, value in node.attr.items():
            if value.HasField("type") or (value.HasField("list") and len(value.list.type)):
                single = value.HasField("type")
                types = [value.type] if single else list(value.list.type)
                keys = [attr] if single else [f"{attr}[{i}]" for i in range(len(types))]
                want = [target if (name, k) in result.coloring and is_low(result.coloring, name, k) else t
                        for k, t in zip(keys, types)]
                got = [new.attr[attr].type] if single else list(new.attr[attr].list.type)
                assert got == want, f"{where}: {name}.{attr} is {[dtypes.name(t) for t in got]}, expected " \
                                    f"{[dtypes.name(t) for t in want]} from the coloring"
            else:
                assert new.attr[attr] == value, f"{where}: {name}.{attr} changed"
        for _, key in port_types(node, False) + port_types(node, True):
            if key.startswith("fixed:"):
                assert not is_low(result.coloring, name, key), f"{where}: fixed-dtype port {name} {key} is 'low'"


def check_list_semantics(original, result, fetches, where) -> None:
    """Every node is processed here (unplaced or on the CPU), so: each allow-list node that is not fetched is low
    precision; no deny-list node and no node of no list is (except a Cast's DstT whose consumers are all low)."""
    fetched = {parse_input(f)[0] for f in fetches}
    for node in original.node:
        decisions = [d for d in result.coloring.for_node(node.name) if d.dtype_before == "float"]
        low = [d.attr for d in decisions if d.converted]
        category = decisions[0].category if decisions else None
        if category == "allow" and node.name not in fetched:
            assert all(d.converted for d in decisions if not d.attr.startswith("fixed:")), \
                f"{where}: allow-list node {node.name} ({node.op}) kept float32 attrs: " \
                f"{[(d.attr, d.reason) for d in decisions if not d.converted]}"
        elif category == "deny" or (category is None and node.op != "Cast"):
            assert not low, f"{where}: {category or 'no-list'} node {node.name} ({node.op}) is low in {low}"
        elif node.op == "Cast":
            assert set(low) <= {"DstT"}, f"{where}: Cast {node.name} is low in {low}"


def check_fetches_preserved(original, result, fetches, where) -> None:
    orig_nodes = {n.name: n for n in original.node}
    out_nodes = {n.name: n for n in result.graph_def.node}
    for fetch in fetches:
        name = parse_input(fetch)[0]
        assert dict(out_nodes[name].attr) == dict(orig_nodes[name].attr), f"{where}: fetched {name} was retyped"
        assert port_types(out_nodes[name], True) == port_types(orig_nodes[name], True), where
        low = [d.attr for d in result.coloring.for_node(name) if d.color == "allow" and d.converted]
        assert not low, f"{where}: fetched node {name} is low precision in the coloring ({low})"


def check_rewrite(original: graph_pb2.GraphDef, fetches, precision: str, device: str):
    """Rewrite and check every property that needs no TF runtime; return the result."""
    where = f"[{precision}, device={device}]"
    before = original.SerializeToString(deterministic=True)
    try:
        result = mp_rewrite.rewrite_graph_def(original, precision, list(fetches), device=device)
    except Exception as error:  # noqa: BLE001 -- any exception on a valid graph is a failure, MpRewriteError too
        pytest.fail(f"{where} rewrite raised {type(error).__name__}: {error}")
    assert original.SerializeToString(deterministic=True) == before, f"{where}: the input GraphDef was modified"
    again = mp_rewrite.rewrite_graph_def(original, precision, list(fetches), device=device)
    assert again.graph_def.SerializeToString() == result.graph_def.SerializeToString(), \
        f"{where}: two rewrites of the same graph differ"
    assert again.casts == result.casts, f"{where}: two rewrites inserted different casts"
    target = dtypes.PRECISIONS[precision]
    mismatches = edge_dtype_mismatches(result.graph_def)
    assert not mismatches, f"{where}: edges join different dtypes: {mismatches}"
    check_casts_exactly_at_boundaries(original, result, target, where)
    check_fetches_preserved(original, result, fetches, where)
    check_list_semantics(original, result, fetches, where)
    signatures = Signatures(original.library)
    functions = {f.signature.name: f for f in original.library.function}
    new_functions = {f.signature.name: f for f in result.graph_def.library.function}
    assert set(new_functions) == set(functions), f"{where}: the function library changed its names"
    for name, body_result in result.functions.items():
        fwhere = f"{where} function {name}"
        assert new_functions[name].signature == functions[name].signature, f"{fwhere}: signature changed"
        body = function_to_graph(functions[name], signatures)
        check_list_semantics(body.graph_def, body_result, body.retvals, fwhere)
        mismatches = edge_dtype_mismatches(function_to_graph(new_functions[name], signatures).graph_def)
        assert not mismatches, f"{fwhere}: edges join different dtypes: {mismatches}"
        check_casts_exactly_at_boundaries(body.graph_def, body_result, target, fwhere)
    return result


# --- running ----------------------------------------------------------------------------------------------------

def reference_run(built: BuiltGraph) -> list[np.ndarray]:
    """The float32 graph's value of every pool tensor."""
    try:
        return run_graph_def(built.graph_def, built.feeds, list(built.tensors))
    except ExecutionError as error:
        pytest.fail(f"the float32 graph itself does not run (a generator or TF problem, not the rewrite): {error}")


def values_comparable(built: BuiltGraph, reference) -> bool:
    if not all(np.all(np.isfinite(v)) and np.max(np.abs(v)) <= MODERATE for v in reference):
        return False
    return all(np.min(reference[i]) >= LOG_FLOOR for i in built.log_inputs)


def check_imports(graph_def: graph_pb2.GraphDef, where: str) -> None:
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf.errors.OpError) as error:
            pytest.fail(f"{where} the rewritten graph does not import into a fresh tf.Graph: {error}")


def check_runs_like_float32(built: BuiltGraph, reference, result, precision: str, device: str) -> None:
    where = f"[{precision}, device={device}]"
    check_imports(result.graph_def, where)
    try:
        outputs = run_graph_def(result.graph_def, built.feeds, list(built.fetch_tensors))
    except ExecutionError as error:
        pytest.fail(f"{where} the rewritten graph does not run: {error}")
    comparable = values_comparable(built, reference)
    for index, tensor, got in zip(built.fetch_indices, built.fetch_tensors, outputs):
        want = reference[index]
        assert got.dtype == want.dtype, f"{where}: fetch {tensor} is {got.dtype}, the float32 graph gives {want.dtype}"
        assert got.shape == want.shape, f"{where}: fetch {tensor} has shape {got.shape}, expected {want.shape}"
        entry = built.entries[index]
        if not comparable or entry.tainted:
            continue
        scale = max([1.0] + [float(np.max(np.abs(reference[i]))) for i in entry.ancestors | {index}])
        error = float(np.max(np.abs(got.astype(np.float64) - want)))
        assert error <= RTOL[precision] * scale, \
            f"{where}: fetch {tensor} differs from float32 by {error:.3g} (> {RTOL[precision]} * scale {scale:.3g})"


def check_all_configs(built: BuiltGraph) -> None:
    reference = reference_run(built)
    for precision, device in CONFIGS:
        result = check_rewrite(built.graph_def, built.fetches, precision, device)
        check_runs_like_float32(built, reference, result, precision, device)


# --- the properties ---------------------------------------------------------------------------------------------

@settings(max_examples=150, **PROPERTY_SETTINGS)
@given(spec=graph_specs())
def test_random_graphs_rewrite_correctly(spec):
    check_all_configs(build_graph(spec))


@settings(max_examples=50, **PROPERTY_SETTINGS)
@given(spec=graph_specs(max_steps=6, must_include="While"))
def test_random_graphs_with_a_while_loop_rewrite_correctly(spec):
    check_all_configs(build_graph(spec))


@settings(max_examples=30, **PROPERTY_SETTINGS)
@given(spec=graph_specs(max_steps=6, must_include="Cond"))
def test_random_graphs_with_a_conditional_rewrite_correctly(spec):
    check_all_configs(build_graph(spec))


@pytest.fixture(scope="module")
def grappler_cluster():
    from tensorflow.python.grappler import cluster as gcluster
    cluster = gcluster.Cluster()
    yield cluster
    cluster.Shutdown()


def dtype_differences(ours, theirs, original) -> dict:
    names = {n.name for n in original}
    a, b = type_attrs(ours, names), type_attrs(theirs, names)
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


@settings(max_examples=150, **PROPERTY_SETTINGS)
@given(spec=graph_specs())
def test_random_graphs_get_the_same_dtypes_and_casts_as_tensorflows_own_pass(grappler_cluster, spec):
    """Differential, device="cpu": TF 2.21's pass (mp_rewrite.testing.oracle) retypes the same attrs of the same nodes,
    in the graph and in every function body it keeps, and adds as many Casts. Intended differences (the three
    TF bugs tested at the end of this file: functional control flow retyped against its bodies, an infer op
    without a low-precision kernel, a fetched Cast retyped) only ever keep more in float32 than TF does, so any
    difference must be float32 on our side, on a graph that has one of those triggers."""
    from mp_rewrite.testing.oracle import grappler_rewrite
    built = build_graph(spec)
    for precision in ("float16", "bfloat16"):
        ours = mp_rewrite.rewrite_graph_def(built.graph_def, precision, list(built.fetches), device="cpu")
        theirs = grappler_rewrite(built.graph_def, list(built.fetches), precision, cluster=grappler_cluster)
        pairs = [(ours.graph_def.node, theirs.node, built.graph_def.node, "graph")]
        ours_functions = {f.signature.name: f for f in ours.graph_def.library.function}
        originals = {f.signature.name: f for f in built.graph_def.library.function}
        pairs += [(ours_functions[f.signature.name].node_def, f.node_def, originals[f.signature.name].node_def,
                   f"function {f.signature.name}") for f in theirs.library.function]
        intended_possible = has_intended_difference_trigger(built.graph_def, built.fetches)
        for ours_nodes, tf_nodes, original_nodes, where in pairs:
            diffs = dtype_differences(ours_nodes, tf_nodes, original_nodes)
            if diffs and intended_possible:
                wrong = {k: v for k, v in diffs.items() if v[0] not in (1, (1,)) and not _float32_list(v[0])}
                assert not wrong, f"[{precision}] {where}: we are lower than TF (not intended): {wrong}"
                continue
            assert not diffs, f"[{precision}] {where}: (node, attr): (ours, TF) differ: {diffs}"
            added = [len([n for n in nodes if n.op == "Cast" and n.name.endswith("-AutoMixedPrecision")])
                     for nodes in (ours_nodes, tf_nodes)]
            assert added[0] == added[1], f"[{precision}] {where}: {added[0]} casts added, TF adds {added[1]}"


INFER_OPS_WITHOUT_CPU_HALF_KERNELS = {"AvgPool3D", "AvgPool3DGrad"}


def has_intended_difference_trigger(graph_def, fetches) -> bool:
    """True if the graph has functional control flow, an infer op that may lack a low-precision CPU kernel, or a
    fetched Cast: the places where mp_rewrite deliberately keeps more in float32 than TF 2.21."""
    ops = {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}
    fetched = {f.split(":")[0] for f in fetches}
    fetched_cast = any(n.op == "Cast" and n.name in fetched for n in graph_def.node)
    return bool(ops & {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"}
                or ops & INFER_OPS_WITHOUT_CPU_HALF_KERNELS or fetched_cast)


def _float32_list(value) -> bool:
    return isinstance(value, tuple) and all(t not in (19, 14) for t in value)


# Two hand-picked graphs that hold every kind of step (both loop and conditional flavours, multi-output nodes).
DETERMINISM_SPECS = (
    GraphSpec(steps=(Step("MatMul", (0, 2), (False, False)), Step("BiasAdd", (4, 3), (0,)), Step("Exp", (5,)),
                     Step("IdentityN", (5, 6), (2,)), Step("ConcatV2", (7, 8, 4), (3, 1, 2)),
                     Step("Select", (9, 4, 7, 8), (True,), control=(6,)), Step("Conv2D", (10,), (3,), cpu=True),
                     Step("Softmax", (11,)), Step("Log", (12,)), Step("Sum", (13,)),
                     Step("MatMul", (11, 14), (False, False)), Step("SizeScale", (15,)), Step("IntRoundTrip", (4,)),
                     Step("Reshape", (17, 10), (True,)), Step("SoftmaxCrossEntropyWithLogits", (18, 12))),
              fetches=(8, 16, 19, 20), seed=7),
    GraphSpec(steps=(Step("MatMul", (0, 2), (False, True)), Step("While", (4, 2), (False, 2, ("matmul", "tanh"))),
                     Step("Cond", (5, 4), (False, "matmul", "relu")), Step("Cond", (6, 2), (True, "sigmoid", "matmul")),
                     Step("While", (7, 4), (True, 3, ("add", "matmul"))), Step("FusedBatchNorm", (8,), (1, False)),
                     Step("Pool", (9,), ("AvgPool", 2)), Step("Einsum", (10, 4), ("ij,jk->ik",)),
                     Step("AddN", (11, 5, 9), (3,))),
              fetches=(5, 12), seed=3, fetch_by_node_name=True),
)

_DIGESTS_SCRIPT = """
import hashlib, json, sys
import mp_rewrite
from tensorflow.core.framework import graph_pb2
jobs = json.load(open(sys.argv[1]))
digests = []
for path, fetches, precision, device in jobs:
    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(open(path, "rb").read())
    result = mp_rewrite.rewrite_graph_def(graph_def, precision, fetches, device=device)
    digests.append(hashlib.sha256(result.graph_def.SerializeToString(deterministic=True)).hexdigest())
print(json.dumps(digests))
"""


def test_determinism_specs_exercise_every_step_kind():
    kinds = {step.op for spec in DETERMINISM_SPECS for step in spec.steps}
    assert kinds >= {"MatMul", "While", "Cond", "IdentityN", "Select", "SoftmaxCrossEntropyWithLogits"}
    for spec in DETERMINISM_SPECS:
        check_all_configs(build_graph(spec))


def test_rewrite_is_byte_identical_across_processes_with_different_hash_seeds(tmp_path):
    """Set iteration order of strings changes with PYTHONHASHSEED; the output must not. A fresh process with
    another hash seed rewrites the same GraphDefs. Compared in protobuf's deterministic serialization: the plain
    one orders map fields (NodeDef.attr) by a per-process hash seed of upb, so it differs between processes even
    for the same message (checked: same PYTHONHASHSEED, same graph, different bytes)."""
    import hashlib
    import json
    import os
    import subprocess
    import sys
    jobs, expected = [], []
    for i, spec in enumerate(DETERMINISM_SPECS):
        built = build_graph(spec)
        path = tmp_path / f"graph{i}.pb"
        path.write_bytes(built.graph_def.SerializeToString())
        for precision, device in CONFIGS:
            jobs.append((str(path), list(built.fetches), precision, device))
            result = mp_rewrite.rewrite_graph_def(built.graph_def, precision, list(built.fetches), device=device)
            expected.append(hashlib.sha256(result.graph_def.SerializeToString(deterministic=True)).hexdigest())
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    seed = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"
    env = dict(os.environ, PYTHONHASHSEED=seed, TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-c", _DIGESTS_SCRIPT, str(tmp_path / "jobs.json")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    differ = [job[2:] + (job[0],) for job, a, b in zip(jobs, expected, got) if a != b]
    assert not differ, f"the rewrite's output depends on PYTHONHASHSEED for (precision, device, graph): {differ}"


# --- bugs the properties found (smallest examples) ---------------------------------------------------------------

def test_bfloat16_functional_while_after_an_allow_op_runs():
    """Found by the properties: bfloat16's clear list has While/StatelessWhile, so TF 2.21 retypes a functional
    While's T[i] while its cond/body keep float32 arguments, and the graph cannot run. Ours keeps it float32."""
    spec = GraphSpec(steps=(Step("MatMul", (0, 0), (False, False)), Step("While", (4, 0), (True, 1, ("identity",)))),
                     fetches=(5,))
    built = build_graph(spec)   # x -> MatMul s0 -> StatelessWhile s1 (v2, body Identity) -> s1/Identity_3 (fetched)
    result = check_rewrite(built.graph_def, built.fetches, "bfloat16", "cpu")
    assert not [d.attr for d in result.coloring.for_node("s1") if d.converted]
    assert result.coloring["s1", "T[3]"].reason.rule == "function_boundary"
    run_graph_def(result.graph_def, built.feeds, list(built.fetch_tensors))


def test_float16_cpu_infer_op_without_a_half_cpu_kernel_after_an_allow_op_runs():
    """Found by the properties: TF 2.21's pass 4 checks only the OpDef, so a float16 AvgPool3D after a Conv3D
    becomes half on CPU, where no half AvgPool3D kernel exists. Ours checks the kernel too."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 4, 4, 4, 1], name="x")
        conv = tf.raw_ops.Conv3D(input=x, filter=tf.constant(np.full((1, 1, 1, 1, 1), 0.5, np.float32)),
                                 strides=[1] * 5, padding="SAME", name="conv")
        pool = tf.raw_ops.AvgPool3D(input=conv, ksize=[1, 2, 2, 2, 1], strides=[1] * 5, padding="SAME",
                                    name="pool")
        tf.raw_ops.Identity(input=pool, name="fetch")
    result = check_rewrite(graph.as_graph_def(), ["fetch"], "float16", "cpu")
    assert not result.coloring["pool", "T"].converted
    assert result.coloring["pool", "T"].reason.rule == "no_low_precision_kernel"
    run_graph_def(result.graph_def, {"x": np.ones((1, 4, 4, 4, 1), np.float32)}, ["fetch"])


def test_fetched_cast_that_feeds_only_allow_ops_keeps_float32():
    """Found by the properties: TF 2.21's make-casts-allow step ignores preservation, so a fetched Cast whose
    consumers are all low precision starts returning float16. Ours leaves preserved Casts alone."""
    graph = tf.Graph()
    with graph.as_default():
        ints = tf.compat.v1.placeholder(tf.int32, [8, 8], name="ints")
        cast = tf.raw_ops.Cast(x=ints, DstT=tf.float32, name="cast")  # fetched
        matmul = tf.raw_ops.MatMul(a=cast, b=cast, name="matmul")
        tf.raw_ops.Identity(input=matmul, name="out")
    result = mp_rewrite.rewrite_graph_def(graph.as_graph_def(), "float16", ["cast", "out"], device="cpu")
    outputs = run_graph_def(result.graph_def, {"ints": np.ones((8, 8), np.int32)}, ["cast", "out"])
    assert [o.dtype for o in outputs] == [np.float32, np.float32]
