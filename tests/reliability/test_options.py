"""Options and inputs that used to be accepted silently or ended in a traceback: each is now one line and exit 2,
before anything is written."""

from __future__ import annotations

import shutil

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import mp_rewrite
from mp_rewrite.commands import cli
from mp_rewrite.errors import GraphError, ListError, ModelError, OptionError
from users import entries, one_line_error, tree_hash

LIST_FILES = {
    "non-utf8.toml": (b"[allow]\nadd = [\"Mat\xff\xfeMul\"]\n", "is not UTF-8 text"),
    "nested.toml": (b"[allow]\nadd = [[\"MatMul\"]]\n", "['MatMul'] is not an op name"),
    "integer.toml": (b"[deny]\nadd = [7]\n", "7 is not an op name"),
    "unknown.toml": (b"[infer]\nremove = [\"Matmul\"]\n", "'Matmul' is not an op TensorFlow knows"),
    "empty-name.toml": (b"[clear]\nops = [\"\"]\n", "'' is not an op name"),
}


@pytest.mark.parametrize("name", LIST_FILES)
def test_bad_list_files(source, tmp_path, capsys, name):
    data, fragment = LIST_FILES[name]
    (tmp_path / name).write_bytes(data)
    for command in (["convert", str(source), str(tmp_path / "out"), "--lists"], ["lists", "--lists"]):
        assert cli.main(command + [str(tmp_path / name)]) == 2
        one_line_error(capsys.readouterr().err, fragment)
    assert entries(tmp_path) == [name]


@pytest.mark.parametrize("args, fragment", [
    (["--allow", "NoSuchOp"], "--allow: 'NoSuchOp' is not an op TensorFlow knows"),
    (["--deny", ""], "--deny: '' is not an op name"),
    (["--clear", "matmul"], "'matmul' is not an op TensorFlow knows"),
    (["--keep-fp32", "dense_99/*"], "--keep-fp32 'dense_99/*' matches no node"),
    (["--force-low", "Softmax", "--force-low", "nothing_here"], "--force-low 'nothing_here' matches no node"),
])
def test_bad_convert_options_write_nothing(source, tmp_path, capsys, args, fragment):
    before = tree_hash(source)
    assert cli.main(["convert", str(source), str(tmp_path / "out"), *args]) == 2
    one_line_error(capsys.readouterr().err, fragment)
    assert entries(tmp_path) == [] and tree_hash(source) == before


def test_patterns_that_match_convert(source, tmp_path, capsys):
    # MatMul and Softmax are nodes of the converted function bodies.
    assert cli.main(["convert", str(source), str(tmp_path / "out"), "--precision", "bfloat16", "--keep-fp32",
                     "MatMul", "--force-low", "Soft*"]) == 0, capsys.readouterr().err


@pytest.fixture(scope="module")
def graph_def():
    fn = tf.function(lambda x: tf.nn.relu(tf.matmul(x, x)))
    return fn.get_concrete_function(tf.TensorSpec([4, 4])).graph.as_graph_def()


def test_fetches_as_one_string_is_one_name(graph_def):
    as_string = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", "Identity")
    as_list = mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", ["Identity"])
    assert as_string.graph_def == as_list.graph_def
    assert as_string.coloring["Identity", "T"].reason.detail.startswith("fetched")


@pytest.mark.parametrize("fetches, error, fragment", [
    (["Identity:7"], GraphError, "names output 7 of node 'Identity', which has 1 output; fetch 'Identity' or"),
    (["Relu:1"], GraphError, "names output 1 of node 'Relu'"),
    ([""], OptionError, "'' is not a node or tensor name"),
    ([3], OptionError, "3 is not a node or tensor name"),
])
def test_bad_fetches_are_refused(graph_def, fetches, error, fragment):
    with pytest.raises(error, match=fragment):
        mp_rewrite.rewrite_graph_def(graph_def, "bfloat16", fetches)


def test_unknown_dtype_enum_in_convert_and_inspect(source, tmp_path, capsys):
    src = tmp_path / "src"
    model = saved_model_pb2.SavedModel.FromString((source / "saved_model.pb").read_bytes())
    for fdef in model.meta_graphs[0].graph_def.library.function:
        for node in fdef.node_def:
            if node.op == "MatMul":
                node.attr["T"].type = 999
    src.mkdir()
    (src / "saved_model.pb").write_bytes(model.SerializeToString(deterministic=True))
    assert cli.main(["inspect", str(src)]) == 2
    one_line_error(capsys.readouterr().err, "dtype enum 999")
    shutil.copytree(source / "variables", src / "variables")
    assert cli.main(["convert", str(src), str(tmp_path / "out")]) == 2
    one_line_error(capsys.readouterr().err, "dtype enum 999, which TensorFlow does not know")
    assert entries(tmp_path) == ["src"]


def test_a_refused_conversion_leaves_no_parent_directories(source, tmp_path, capsys):
    assert cli.main(["convert", str(source), str(tmp_path / "new" / "dirs" / "out"), "--allow", "Nope"]) == 2
    assert cli.main(["convert", str(tmp_path / "missing"), str(tmp_path / "new" / "dirs" / "out")]) == 2
    assert entries(tmp_path) == [] and "does not exist" in capsys.readouterr().err


def test_the_check_step_checks_what_convert_checks_and_writes_nothing(source, tmp_path):
    from mp_rewrite.core.options import make_options
    from mp_rewrite.savedmodel.convert import check_conversion

    def check(signatures=None, **options):
        check_conversion(source, tmp_path / "out", None, signatures, options=make_options("bfloat16", **options))
    check(keep_fp32=["MatMul"], force_low=["Soft*"])
    for kwargs, error in (({"keep_fp32": ["dense_9"]}, OptionError), ({"deny": ["NoSuchOp"]}, ListError),
                          ({"signatures": ["predict"]}, ModelError)):
        with pytest.raises(error):
            check(**kwargs)
    assert entries(tmp_path) == []
