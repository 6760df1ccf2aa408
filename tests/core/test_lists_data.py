"""The op list data under lists/: well-formed, disjoint, known to TF, and equal to TF 2.21's compiled lists.

The last tests run TensorFlow's own auto mixed precision pass (through tools/compare_lists.py) and compare the lists
it dumps with ours, so a drift between lists/*.toml and the installed binary fails here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tomllib
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow  # noqa: E402,F401  (loads every op into the registry)
from tensorflow.python.framework import op_def_registry  # noqa: E402

from mp_rewrite.core.oplists import builtin_lists  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LISTS_DIR = ROOT / "lists"
PRECISIONS = ("float16", "bfloat16")
KINDS = ("allow", "infer", "deny", "clear")

TENSOR_LIST_OPS = frozenset({
    "TensorListConcat", "TensorListConcatLists", "TensorListConcatV2", "TensorListGather", "TensorListGetItem",
    "TensorListPopBack", "TensorListPushBack", "TensorListPushBackBatch", "TensorListFromTensor",
    "TensorListScatter", "TensorListScatterV2", "TensorListScatterIntoExistingList", "TensorListSetItem",
    "TensorListSplit", "TensorListStack",
})
# On TF's CUDA allow list but unknown to the 2.21 op registry: Google-internal ops, and a former tf.contrib op.
NOT_IN_REGISTRY = frozenset({
    "FastUnsortedSegmentMax", "FusedConv2DBiasActivation", "FusedSparseConvGpuV2", "Mha", "MhaV2", "Pmlp",
    "Tmlp", "TmlpV2", "TmlpV3", "VoxelMax",
})


def _load_toml(name: str) -> dict:
    """Parse lists/<name>.toml."""
    with open(LISTS_DIR / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


def _raw_lists(precision: str) -> dict[str, list[str]]:
    """Return list kind -> ops as written in the TOML, gated allow groups folded into allow (duplicates kept)."""
    data = _load_toml(precision)
    lists = {kind: list(data[kind]["ops"]) for kind in KINDS}
    for group in data["allow"].get("gated", []):
        lists["allow"] += group["ops"]
    return lists


def _all_list_ops() -> set[str]:
    """Every op on any list of either precision."""
    return {op for p in PRECISIONS for ops in _raw_lists(p).values() for op in ops}


def _load_compare_tool():
    """Import tools/compare_lists.py (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("compare_lists", ROOT / "tools" / "compare_lists.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compare_tool():
    return _load_compare_tool()


@pytest.fixture(scope="module")
def tf_lists(compare_tool):
    """TF 2.21's compiled lists per precision, from one run of its pass each."""
    return {p: compare_tool.tensorflow_lists(p) for p in PRECISIONS}


# --- the files ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
def test_list_file_parses_with_meta_and_four_lists(precision):
    data = _load_toml(precision)
    assert data["meta"]["precision"] == precision
    assert data["meta"]["tensorflow"] == "2.21.0"
    assert "auto_mixed_precision_lists.h" in data["meta"]["source"]
    for kind in KINDS:
        assert data[kind]["ops"], f"{precision}: [{kind}] is empty"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_ops_array_is_sorted_and_unique(precision):
    data = _load_toml(precision)
    arrays = {kind: data[kind]["ops"] for kind in KINDS}
    arrays.update({f"allow.gated[{i}]": g["ops"] for i, g in enumerate(data["allow"].get("gated", []))})
    for where, ops in arrays.items():
        assert ops == sorted(set(ops)), f"{precision} {where} is not sorted and unique"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_no_op_is_in_two_lists(precision):
    owner: dict[str, str] = {}
    for kind, ops in _raw_lists(precision).items():
        for op in ops:
            assert op not in owner, f"{precision}: {op} is in both {owner[op]} and {kind}"
            owner[op] = kind


def test_float16_gated_groups_are_tfs_version_gates():
    groups = {frozenset(g["ops"]): g["requires"] for g in _load_toml("float16")["allow"]["gated"]}
    assert groups == {
        frozenset({"BatchMatMul", "BatchMatMulV2"}): {"cuda": 9010},
        frozenset({"Conv3D", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2", "Conv3DBackpropInput",
                   "Conv3DBackpropInputV2"}): {"cudnn": 7602},
        frozenset({"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter",
                   "DepthwiseConv2dNativeBackpropInput"}): {"cudnn": 8000},
    }
    assert all(g.get("why") for g in _load_toml("float16")["allow"]["gated"])


def test_bfloat16_has_no_gated_groups():
    assert "gated" not in _load_toml("bfloat16")["allow"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_clear_list_holds_the_15_tensor_list_ops(precision):
    assert TENSOR_LIST_OPS <= set(_raw_lists(precision)["clear"])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_builtin_lists_reads_the_same_ops_as_the_toml(precision):
    lists = builtin_lists(precision)
    raw = _raw_lists(precision)
    for kind in KINDS:
        assert getattr(lists, kind) == frozenset(raw[kind]), kind


# --- the op registry ---------------------------------------------------------------------------------------------


def test_every_listed_op_is_in_tfs_registry_except_the_known_non_open_source_ones():
    missing = {op for op in _all_list_ops() if op_def_registry.get(op) is None}
    assert missing == NOT_IN_REGISTRY


def test_the_non_registry_ops_are_all_float16_allow_ops():
    assert NOT_IN_REGISTRY <= set(_raw_lists("float16")["allow"])
    assert not NOT_IN_REGISTRY & {op for ops in _raw_lists("bfloat16").values() for op in ops}


# --- gpu_kernels.toml --------------------------------------------------------------------------------------------


def test_gpu_kernel_table_parses_and_covers_only_listed_ops():
    data = _load_toml("gpu_kernels")
    assert {"source", "method", "caveats"} <= set(data["meta"])
    listed = _all_list_ops()
    for dtype in ("half", "bfloat16"):
        ops = data["gpu"][dtype]
        assert ops == sorted(set(ops)), f"[gpu] {dtype} is not sorted and unique"
        assert set(ops) <= listed, f"[gpu] {dtype} has ops on no list: {sorted(set(ops) - listed)}"
    assert set(data["meta"]["inferred"]) <= listed
    assert set(data["meta"]["assumed_half"]) == NOT_IN_REGISTRY


def test_gpu_kernel_table_records_the_verified_gaps():
    gpu = _load_toml("gpu_kernels")["gpu"]
    half, bf16 = set(gpu["half"]), set(gpu["bfloat16"])
    # Read in TF's kernel sources: float-only GRU cells, Where without 16-bit GPU kernels, CPU-only ops.
    for op in ("GRUBlockCell", "GRUBlockCellGrad", "Where", "FusedPadConv2D", "SaveV2"):
        assert op not in half and op not in bf16, op
    for op in ("BlockLSTM", "LSTMBlockCell", "CheckNumerics", "Softplus", "Softsign"):
        assert op in half and op not in bf16, op
    assert not NOT_IN_REGISTRY & bf16
    assert {"MatMul", "Conv2D", "BatchMatMulV2", "Relu", "FusedBatchNormV3", "TensorListStack"} <= half & bf16


# --- against the TensorFlow binary -------------------------------------------------------------------------------


def test_parse_paintbuckets_reads_sections_and_rejects_bad_dumps(compare_tool):
    text = "AllowList:\nMatMul\nConv2D\n\nDenyList:\nExp\n\nInferList:\nAdd\n\nClearList:\nRelu\n"
    assert compare_tool.parse_paintbuckets(text) == {
        "allow": {"MatMul", "Conv2D"}, "deny": {"Exp"}, "infer": {"Add"}, "clear": {"Relu"}}
    with pytest.raises(ValueError, match="before any section"):
        compare_tool.parse_paintbuckets("MatMul\nAllowList:\n")
    with pytest.raises(ValueError, match="missing"):
        compare_tool.parse_paintbuckets("AllowList:\nMatMul\n")


def test_list_diff_reports_an_op_missing_on_our_side(compare_tool, tf_lists):
    theirs = tf_lists["float16"]
    ours = {**theirs, "infer": theirs["infer"] - {"Add"}}
    diff = compare_tool.ListDiff("float16", ours=ours, tf=theirs)
    assert not diff.identical
    assert diff.only_tf("infer") == {"Add"} and not diff.only_ours("infer")


def test_tf_lists_ignore_list_env_vars_and_restore_them(compare_tool, monkeypatch):
    var = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_CLEARLIST_ADD"
    monkeypatch.setenv(var, "NotARealOpForTheTest")
    lists = compare_tool.tensorflow_lists("bfloat16")
    assert "NotARealOpForTheTest" not in lists["clear"]
    assert os.environ[var] == "NotARealOpForTheTest"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_our_lists_equal_tensorflow_2_21_compiled_lists(compare_tool, precision):
    diff = compare_tool.compare(precision)
    problems = {kind: (sorted(diff.only_ours(kind)), sorted(diff.only_tf(kind))) for kind in KINDS
                if diff.only_ours(kind) or diff.only_tf(kind)}
    assert diff.identical, f"{precision} (only ours, only TF) per list: {problems}"
