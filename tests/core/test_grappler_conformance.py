"""Grappler conformance: every case of TF's ``auto_mixed_precision_test.cc``, against TF itself and against us.

For each case (graphs in ``grappler_cases``, expectations below from research/grappler_amp.md section 3):

(a) ``test_oracle_*``: TensorFlow's own pass (``grappler_cases.grappler_oracle``) produces the expected dtypes and
    cast count on this machine. This proves the Python builders reproduce Grappler's C++ cases.
(b) ``test_ours_*``: ``mp_rewrite.rewrite_graph_def`` produces the same dtypes per node and type attribute, the
    same number of added Casts, named with TF 2.21's scheme
    ``<src>-<port>-CastTo{Fp16,Bf16,Fp32}-<n>-AutoMixedPrecision``; and (``test_ours_equals_oracle_*``), where the
    oracle runs the same mode, the same graph as TF node for node.

Expectations are dicts ``{"allow1": "h", "fbn1.U": "f", "clr1.T[2]": "h", "fbn1.op": "FusedBatchNormV2"}``: a bare
node name means its ``T`` attr (``element_dtype`` for TensorList ops, ``dtype`` for Const/Placeholder/Variable);
``h`` is the target low precision (half, or bfloat16 in the bf16 cases), ``f`` float32, ``b`` bool, ``i`` int32.
All dtypes are read from the output GraphDef's node attrs.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable

import pytest
from tensorflow.core.framework import types_pb2

import grappler_cases as gc
import mp_rewrite
from mp_rewrite.testing.oracle import canonical_cast_names

GPU_AND_CPU = ("gpu", "cpu")
DTYPE_CODES = {"h": None, "f": types_pb2.DT_FLOAT, "b": types_pb2.DT_BOOL, "i": types_pb2.DT_INT32}
TARGET = {"float16": types_pb2.DT_HALF, "bfloat16": types_pb2.DT_BFLOAT16}
CAST_NAME = re.compile(r"^(?P<src>.+)-(?P<port>\d+)-CastTo(?P<kind>Fp16|Bf16|Fp32)-(?P<n>\d+)-AutoMixedPrecision$")
KIND_DTYPE = {"Fp16": types_pb2.DT_HALF, "Bf16": types_pb2.DT_BFLOAT16, "Fp32": types_pb2.DT_FLOAT}


@dataclasses.dataclass(frozen=True)
class Case:
    """One Grappler test case.

    Attributes:
        id: the C++ test's name in snake case (``simple``, ``tensor_list_set_get``, ...).
        build: returns ``(graph_def, fetches)``.
        expected: ``{key: code}`` as described in the module docstring.
        added: the number of nodes the pass adds (all Casts), or None where no count is known.
        oracle: the ``grappler_oracle`` mode that replays the case, or None.
        oracle_skip: why the oracle cannot replay it (when ``oracle`` is None).
        precision: for our pass.
        devices: the ``device=`` values our pass runs the case with.
        level: TF's LEVEL (env for the oracle, ``level=`` for us).
        identical: the output must equal the input apart from dtypes (same nodes, ops and inputs).
        emulated: CPU-emulation checks ``{"fanin_to_fp32": [...], "fanout_to_fp16": [...], "fanout_not_cast": [...]}``.
    """

    id: str
    build: Callable
    expected: dict
    added: int | None
    oracle: str | None = "cpu_f16"
    oracle_skip: str = ""
    precision: str = "float16"
    devices: tuple = GPU_AND_CPU
    level: str | None = None
    identical: bool = False
    emulated: dict | None = None


def _all(codes: str, names: str) -> dict:
    """``_all("f", "deny1 clr1")`` -> ``{"deny1": "f", "clr1": "f"}``."""
    return {name: codes for name in names.split()}


SIMPLE_EXPECTED = {
    "input.dtype": "f", **_all("f", "deny1 clr1 infer1"), **_all("h", "clr2 allow1 clr3"),
    **_all("f", "infer2 clr4 deny2.Ta deny2.Tb clr5"),
}
SET_GET_EXPECTED = {
    **_all("h", "tl1 tl1w1 allow1 tl1w2 tl1r1 infer1 allow2 tl1w3"), **_all("f", "tl2 tl2w1 tl2r1"),
}

CASES = [
    # ---- AutoMixedPrecisionParamTest (CUDA mode; unplaced nodes), replayed by TF's CPU mode with EMULATE_FP16=0.
    Case("no_op", gc.no_op, {"input.dtype": "f", **_all("f", "deny1 clr1 infer1 clr2")}, 0, identical=True),
    Case("already_fp16", gc.already_fp16, {
        "input.dtype": "f", "cst1.DstT": "h", "allow1": "h", "clr1": "h", "cst2.SrcT": "h", "cst2.DstT": "f",
        "clr2": "f"}, 0, identical=True),
    Case("simple", gc.simple, SIMPLE_EXPECTED, 2),
    Case("no_infer_op", gc.no_infer_op, {
        "input.dtype": "f", **_all("f", "deny1 clr1 infer1"), **_all("h", "clr2 allow1 clr3"), "infer2": "f",
        **_all("h", "clr4 allow2"), "infer3": "f"}, 4, level="TREAT_INFER_AS_DENY"),
    Case("bidirectional_clear_chain", gc.bidirectional_clear_chain, {
        "input.dtype": "f", **_all("h", "clr1 clr2 allow1 clr3 clr4"), "clr3.out_type": "i"}, 3),
    Case("preserve_fetches", gc.preserve_fetches, {
        "input.dtype": "f", **_all("f", "allow1 clr1 infer1 deny1 clr2"), "allow2": "h",
        **_all("f", "clr3 deny2 clr4")}, 2),
    Case("preserve_cpu_nodes", gc.preserve_cpu_nodes, {
        "input.dtype": "f", **_all("h", "clr1 allow1 infer1"), **_all("f", "allow2 clr2")}, 2,
        oracle=None, devices=("gpu",),
        oracle_skip="needs a GPU pass with one node on CPU:0; TF's CPU mode puts every node on the CPU and this "
                    "CPU-only build has no GPU kernels for the CUDA pass to check"),
    Case("preserve_identity_after_variable", gc.preserve_identity_after_variable, {
        "input.dtype": "f", "var1.dtype": "f", "clr1": "f", "allow1": "h", "input2.dtype": "f", "clr2": "h",
        "allow2": "h"}, 5),
    Case("fused_batch_norm", gc.fused_batch_norm, {
        "allow1": "h", "fbn1.op": "FusedBatchNormV2", "fbn1.T": "h", "fbn1.U": "f",
        "bng1.op": "FusedBatchNormGradV2", "bng1.T": "h", "bng1.U": "f", "infer1": "h", "allow2": "h"}, 3),
    Case("repeated_and_list_type_attrs", gc.repeated_and_list_type_attrs, {
        "input.dtype": "f", "allow1": "h", "clr1.T[0]": "h", "clr1.T[1]": "h", "clr1.T[2]": "h", "infer1": "h",
        "allow2": "h"}, 2),
    Case("existing_cast", gc.existing_cast, {"cst1.SrcT": "b", "cst1.DstT": "h", "allow1": "h"}, 1),
    Case("recurrent_edge_color_mismatch", gc.recurrent_edge_color_mismatch, {
        **_all("f", "deny1 ent1 mrg1 swt1 infer1"), "allow1": "h", **_all("f", "nxt1 ext1 mrg2")}, 2),
    Case("tensor_list_set_get", gc.tensor_list_set_get, SET_GET_EXPECTED, 2),
    Case("tensor_list_push_pop", gc.tensor_list_push_pop, SET_GET_EXPECTED, 2),
    Case("tensor_list_from_tensor", gc.tensor_list_from_tensor,
         _all("h", "allow1 tl1 tl1r1 infer1 allow2 tl2 tl2w1"), 2),
    Case("tensor_list_push_back_batch_and_concat_lists", gc.tensor_list_push_back_batch_and_concat_lists,
         _all("h", "allow1 allow2 infer1 tl1 tl2 tl3 tl3r1"), 2),
    # The C++ test asserts neither tl1's cluster nor a count; section 3 records both as verified on TF 2.21.
    Case("tensor_list_through_function", gc.tensor_list_through_function, {
        **_all("h", "allow1 allow2 infer1 tl2 tl2w1 tl2r1"), **_all("f", "tl1 tl1w1 tl1r1")}, 4),
    Case("batch_mat_mul", gc.batch_mat_mul, {"input.dtype": "f", "allow1": "h"}, 2),
    # TestSimpleUnaryInferOp asserts no count; +3 (input, eye, allow2 casts) is what TF 2.21 does.
    *[Case(f"{op.lower()}_op", functools.partial(gc.simple_unary_infer_op, op),
           {"input.dtype": "f", **_all("h", "allow1 infer1 allow2")}, 3) for op in gc.UNARY_INFER_OPS],
    # ---- AutoMixedPrecisionCpuTest: TF's CPU mode with its default emulation (float32 compute between casts).
    Case("cpu_simple", gc.cpu_simple, {"allow1": "f", **_all("f", "deny1 clr1 infer1 infer2 clr4 clr5")}, 9,
         oracle="cpu_emulate", devices=("cpu",),
         emulated={"fanin_to_fp32": ["allow1"], "fanout_to_fp16": ["allow1"], "fanout_not_cast": []}),
    Case("cpu_mixed_fanout", gc.cpu_mixed_fanout, _all("f", "allow1 allow2 deny infer"), 10,
         oracle="cpu_emulate", devices=("cpu",),
         emulated={"fanin_to_fp32": ["allow1", "deny"], "fanout_to_fp16": ["allow1"], "fanout_not_cast": ["deny"]}),
    # ---- AutoMixedPrecisionSimulateGpuTest.Simple_SimulatedGpu_CpuScope: a GPU pass leaves CPU-placed nodes alone.
    Case("simple_simulated_gpu_cpu_scope", gc.simple_simulated_gpu_cpu_scope, {
        "input.dtype": "f", **_all("f", "deny1 clr1 infer1 clr2 allow1 clr3 infer2 clr4 deny2.Ta deny2.Tb clr5")},
        0, oracle="cuda_simulated", devices=("gpu",), identical=True),
    # ---- AutoMixedPrecisionMklTest / MklParamTest (BF16): nodes on CPU:0.
    Case("already_bf16", gc.already_bf16, {
        "input.dtype": "f", "cst1.DstT": "h", "allow1": "h", "clr1": "h", "cst2.SrcT": "h", "cst2.DstT": "f",
        "clr2": "f"}, 0, oracle="bf16", precision="bfloat16", devices=("cpu",), identical=True),
    Case("mkl_simple", gc.mkl_simple, {
        "input.dtype": "f", **_all("f", "deny1 clr1 infer1"), **_all("h", "clr2 allow1 clr3"),
        **_all("f", "deny2 clr4 deny3.Ta deny3.Tb clr5")}, 2, oracle="bf16", precision="bfloat16", devices=("cpu",)),
    Case("tensor_list_set_get_bf16", gc.tensor_list_set_get_bf16, SET_GET_EXPECTED, 2, oracle="bf16",
         precision="bfloat16", devices=("cpu",)),
    Case("infer_follow_upstream_allow", gc.infer_follow_upstream_allow, {
        **_all("f", "input1.dtype weight.dtype input2.dtype"), **_all("h", "allow infer clr")}, 4, oracle="bf16",
        precision="bfloat16", devices=("cpu",)),
    Case("infer_follow_upstream_deny", gc.infer_follow_upstream_deny, {
        **_all("f", "input1.dtype input2.dtype input3.dtype deny infer clr")}, 0, oracle="bf16",
        precision="bfloat16", devices=("cpu",)),
    # ---- Python suite: test_propagation_through_simple_loop_1..8 (v1 while loop; no cast count asserted there).
    *[Case(f"propagation_through_simple_loop_{k}", functools.partial(gc.simple_loop, *colors),
           gc.simple_loop_expected(*colors), None) for k, colors in gc.SIMPLE_LOOP_CASES.items()],
]
CASES_BY_ID = {case.id: case for case in CASES}


# ------------------------------------------------------------------------------------------------ helpers


@functools.lru_cache(maxsize=None)
def built(case_id):
    """The case's ``(graph_def, fetches)``, built once (callers must not modify it)."""
    graph_def, fetches = CASES_BY_ID[case_id].build()
    return graph_def, tuple(fetches)


@functools.lru_cache(maxsize=None)
def oracle_output(case_id):
    """TF's own pass on the case, run once."""
    case = CASES_BY_ID[case_id]
    graph_def, fetches = built(case_id)
    return gc.grappler_oracle(graph_def, list(fetches), case.oracle, level=case.level)


def dtype_name(dtype):
    return types_pb2.DataType.Name(dtype) if isinstance(dtype, int) else str(dtype)


def default_attr(node):
    for attr in ("T", "element_dtype", "dtype"):
        if attr in node.attr:
            return attr
    raise KeyError(f"node {node.name!r} ({node.op}) has no T, element_dtype or dtype attr")


def read_key(nodes, key):
    """Resolve an expectation key to ``(node_name, attr_label, value)``; value is a DataType, an op name or None."""
    name, _, attr = key.partition(".")
    node = nodes.get(name)
    if node is None:
        return name, attr or "?", "<node missing>"
    if attr == "op":
        return name, "op", node.op
    attr = attr or default_attr(node)
    match = re.fullmatch(r"(\w+)\[(\d+)\]", attr)
    if match:
        values = node.attr[match[1]].list.type if match[1] in node.attr else []
        index = int(match[2])
        return name, attr, values[index] if index < len(values) else "<no such list element>"
    if attr not in node.attr:
        return name, attr, "<attr missing>"
    return name, attr, node.attr[attr].type


def check_expected(where, graph_def, expected, target):
    """All mismatches between ``expected`` and the dtypes in ``graph_def``, one line each."""
    nodes = {node.name: node for node in graph_def.node}
    errors = []
    for key, code in expected.items():
        name, attr, got = read_key(nodes, key)
        want = code if attr == "op" else (target if code == "h" else DTYPE_CODES[code])
        if got != want:
            errors.append(f"{where}: node {name!r} attr {attr}: expected {dtype_name(want)}, got {dtype_name(got)}")
    return errors


def tensor(name):
    """Normalise ``"x"`` to ``"x:0"`` (``"^x"`` stays as it is)."""
    return name if name.startswith("^") or ":" in name else f"{name}:0"


def check_structure(where, before, after, case, target):
    """Count of added nodes, TF's Cast naming scheme, no dangling inputs, nothing removed; the list of problems."""
    old = {node.name: node for node in before.node}
    new = {node.name: node for node in after.node}
    errors = [f"{where}: node {name!r} was removed" for name in old if name not in new]
    added = [new[name] for name in new if name not in old]
    if case.added is not None and len(added) != case.added:
        errors.append(f"{where}: expected {case.added} added nodes, got {len(added)}: {sorted(n.name for n in added)}")
    for node in added:
        errors += check_cast(where, node, target)
    for node in after.node:
        for inp in node.input:
            if inp.lstrip("^").split(":")[0] not in new:
                errors.append(f"{where}: node {node.name!r} has dangling input {inp!r}")
    if case.identical:
        for name, node in old.items():
            if name in new and (new[name].op, [tensor(i) for i in new[name].input]) != (
                    node.op, [tensor(i) for i in node.input]):
                errors.append(f"{where}: node {name!r} changed op/inputs: {node.op} {list(node.input)} -> "
                              f"{new[name].op} {list(new[name].input)}")
    return errors


def check_cast(where, node, target):
    """An added node must be a Cast named ``<src>-<port>-CastTo<Kind>-<n>-AutoMixedPrecision`` reading ``src:port``."""
    match = CAST_NAME.match(node.name)
    if node.op != "Cast" or not match:
        return [f"{where}: added node {node.name!r} (op {node.op}) is not a Cast named "
                f"'<src>-<port>-CastTo{{Fp16,Bf16,Fp32}}-<n>-AutoMixedPrecision'"]
    errors = []
    src = f"{match['src']}:{match['port']}"
    if [tensor(i) for i in node.input if not i.startswith("^")] != [src]:
        errors.append(f"{where}: cast {node.name!r}: expected input {src!r}, got {list(node.input)}")
    dst = node.attr["DstT"].type
    if dst != KIND_DTYPE[match["kind"]]:
        errors.append(f"{where}: cast {node.name!r} attr DstT: expected {dtype_name(KIND_DTYPE[match['kind']])} "
                      f"(from its name), got {dtype_name(dst)}")
    if dst not in (target, types_pb2.DT_FLOAT) or node.attr["SrcT"].type not in (target, types_pb2.DT_FLOAT) or (
            node.attr["SrcT"].type == dst):
        errors.append(f"{where}: cast {node.name!r}: expected a cast between float32 and {dtype_name(target)}, got "
                      f"SrcT {dtype_name(node.attr['SrcT'].type)} DstT {dtype_name(dst)}")
    return errors


def check_emulated(where, graph_def, spec):
    """The CpuTest checks: emulated allow nodes read through Casts half->float and write through Casts float->half."""
    nodes = {node.name: node for node in graph_def.node}
    fanouts = {}
    for node in graph_def.node:
        for inp in node.input:
            if not inp.startswith("^"):
                fanouts.setdefault(inp.split(":")[0], []).append(node)
    errors = []

    def expect_cast(kind, cast, src_dtype, dst_dtype, name_re):
        got = (cast.op, cast.attr["SrcT"].type if cast.op == "Cast" else None,
               cast.attr["DstT"].type if cast.op == "Cast" else None)
        if got != ("Cast", src_dtype, dst_dtype) or not re.match(name_re, cast.name):
            errors.append(f"{where}: {kind} {cast.name!r} ({cast.op}): expected a Cast {dtype_name(src_dtype)}->"
                          f"{dtype_name(dst_dtype)} matching {name_re!r}, got SrcT/DstT "
                          f"{dtype_name(got[1])}/{dtype_name(got[2])}")

    for name in spec["fanin_to_fp32"]:
        for inp in (i for i in nodes[name].input if not i.startswith("^")):
            cast = nodes[inp.split(":")[0]]
            src = cast.input[0].split(":")[0] if cast.input else ""
            expect_cast(f"fanin of {name}", cast, types_pb2.DT_HALF, types_pb2.DT_FLOAT,
                        rf"^{re.escape(src)}-0-CastToFp32-[0-9]-AutoMixedPrecision$")
    for name in spec["fanout_to_fp16"]:
        for cast in fanouts.get(name, []):
            expect_cast(f"fanout of {name}", cast, types_pb2.DT_FLOAT, types_pb2.DT_HALF,
                        rf"^{re.escape(name)}-0-CastToFp16-[0-9]-AutoMixedPrecision$")
    for name in spec["fanout_not_cast"]:
        errors += [f"{where}: fanout {n.name!r} of {name} is a Cast" for n in fanouts.get(name, []) if n.op == "Cast"]
    return errors


def check_case(where, case, before, after):
    target = TARGET[case.precision]
    errors = check_expected(where, after, case.expected, target)
    errors += check_structure(where, before, after, case, target)
    if case.emulated:
        errors += check_emulated(where, after, case.emulated)
    return errors


def type_attrs(node):
    """``{attr: dtype or tuple of dtypes}`` for every type / list(type) attr of a node."""
    out = {}
    for key, value in node.attr.items():
        if value.WhichOneof("value") == "type":
            out[key] = value.type
        elif value.WhichOneof("value") == "list" and value.list.type:
            out[key] = tuple(value.list.type)
    return out


def diff_graphs(where, theirs, ours):
    """Node-for-node differences (names, ops, type attrs, inputs) between TF's output and ours."""
    tf_nodes = {node.name: node for node in theirs.node}
    our_nodes = {node.name: node for node in ours.node}
    errors = [f"{where}: TF has node {n!r}, ours does not" for n in sorted(tf_nodes.keys() - our_nodes.keys())]
    errors += [f"{where}: ours has node {n!r}, TF does not" for n in sorted(our_nodes.keys() - tf_nodes.keys())]
    for name in sorted(tf_nodes.keys() & our_nodes.keys()):
        t, o = tf_nodes[name], our_nodes[name]
        if t.op != o.op:
            errors.append(f"{where}: node {name!r} op: TF {t.op}, ours {o.op}")
        t_attrs, o_attrs = type_attrs(t), type_attrs(o)
        for attr in sorted(t_attrs.keys() | o_attrs.keys()):
            if t_attrs.get(attr) != o_attrs.get(attr):
                errors.append(f"{where}: node {name!r} attr {attr}: TF {_fmt(t_attrs.get(attr))}, "
                              f"ours {_fmt(o_attrs.get(attr))}")
        t_in = [tensor(i) for i in t.input if not i.startswith("^")]
        o_in = [tensor(i) for i in o.input if not i.startswith("^")]
        if t_in != o_in:
            errors.append(f"{where}: node {name!r} data inputs: TF {t_in}, ours {o_in}")
    return errors


def _fmt(value):
    if isinstance(value, tuple):
        return "[" + ", ".join(dtype_name(v) for v in value) + "]"
    return dtype_name(value) if value is not None else "<absent>"


def fail_on(errors):
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)


def run_ours(case, device):
    graph_def, fetches = built(case.id)
    kwargs = {"emulate": True} if case.emulated else {}
    snapshot = graph_def.SerializeToString(deterministic=True)
    result = mp_rewrite.rewrite_graph_def(graph_def, precision=case.precision, fetches=list(fetches), device=device,
                                          level=case.level, **kwargs)
    unchanged = graph_def.SerializeToString(deterministic=True) == snapshot
    assert unchanged, f"case {case.id}: rewrite_graph_def modified its input GraphDef"
    return result.graph_def


# -------------------------------------------------------------------------------------------- (a) the oracle


def _oracle_param(case):
    marks = [pytest.mark.skip(reason=case.oracle_skip)] if case.oracle is None else []
    return pytest.param(case.id, id=case.id, marks=marks)


@pytest.mark.parametrize("case_id", [_oracle_param(c) for c in CASES])
def test_oracle_reproduces_grappler_case(case_id):
    """TF's own pass gives section 3's dtypes and cast count on our rebuilt graph."""
    case = CASES_BY_ID[case_id]
    graph_def, _ = built(case_id)
    fail_on(check_case(f"oracle[{case.oracle}] case {case_id}", case, graph_def, oracle_output(case_id)))


# ------------------------------------------------------------------------------------------------- (b) ours


def _ours_params():
    return [pytest.param(case.id, device, id=f"{case.id}-{device}") for case in CASES for device in case.devices]


@pytest.mark.parametrize("case_id,device", _ours_params())
def test_ours_matches_grappler_case(case_id, device):
    """Our pass gives section 3's dtypes, cast count and cast names."""
    case = CASES_BY_ID[case_id]
    graph_def, _ = built(case_id)
    where = f"ours[{case.precision}, device={device}] case {case_id}"
    fail_on(check_case(where, case, graph_def, run_ours(case, device)))


def _diff_params():
    params = []
    for case in CASES:
        if case.oracle is not None:
            params += [pytest.param(case.id, device, id=f"{case.id}-{device}") for device in case.devices]
    return params


@pytest.mark.parametrize("case_id,device", _diff_params())
def test_ours_equals_oracle_node_for_node(case_id, device):
    """Beyond section 3's asserted nodes: every node, op, type attr and data input equals TF's output."""
    case = CASES_BY_ID[case_id]
    where = f"case {case_id} (ours device={device} vs oracle {case.oracle})"
    theirs, ours = oracle_output(case_id), run_ours(case, device)
    if case.emulated:  # TF numbers the Casts of MatMul(x, x) in a hash order that changes between processes
        theirs, ours = canonical_cast_names(theirs), canonical_cast_names(ours)
    fail_on(diff_graphs(where, theirs, ours))

