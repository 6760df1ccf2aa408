"""Damaged sources as users have them: variables behind a symbolic link (followed), a dangling link or a loop,
missing or truncated variables, a cleared function library, a control input to nowhere. Each converts into a model
that loads, or exits 2 with one line saying what is wrong, the source untouched and nothing written."""

from __future__ import annotations

import os
import shutil

import pytest
from tensorflow.core.protobuf import saved_model_pb2

from mp_rewrite.commands import cli
from users import entries, load_and_run, one_line_error, tree_hash

DATA = "variables/variables.data-00000-of-00001"


def _edit_proto(src, edit) -> None:
    model = saved_model_pb2.SavedModel.FromString((src / "saved_model.pb").read_bytes())
    edit(model.meta_graphs[0])
    (src / "saved_model.pb").write_bytes(model.SerializeToString(deterministic=True))


def _dangling_variables(src) -> None:
    shutil.rmtree(src / "variables")
    os.symlink(src.parent / "gone", src / "variables")


def _truncate(src) -> None:
    data = (src / DATA).read_bytes()
    (src / DATA).write_bytes(data[: len(data) // 2])


def _flip_a_weight_byte(src) -> None:
    data = bytearray((src / DATA).read_bytes())
    data[100] ^= 0xFF
    (src / DATA).write_bytes(bytes(data))


def _control_input_to_nowhere(meta_graph) -> None:
    node = next(f for f in meta_graph.graph_def.library.function if "inner" in f.signature.name).node_def[0]
    node.input.append("^dense/vanished")


def _attr_without_a_value(meta_graph) -> None:
    node = next(f for f in meta_graph.graph_def.library.function if "inner" in f.signature.name).node_def[0]
    node.attr["T"].Clear()  # what a flipped byte can leave; TF loads it and fails only when the function runs


DAMAGE = {
    "dangling variables link": (_dangling_variables, "is a symbolic link to"),
    "link loop": (lambda src: os.symlink(src, src / "assets" / "loop"), "is a symbolic link back into"),
    "no variables index": (lambda src: (src / "variables/variables.index").unlink(), "has variables but no"),
    "no variables data": (lambda src: (src / DATA).unlink(), "variables of"),
    "truncated variables": (_truncate, "are incomplete or corrupt"),
    "flipped weight byte": (_flip_a_weight_byte, "are incomplete or corrupt"),
    "cleared function library": (lambda src: _edit_proto(src, lambda mg: mg.graph_def.library.Clear()),
                                 "which is not in the SavedModel's library"),
    "control input to nowhere": (lambda src: _edit_proto(src, _control_input_to_nowhere), "'^dense/vanished'"),
    "attr without a value": (lambda src: _edit_proto(src, _attr_without_a_value), "has no value"),
}


def _relu_typed_int32(meta_graph) -> None:
    from tensorflow.core.framework import types_pb2
    for function in meta_graph.graph_def.library.function:
        for node in function.node_def:
            if node.op == "Relu":
                node.attr["T"].type = types_pb2.DT_INT32  # valid on its own; TensorFlow refuses it when loading


@pytest.mark.parametrize("freeze", [[], ["--freeze"]], ids=["in-place", "frozen"])
def test_a_source_tensorflow_cannot_load_is_one_line_and_writes_nothing(source, tmp_path, capsys, freeze):
    src = tmp_path / "src"
    shutil.copytree(source, src)
    _edit_proto(src, _relu_typed_int32)
    before = tree_hash(src)
    assert cli.main(["convert", str(src), str(tmp_path / "out"), "--precision", "bfloat16", *freeze]) == 2
    error = capsys.readouterr().err
    one_line_error(error, "load")
    assert f"'{src}'" in error and "export the model again" in error
    assert "out" not in entries(tmp_path) and tree_hash(src) == before


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_source_is_one_line_and_writes_nothing(source, tmp_path, capsys, damage):
    src = tmp_path / "src"
    shutil.copytree(source, src)
    make, fragment = DAMAGE[damage]
    make(src)
    before = tree_hash(src) if damage != "link loop" else None
    assert cli.main(["convert", str(src), str(tmp_path / "out"), "--precision", "bfloat16"]) == 2
    one_line_error(capsys.readouterr().err, fragment)
    assert "out" not in entries(tmp_path)
    assert before is None or tree_hash(src) == before
    assert [n for n in entries(tmp_path) if n.startswith(".")] == []


def test_variables_behind_a_symbolic_link_are_copied(source, tmp_path, capsys):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    shutil.copytree(source, src)
    shutil.move(src / "variables", elsewhere)
    os.symlink(elsewhere, src / "variables")
    before = tree_hash(src)
    assert cli.main(["convert", str(src), str(tmp_path / "out"), "--precision", "bfloat16"]) == 0, \
        capsys.readouterr().err
    variables = tmp_path / "out" / "variables"
    assert not variables.is_symlink() and sorted(p.name for p in variables.iterdir()) == sorted(os.listdir(elsewhere))
    assert load_and_run(tmp_path / "out")["y"].shape == (2, 16) and tree_hash(src) == before
