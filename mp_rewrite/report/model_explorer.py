"""The Model Explorer overlay: node data for Google's Model Explorer (`ai-edge-model-explorer`, the `viz` extra)
that colors every node of the model as the pictures do (palette.FILL) and says its dtype and decision.

Model Explorer's node data is keyed by its adapter's node ids ("0", "17", ...), not by TensorFlow node names, so
the overlay runs Model Explorer's own adapter on the model and joins on the adapter's `namespace` (the TF node name)
and `label` (the op type). The adapter is fixed per model kind, and `mp-rewrite view` opens the model with the same
one, so ids and graph names agree: a SavedModel with the "TF adapter (direct)" (graph "main" and one graph per
library function, named as the function) and a GraphDef file with the "GraphDef adapter" (graph "main").

Only the model's own nodes can be colored: Casts the rewrite inserts are not in the model Model Explorer reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import sys

from ..errors import ModelError, OptionError

# palette and wording are imported where used: they import the core, hence TensorFlow, and the checks here run
# before TensorFlow starts.

PACKAGE = "ai-edge-model-explorer"
MODULES = ("model_explorer", "ai_edge_model_explorer_adapter")
MISSING = f"Model Explorer is not installed: pip install 'mp_rewrite[viz]' (or pip install {PACKAGE})"
SAVED_MODEL_ADAPTER = "builtin_tf_direct"
GRAPH_DEF_ADAPTER = "builtin_graphdef"
MAIN_GRAPH = "main"  # the adapters' id of the main graph
# A function body's arguments and results, which the adapter draws as its GraphInputs / GraphOutputs nodes.
BOUNDARY_OPS = ("_Arg", "_Retval", "_DeviceArg", "_DeviceRetval")


def is_installed() -> bool:
    """True if Model Explorer and its adapter can be imported (looked up without importing them)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in MODULES)
    except (ImportError, ValueError):
        return False


def require_installed() -> None:
    """Raise OptionError (naming the `viz` extra) if Model Explorer is not installed; imports nothing."""
    if not is_installed():
        raise OptionError(MISSING)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """What Model Explorer opens for a model: a file path and the id of the adapter that reads it."""

    path: str
    adapter: str


def model_source(model) -> ModelSource:
    """The file and adapter Model Explorer reads a LoadedModel with.

    Raises:
        ModelError: Model Explorer has no adapter for the model (a MetaGraphDef file, a text SavedModel).
    """
    if model.kind == "saved_model":
        path = os.path.join(model.path, "saved_model.pb") if os.path.isdir(model.path) else model.path
        if not path.endswith("saved_model.pb"):
            raise ModelError(f"'{model.path}': Model Explorer reads a binary saved_model.pb, not "
                             f"{os.path.basename(path)}")
        return ModelSource(os.path.abspath(path), SAVED_MODEL_ADAPTER)
    if model.kind == "graph_def":
        return ModelSource(os.path.abspath(model.path), GRAPH_DEF_ADAPTER)
    raise ModelError(f"'{model.path}' is a MetaGraphDef: Model Explorer opens SavedModels and GraphDefs; give the "
                     "SavedModel directory or the GraphDef it holds")


@contextlib.contextmanager
def _stderr_silenced(quiet: bool):
    """File descriptor 2 to /dev/null while `quiet`: the adapter's C++ module bundles parts of TensorFlow that log
    start-up lines (cudart, absl's pre-init warning) past TF_CPP_MIN_LOG_LEVEL."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def adapter_graphs(source: ModelSource, quiet: bool = False) -> list[dict]:
    """The graphs Model Explorer shows for `source`, as its adapter makes them (dicts with "id" and "nodes").

    Raises:
        OptionError, ModelError: as adapter_collections.
    """
    return [graph for collection in adapter_collections(source, quiet) for graph in collection.graphs]


def adapter_collections(source: ModelSource, quiet: bool = False) -> list:
    """The GraphCollections Model Explorer's adapter makes of `source`.

    Args:
        source: model_source(model).
        quiet: keep the adapter's C++ log lines out of stderr.

    Raises:
        OptionError: Model Explorer is not installed.
        ModelError: the adapter failed on the model.
    """
    require_installed()
    with _stderr_silenced(quiet):
        from model_explorer.builtin_graphdef_adapter import BuiltinGraphdefAdapter
        from model_explorer.builtin_tf_direct_adapter import BuiltinTfDirectAdapter
        adapter = {SAVED_MODEL_ADAPTER: BuiltinTfDirectAdapter, GRAPH_DEF_ADAPTER: BuiltinGraphdefAdapter}
        try:
            collections = adapter[source.adapter]().convert(source.path, {})["graphCollections"]
        except Exception as e:  # the C++ converter raises RuntimeError/ValueError with TF's status message
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(f"Model Explorer's adapter '{source.adapter}' cannot read '{source.path}': "
                             f"{first}") from None
    return list(collections)


def network_first(collections: list, network: str, label: str) -> dict:
    """The adapter's graphs with the network's graph alone in a first collection: Model Explorer sorts a
    collection's graphs by node count and opens the first, which for a SavedModel is the signatures' "main"
    graph (mostly variable handles). Graph ids are unchanged, so the overlay still applies.

    Args:
        collections: adapter_collections(source).
        network: the graph id to open on.
        label: the first collection's label (the model's name).

    Returns:
        A ModelExplorerGraphs dict ({"graphCollections": [...]}) for ModelExplorerConfig.graphs_list.
    """
    from model_explorer.graph_builder import GraphCollection
    graphs = [g for c in collections for g in c.graphs]
    chosen = [g for g in graphs if _graph_id(g) == network]
    rest = [g for g in graphs if _graph_id(g) != network]
    if not chosen:
        return {"graphCollections": list(collections)}
    return {"graphCollections": [GraphCollection(label=f"{label} (network)", graphs=chosen),
                                 GraphCollection(label=f"{label} (all other graphs)", graphs=rest)]}


def _graph_id(graph) -> str:
    """The id of an adapter graph (the direct TF adapter gives dicts, others Graph objects)."""
    return graph["id"] if isinstance(graph, dict) else graph.id


def node_value(row) -> str:
    """The text Model Explorer shows for a node: "bfloat16 (allow: allow list)", "float32 (deny: deny list)"."""
    from .palette import dtype_label
    from .wording import reason_text
    decision = row.decision
    if decision is None:
        return "untouched (no type attributes)"
    return f"{dtype_label(decision.dtype_after)} ({row.node_class}: {reason_text(decision.reason)})"


@dataclasses.dataclass
class Overlay:
    """Model Explorer node data and how it joined the model.

    Attributes:
        data: graph id -> {"name", "results": {node id: {"value", "bgColor"}}, ...}: the JSON of Model Explorer's
            node_data_builder.ModelNodeData.
        source: the file and adapter the node ids belong to.
        colored: nodes given a value, over all graphs.
        casts: inserted Casts (in our rewrite, not in the model: nothing to color).
        missing: (graph, node) of our graphs' nodes the adapter does not show (inserted Casts excluded).
        graphs_without_table: adapter graphs the rewrite did not cover (save/restore functions, ...).
    """

    data: dict
    source: ModelSource
    colored: int = 0
    casts: int = 0
    missing: list = dataclasses.field(default_factory=list)
    graphs_without_table: list = dataclasses.field(default_factory=list)
    network: str = MAIN_GRAPH
    collections: list = dataclasses.field(default_factory=list, repr=False)

    def to_json(self, indent: int | None = 1) -> str:
        """The node data file Model Explorer loads ({graph id: {"results": ...}})."""
        return json.dumps(self.data, indent=indent)

    def summary(self) -> str:
        """One line: what was colored and what could not be."""
        graphs = len(self.data)
        line = f"{self.colored} nodes colored in {graphs} graph{'s' if graphs != 1 else ''}"
        if self.casts:
            line += f"; {self.casts} inserted Casts are not in the model Model Explorer reads"
        if self.missing:
            line += f"; {len(self.missing)} nodes not found in Model Explorer's graphs (e.g. {self.missing[0][1]})"
        if self.network != MAIN_GRAPH:
            line += f"; the network is graph '{self.network}' (the function the signatures call)"
        return line


def _graph_data(table, nodes: list, name: str) -> tuple[dict, list, int]:
    """(results by node id, (graph, name) of table rows not found, Casts skipped) for one graph."""
    from .palette import FILL
    ids = {(n.get("namespace"), n.get("label")): n["id"] for n in nodes}
    results, missing, casts = {}, [], 0
    for row in table.rows.values():
        if row.cast is not None:
            casts += 1
            continue
        if row.op in BOUNDARY_OPS:
            continue
        node_id = ids.get((row.name, row.op))
        if node_id is None:
            missing.append((table.name, row.name))
            continue
        results[node_id] = {"value": node_value(row), "bgColor": FILL[row.node_class]}
    return results, missing, casts


def build_overlay(tables, graphs: list[dict], source: ModelSource, precision: str) -> Overlay:
    """Join the rows of `tables` (node_table.build_tables) to the adapter's graphs by node name and op.

    Args:
        tables: GraphTables of the rewrite (main graph "" and functions by name).
        graphs: adapter_graphs(source).
        source: the model file and adapter.
        precision: "float16" or "bfloat16" (names the node data in Model Explorer).

    Returns:
        An Overlay with an entry for every adapter graph the rewrite covered.
    """
    by_name = {table.name: table for table in tables}
    overlay = Overlay({}, source)
    for graph in graphs:
        table = by_name.get("" if graph["id"] == MAIN_GRAPH else graph["id"])
        if table is None:
            overlay.graphs_without_table.append(graph["id"])
            continue
        results, missing, casts = _graph_data(table, graph.get("nodes", []), graph["id"])
        overlay.data[graph["id"]] = {"name": f"mp-rewrite {precision}", "results": results,
                                     "showLabelCountColumnsInChildrenStatsTable": True}
        overlay.colored += len(results)
        overlay.missing += missing
        overlay.casts += casts
    shown = {"" if g["id"] == MAIN_GRAPH else g["id"] for g in graphs}
    overlay.missing += [(t.name, name) for t in tables if t.name not in shown
                        for name, row in t.rows.items() if row.cast is None and row.op not in BOUNDARY_OPS]
    return overlay


def to_model_explorer(result, model, function: str | None = None, tables=None, quiet: bool = False) -> Overlay:
    """The Model Explorer overlay of a rewrite of `model` (a LoadedModel), joined to Model Explorer's graphs.

    Args:
        result: the RewriteResult of `model`.
        model: the LoadedModel that was rewritten (its path is what Model Explorer opens).
        function: only this rewritten function ("" for the main graph only); None for all graphs.
        tables: build_tables(result, function), if already built.
        quiet: keep the adapter's C++ log lines out of stderr.

    Raises:
        OptionError: Model Explorer is not installed; an unknown function.
        ModelError: Model Explorer cannot open the model.
    """
    from .node_table import build_tables
    from .network import network_table
    source = model_source(model)
    collections = adapter_collections(source, quiet)
    tables = build_tables(result, function, with_flops=False) if tables is None else tables
    overlay = build_overlay(tables, [g for c in collections for g in c.graphs], source, result.precision)
    overlay.network = network_table(tables).name or MAIN_GRAPH
    overlay.collections = collections
    return overlay
