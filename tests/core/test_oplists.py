"""Op list loading and overrides, with TF's semantics for its environment variables."""

import pytest

import mp_rewrite
from mp_rewrite.errors import ListError, OptionError
from mp_rewrite.core.oplists import builtin_lists, changes_from_env, load_lists


def test_builtin_float16_gates_assume_a_new_gpu_stack_by_default():
    assert "BatchMatMulV2" in builtin_lists("float16").allow
    old = builtin_lists("float16", cuda_version=9000, cudnn_version=7000)
    assert "BatchMatMulV2" not in old.allow and "Conv3D" not in old.allow and "MatMul" in old.allow


def test_env_add_then_remove_with_legacy_names():
    env = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD": "Softmax,Foo",
           "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_WHITELIST_REMOVE": "Foo",
           "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_REMOVE": "Softmax"}
    lists = load_lists("float16", env=env)
    assert "Softmax" in lists.allow and "Softmax" not in lists.infer and "Foo" not in lists.allow


def test_env_values_are_not_trimmed_like_tf():
    add, _ = changes_from_env({"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD": "A, B"})
    assert add == {"deny": ["A", " B"]}


def test_op_in_two_lists_names_the_op_and_both_lists():
    with pytest.raises(ListError, match=r"'Exp' is in both the allow and the deny list"):
        load_lists("float16", add={"allow": ["Exp"]}, env={})


def test_list_file_adds_removes_and_replaces(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[allow]\nadd = ["Softmax"]\n[infer]\nremove = ["Softmax"]\n[deny]\nops = ["Exp"]\n')
    lists = load_lists("float16", lists_file=str(path), env={})
    assert "Softmax" in lists.allow and lists.deny == frozenset({"Exp"})
    assert str(path) in lists.sources


def test_bad_list_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[allow\n")
    with pytest.raises(ListError, match="cannot parse op list file"):
        load_lists("float16", lists_file=str(path), env={})
    path.write_text('[colour]\nadd = ["X"]\n')
    with pytest.raises(ListError, match=r"unknown section \[colour\]"):
        load_lists("float16", lists_file=str(path), env={})


def test_level_treat_infer_as_deny_moves_infer_to_deny():
    lists = load_lists("float16", level="treat_infer_as_deny", env={})
    assert not lists.infer and "Tanh" in lists.deny


def test_unknown_precision_and_level_are_option_errors():
    with pytest.raises(OptionError, match="unknown precision 'fp8'"):
        builtin_lists("fp8")
    with pytest.raises(OptionError, match="unknown level"):
        load_lists("float16", level="FAST", env={})


def test_lists_are_frozen_and_changes_make_copies():
    lists = builtin_lists("float16")
    changed = lists.with_changes(add={"allow": ["Softmax"]}, remove={"infer": ["Softmax"]})
    assert "Softmax" in lists.infer and "Softmax" in changed.allow
    with pytest.raises(Exception):
        lists.allow = frozenset()


def test_rewrite_uses_tf_env_vars(monkeypatch):
    from chains import chain, dtype_string
    graph_def, fetches, names = chain("MatMul", "Exp", "MatMul")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_REMOVE", "Exp")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_ADD", "Exp")
    result = mp_rewrite.rewrite_graph_def(graph_def, "float16", fetches, device="cpu")
    assert dtype_string(result.graph_def, names) == "hhh"
