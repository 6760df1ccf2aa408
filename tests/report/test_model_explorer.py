"""The Model Explorer overlay and `mp-rewrite view`, against the real Model Explorer (ai-edge-model-explorer, in the
test and viz extras): the overlay loads into Model Explorer's own node-data classes, its node ids are those of
Model Explorer's own adapter, every node the rewrite retyped is colored and says so; `view` serves it on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from google.protobuf import text_format

import mp_rewrite.testing.examples as ex
from mp_rewrite.commands.cli import main as cli_main
from mp_rewrite.report.model_explorer import is_installed
from mp_rewrite.model.loaded import load_model, rewrite_model
from mp_rewrite.report.node_table import build_tables
from mp_rewrite.report.palette import FILL

pytestmark = pytest.mark.skipif(not is_installed(), reason="ai-edge-model-explorer is not installed: "
                                "pip install -e '.[test]' (or '.[viz]') to test the Model Explorer overlay")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("me") / "cnn")
    ex.cnn_bn().export(path, verbose=False)
    return path


@pytest.fixture(scope="module")
def overlay_file(saved_model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("me_out") / "overlay.json")
    assert cli_main(["inspect", saved_model, "--precision", "bfloat16", "--format", "model-explorer", "-o", out]) == 0
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def _explorer_graphs(adapter, path) -> dict:
    """graph id -> {node id: node} as Model Explorer's own adapter shows the model."""
    collections = adapter().convert(path, {})["graphCollections"]
    return {g["id"]: {n["id"]: n for n in g["nodes"]} for c in collections for g in c.graphs}


def _as_model_node_data(overlay: dict):
    """The overlay through Model Explorer's node_data_builder classes (unknown or missing fields raise)."""
    from model_explorer.node_data_builder import GraphNodeData, ModelNodeData, NodeDataResult
    graphs = {}
    for graph_id, data in overlay.items():
        fields = dict(data)
        results = {k: NodeDataResult(**v) for k, v in fields.pop("results").items()}
        graphs[graph_id] = GraphNodeData(results=results, **fields)
    return ModelNodeData(graphsData=graphs)


def _retyped(result) -> dict:
    """graph id as Model Explorer names it -> {node name: NodeRow} of every node the rewrite retyped."""
    out = {}
    for table in build_tables(result, with_flops=False):
        rows = {name: row for name, row in table.rows.items() if any(d.converted for d in row.decisions)}
        out[table.name or "main"] = rows
    return out


def test_overlay_loads_in_model_explorer_and_colors_every_retyped_node(saved_model, overlay_file):
    from model_explorer.builtin_tf_direct_adapter import BuiltinTfDirectAdapter
    model_data = _as_model_node_data(overlay_file)
    written = json.loads(model_data.to_json_string())  # as Model Explorer writes it: with its defaults filled in
    assert {g: {k: written[g][k] for k in data} for g, data in overlay_file.items()} == overlay_file
    graphs = _explorer_graphs(BuiltinTfDirectAdapter, os.path.join(saved_model, "saved_model.pb"))
    retyped = _retyped(rewrite_model(load_model(saved_model), "bfloat16"))
    checked = 0
    for graph_id, rows in retyped.items():
        results = overlay_file[graph_id]["results"]
        assert set(results) <= set(graphs[graph_id]), f"{graph_id}: node ids Model Explorer does not have"
        by_name = {(n["namespace"], n["label"]): node_id for node_id, n in graphs[graph_id].items()}
        for name, row in rows.items():
            node_id = by_name[(name, row.op)]
            entry = results[node_id]
            assert entry["bgColor"] == FILL["allow"] == FILL[row.node_class], (graph_id, name)
            assert entry["value"].startswith("bfloat16 (allow: "), (graph_id, name, entry)
            checked += 1
    assert checked >= 10, "the CNN's convolutions, batch norms, pools and matmul are retyped"
    values = [r["value"] for g in overlay_file.values() for r in g["results"].values()]
    assert any(v.startswith("float32 (untouched: ") for v in values)
    assert all(r["bgColor"] in FILL.values() for g in overlay_file.values() for r in g["results"].values())
    # the function the signatures call is there, under the name Model Explorer gives it
    call = next(name for name in retyped if name.startswith("__inference___call__"))
    assert any(v.startswith("bfloat16") for v in (r["value"] for r in overlay_file[call]["results"].values()))


def test_graph_def_file_uses_the_graph_def_adapter(tmp_path, capsys):
    from model_explorer.builtin_graphdef_adapter import BuiltinGraphdefAdapter
    graph = ex.EXAMPLES["mlp/inference"]()
    path = tmp_path / "mlp.pbtxt"
    path.write_text(text_format.MessageToString(graph.graph_def))
    out = tmp_path / "mlp.json"
    assert cli_main(["inspect", str(path), "--precision", "bfloat16", "--fetch", graph.fetches[0],
                     "--format", "model-explorer", "-o", str(out)]) == 0
    assert "builtin_graphdef" in capsys.readouterr().out
    overlay = json.loads(out.read_text())
    nodes = _explorer_graphs(BuiltinGraphdefAdapter, str(path))["main"]
    matmuls = {i: n for i, n in nodes.items() if n["label"] == "MatMul"}
    assert len(matmuls) == 3
    for node_id in matmuls:
        assert overlay["main"]["results"][node_id] == {"value": "bfloat16 (allow: allow list)",
                                                       "bgColor": FILL["allow"]}


def test_bad_input_is_one_line(saved_model, tmp_path, capsys):
    from tensorflow.core.protobuf import saved_model_pb2
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(open(os.path.join(saved_model, "saved_model.pb"), "rb").read())
    meta = tmp_path / "model.meta"
    meta.write_bytes(saved.meta_graphs[0].SerializeToString())
    out = tmp_path / "never.json"
    cases = [(["inspect", str(meta), "--format", "model-explorer", "-o", str(out)], "is a MetaGraphDef"),
             (["inspect", saved_model, "--format", "model-explorer", "--around", "x", "-o", str(out)], "--around"),
             (["inspect", saved_model, "--format", "model-explorer", "--function", "nope", "-o", str(out)],
              "no rewritten function named 'nope'")]
    for argv, message in cases:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)
        assert not out.exists()


PROBE = """
import sys
from mp_rewrite.commands import cli
code = cli.main(sys.argv[1:])
print(code, 'tensorflow' in sys.modules)
"""
HIDDEN = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('model_explorer', 'ai_edge_model_explorer_adapter'):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
sys.meta_path.insert(0, Hide())
""" + PROBE


@pytest.mark.parametrize("command", ["inspect", "view"])
def test_without_model_explorer_one_line_naming_viz_before_tensorflow(command, saved_model, tmp_path):
    out = tmp_path / "overlay.json"
    argv = [command, saved_model] + (["--format", "model-explorer", "-o", str(out)] if command == "inspect" else [])
    proc = subprocess.run([sys.executable, "-c", HIDDEN, *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "mp_rewrite[viz]" in err[0] and "Model Explorer is not installed" in err[0], err
    assert not out.exists()


def test_view_refuses_a_port_in_use_before_tensorflow(saved_model, tmp_path):
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-c", PROBE, "view", saved_model, "--port", str(port)],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert f"port {port} on 127.0.0.1 is in use" in proc.stderr


def _get(url: str, data: dict | None = None):
    body = json.dumps(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy
    with opener.open(request, timeout=20) as response:
        return response.status, response.read().decode()


def _url_from(proc, deadline: float, printed: list) -> str:
    for line in proc.stdout:
        printed.append(line)
        if line.startswith("http://127.0.0.1:"):
            return line.strip()
        assert time.monotonic() < deadline, "view did not print its URL in time"
    raise AssertionError(f"view ended without a URL: {proc.wait(5)} {proc.stderr.read()[-1500:]}")


def _as_in_a_terminal() -> None:
    """Run in the child before exec: SIGINT back to its default, as for any command a terminal runs in the
    foreground, where Ctrl+C reaches it. A shell without job control (a script, CI started as a background job)
    starts its background jobs with SIGINT ignored; pytest and this child inherit that, and POSIX keeps an ignored
    signal ignored across exec (Python too leaves it so), so without this the test's "Ctrl+C" would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 0), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_view_serves_model_explorer_with_the_overlay_on_localhost(saved_model, overlay_file, stop, code):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "mp_rewrite", "view", saved_model, "--precision", "bfloat16",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, preexec_fn=_as_in_a_terminal)
    try:
        lines = []
        url = _url_from(proc, time.monotonic() + 90, lines)
        printed = "".join(lines)
        network = printed.split("opens on graph '", 1)[1].split("'", 1)[0] if "opens on graph '" in printed else ""
        base = url.split("/?")[0]
        data = json.loads(urllib.parse.unquote(urllib.parse.urlparse(url).query.split("data=", 1)[1]))
        # Model Explorer opens the first graph of the first collection: the network (the function the serving
        # signature calls), not the signatures' main graph.
        assert data["models"] == [{"url": f"graphs://{os.path.basename(saved_model)}/0"}]
        status, body = _get(base + "/api/v1/load_graphs_json?graph_index=0")
        first, rest = json.loads(body)["graphCollections"]
        assert [g["id"] for g in first["graphs"]] == [network] and "main" in {g["id"] for g in rest["graphs"]}
        assert "___call___" in network and f"opens on graph '{network}'" in printed
        status, page = _get(base + "/")
        assert status == 200 and "<html" in page.lower()
        status, body = _get(base + "/api/v1/load_node_data?node_data_index=0")
        served = json.loads(json.loads(body)["content"])
        # the same graphs and nodes as `inspect` wrote (exact values are compared above; the working tree of the
        # package may change between this test's processes)
        assert {g: set(d["results"]) for g, d in served.items()} == {g: set(d["results"]) for g, d in
                                                                     overlay_file.items()}
        assert all(r["bgColor"] in FILL.values() and r["value"] for d in served.values()
                   for r in d["results"].values())
        # the server converts the model as the page asks it to: the overlay's ids are the ids it shows
        status, body = _get(base + "/apipost/v1/send_command",
                            {"cmdId": "convert", "extensionId": "builtin_tf_direct", "modelPath":
                             os.path.abspath(os.path.join(saved_model, "saved_model.pb")), "settings": {},
                             "deleteAfterConversion": False})
        shown = {g["id"]: {n["id"] for n in g["nodes"]} for c in json.loads(body)["graphCollections"]
                 for g in c["graphs"]}
        for graph_id, graph_data in overlay_file.items():
            assert set(graph_data["results"]) <= shown[graph_id]
    finally:
        proc.send_signal(stop)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"view did not stop within 15 s of {stop.name}")
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == code, err[-1500:]
    assert "Traceback" not in err
