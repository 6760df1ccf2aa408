"""One behaviour per test: Grappler's stage rules on tiny real graphs (CPU kernels, so device="cpu")."""

import pytest

import mp_rewrite
from chains import casts, chain, dtype_string


def rewrite(ops, precision="float16", **kw):
    graph_def, fetches, names = chain(*ops)
    kw.setdefault("device", "cpu")
    result = mp_rewrite.rewrite_graph_def(graph_def, precision, fetches, **kw)
    return result, dtype_string(result.graph_def, names)


def test_allow_op_alone_converts_with_a_cast_each_side():
    result, got = rewrite(["MatMul"])
    assert got == "h"
    assert len(casts(result.graph_def)) == 2


def test_clear_ops_next_to_allow_convert_both_ways():
    _, got = rewrite(["Relu", "MatMul", "Relu"])
    assert got == "hhh"


def test_deny_propagates_through_clear_and_infer_only_towards_deny_or_infer():
    # Exp -> Relu -> Sqrt(infer) -> Relu -> MatMul: the last Relu only leads to an allow op, so it is not denied.
    result, got = rewrite(["Exp", "Relu", "Sqrt", "Relu", "MatMul"])
    assert got == "fffhh"
    assert result.coloring["n2", "T"].color == "deny"
    assert result.coloring["n2", "T"].reason.source == "n0"
    assert result.coloring["n3", "T"].color == "allow"


def test_infer_between_allow_ops_converts():
    _, got = rewrite(["MatMul", "Tanh", "MatMul"])
    assert got == "hhh"


def test_infer_directly_after_allow_converts_but_not_after_a_clear_op():
    _, got = rewrite(["MatMul", "Tanh"])
    assert got == "hh"
    _, got = rewrite(["MatMul", "Relu", "Log"])
    assert got == "hhf"


def test_deny_list_op_between_allow_ops_stays_float32():
    _, got = rewrite(["MatMul", "Exp", "MatMul"])
    assert got == "hfh"


def test_fetch_keeps_its_dtype():
    result, _ = rewrite(["MatMul"])
    fetch = next(n for n in result.graph_def.node if n.name == "fetch")
    assert fetch.attr["T"].type == 1
    assert fetch.input[0].endswith("CastToFp32-0-AutoMixedPrecision")


def test_cast_names_follow_tf_2_21():
    result, _ = rewrite(["Exp", "MatMul"])
    assert sorted(casts(result.graph_def)) == ["n0-0-CastToFp16-0-AutoMixedPrecision",
                                               "n1-0-CastToFp32-0-AutoMixedPrecision"]
    result, _ = rewrite(["Exp", "MatMul"], precision="bfloat16")
    assert "n0-0-CastToBf16-0-AutoMixedPrecision" in casts(result.graph_def)


def test_one_cast_per_output_port_shared_by_consumers():
    result, _ = rewrite(["Exp", "MatMul"])  # MatMul reads n0 twice (a and b)
    cast = [c for c in result.casts if c.src == "n0"]
    assert len(cast) == 1 and len(cast[0].consumers) == 2


def test_bfloat16_mean_and_sum_are_infer_not_deny():
    _, got = rewrite(["MatMul", "Sum"], precision="bfloat16")
    assert got == "bb"
    _, got = rewrite(["MatMul", "Sum"], precision="float16")
    assert got == "hf"


def test_keep_fp32_pattern_seeds_deny():
    result, got = rewrite(["MatMul", "Tanh", "MatMul"], keep_fp32=["n1"])
    assert got == "hfh"
    assert result.coloring["n1", "T"].reason.rule == "user_keep_fp32"


def test_force_low_converts_an_op_in_no_list():
    graph_def, fetches, names = chain("MatMul", "Softmax", "MatMul")
    result = mp_rewrite.rewrite_graph_def(graph_def, "float16", fetches, device="cpu", force_low=["n1"])
    assert dtype_string(result.graph_def, names) == "hhh"


def test_level_treat_infer_as_deny():
    _, got = rewrite(["MatMul", "Tanh", "MatMul"], level="TREAT_INFER_AS_DENY")
    assert got == "hfh"


def test_device_gpu_leaves_cpu_placed_nodes_alone():
    graph_def, fetches, names = chain("MatMul", "Relu", device="/device:CPU:0")
    result = mp_rewrite.rewrite_graph_def(graph_def, "float16", fetches, device="gpu")
    assert dtype_string(result.graph_def, names) == "ff"
    assert "placed on CPU" in result.coloring["n0", "T"].reason.detail
    result = mp_rewrite.rewrite_graph_def(graph_def, "float16", fetches, device="cpu")
    assert dtype_string(result.graph_def, names) == "hh"


def test_no_allow_op_means_no_change():
    graph_def, fetches, names = chain("Exp", "Relu", "Sqrt")
    result = mp_rewrite.rewrite_graph_def(graph_def, "float16", fetches, device="cpu")
    assert result.graph_def == graph_def
    assert not result.casts


def test_input_graph_is_never_modified():
    graph_def, fetches, _ = chain("Exp", "MatMul", "Tanh", "MatMul")
    before = graph_def.SerializeToString()
    mp_rewrite.rewrite_graph_def(graph_def, "float16", fetches, device="cpu")
    assert graph_def.SerializeToString() == before


def test_every_type_attribute_has_a_reason():
    result, _ = rewrite(["Exp", "Relu", "MatMul", "Tanh", "Transpose", "MatMul", "Log"])
    assert len(result.coloring) >= 8
    for key, decision in result.coloring.items():
        assert decision.reason.stage and decision.reason.rule, key


def test_summary_counts_nodes_and_casts():
    result, _ = rewrite(["Relu", "MatMul", "Relu"])
    assert result.summary().startswith("converted 3/5 nodes to float16 with 2 casts")
    assert result.grappler_line().startswith("Converted 3/5 nodes to float16 precision using 1 cast(s)")


@pytest.mark.parametrize("precision,device", [("float16", "gpu"), ("bfloat16", "cpu")])
def test_default_device_per_precision(precision, device):
    result, _ = rewrite(["MatMul"], precision=precision, device=None)
    assert result.device == device


def test_unsafe_force_all_leaves_attrs_the_opdef_forbids():
    """TF 2.21 fails with "Failed to set type attribute" here; we keep SparseMatMul's Ta/Tb float32."""
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        a = tf.ones([4, 4], name="a")
        s = tf.raw_ops.SparseMatMul(a=a, b=a, name="sparse")
        tf.identity(s + tf.matmul(a, a, name="mm"), name="out")
    result = mp_rewrite.rewrite_graph_def(g.as_graph_def(), "float16", ["out"], device="cpu",
                                          level="UNSAFE_FORCE_ALL")
    assert not result.coloring["sparse", "Ta"].converted and result.coloring["mm", "T"].converted
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(result.graph_def, name="")
