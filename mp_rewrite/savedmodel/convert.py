"""SavedModel conversion: rewrite the functions a SavedModel's signatures and restored objects run, and write a new
SavedModel (same signatures, variables, assets and object graph) that appears at the output path only when complete.

A TF2 SavedModel computes in its function library: each signature's output is a StatefulPartitionedCall in the
MetaGraph's main graph into a signature wrapper, which calls the traced `__inference_*` function, which may call
more (While/If/Case bodies, nested tf.functions). Every function reachable from the selected signatures -- and,
when no signature is selected, from the concrete functions the object graph restores (what
`tf.saved_model.load(...).__call__` runs) -- is rewritten on its own by the core library rewrite, Grappler-style:
arguments and return values keep their dtypes, stateful and dataset ops are preserved. The main graph is rewritten
too, with every signature's tensors preserved (it holds the compute of TF1 SavedModels; in TF2 ones it only calls
functions, so it stays as it is). Save/restore functions and variables are left untouched.

This module reads and writes files and protos only; running models is mp_rewrite.verify's job.
"""

from __future__ import annotations

import dataclasses
import time

from google.protobuf import message, text_format
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from ..core.dtypes import target_dtype
from ..errors import ModelError, MpRewriteError, OptionError
from ..core.meta_graph import INTERNAL_PREFIX, functions_to_rewrite, nodes_to_preserve, signature_nodes
from ..core.graph_view import parse_input
from ..core.library import rewrite_library, skipped_functions
from .model_dir import absolute_output, check_output, model_file, write_model_dir
from .keras_metadata import METADATA_FILE, check_mode, has_keras_metadata, metadata_note
from .output_lock import output_lock
from .source_check import check_source, check_written, node_names
from ..core.op_support import Signatures
from ..core.oplists import LIST_NAMES, OpLists, check_op_names, load_lists
from ..core.body import RewriteResult, make_options, rewrite_body
from ..core.pass_context import check_patterns_match

WEIGHTS = ("keep", "low")


@dataclasses.dataclass
class ConversionResult:
    """What `convert_saved_model` did.

    Attributes:
        source, output: the SavedModel directories read and written.
        precision, device: the options used.
        signatures: the signature keys whose functions were rewritten.
        graphs: MetaGraph tags ("serve") -> RewriteResult of its main graph; `.functions` holds the RewriteResult
            of every function body rewritten in that MetaGraph.
        skipped: function name -> why it was reachable but not rewritten (parametrised, tf.data).
        flops: mp_rewrite.flops.FlopShare over everything rewritten, or None when not estimated.
        function_flops: function name -> its own FlopShare.
        graph_flops: MetaGraph tags -> FlopShare of its main graph (where TF1 SavedModels compute).
        seconds: wall time of the conversion.
        notes: what the user must know about the output (e.g. how to load a converted tf_keras model).
        frozen: True for a --freeze conversion (graphs then maps "signature KEY (frozen)" to its RewriteResult).
    """

    source: str
    output: str
    precision: str
    device: str
    signatures: tuple
    graphs: dict
    skipped: dict
    flops: object = None
    function_flops: dict = dataclasses.field(default_factory=dict)
    graph_flops: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    frozen: bool = False
    notes: list = dataclasses.field(default_factory=list)

    @property
    def functions(self) -> dict:
        """Function name -> RewriteResult, over every MetaGraph."""
        return {name: r for g in self.graphs.values() for name, r in g.functions.items()}

    @property
    def converted_nodes(self) -> int:
        """Nodes now computing in low precision, main graphs and functions together (shared graphs once)."""
        return sum(len(r.converted_nodes) for r in self._results())

    @property
    def casts(self) -> int:
        """Casts inserted, main graphs and functions together (a graph frozen for two signatures counts once)."""
        return sum(len(r.casts) for r in self._results())

    def _results(self) -> list:
        return list({id(r): r for r in list(self.graphs.values()) + list(self.functions.values())}.values())

    def summary(self) -> str:
        """One line: what was converted, with how many casts, and the low-precision share of matmul/conv FLOPs."""
        line = (f"converted {self.converted_nodes} nodes in {len(self.functions)} functions to {self.precision} "
                f"with {self.casts} casts")
        share = self.flops.share if self.flops is not None else None
        if share is not None:
            line += f"; {share:.1%} of matmul/conv FLOPs now in {self.precision}"
        return f"{line} ({self.seconds:.1f} s) -> {self.output}"


# --------------------------------------------------------------------------------------------- reading


def read_saved_model(directory) -> saved_model_pb2.SavedModel:
    """Parse a SavedModel directory's saved_model.pb (or .pbtxt).

    Raises:
        ModelError: no SavedModel there, an unreadable or corrupt file, or no MetaGraph in it.
    """
    path = model_file(directory)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read '{path}': {e.strerror}") from None
    saved_model = saved_model_pb2.SavedModel()
    try:
        if path.suffix == ".pbtxt":
            text_format.Parse(data.decode("utf-8"), saved_model)
        else:
            saved_model.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"'{path}' is not a valid SavedModel proto (corrupt or truncated file?): {reason}") from None
    if not saved_model.meta_graphs:
        raise ModelError(f"'{path}' holds no MetaGraph (corrupt file, or not a SavedModel); re-export the model")
    return saved_model


def signature_keys(saved_model: saved_model_pb2.SavedModel) -> list[str]:
    """The user signature keys of every MetaGraph, sorted (internal ones like __saved_model_init_op left out)."""
    return sorted({k for mg in saved_model.meta_graphs for k in mg.signature_def if not k.startswith(INTERNAL_PREFIX)})


def select_signatures(saved_model: saved_model_pb2.SavedModel, wanted=None) -> tuple | None:
    """Check the requested signature keys; None (all signatures and the object graph's functions) stays None.

    Raises:
        ModelError: a requested key is not a signature of the SavedModel.
    """
    if not wanted:
        return None
    wanted = (wanted,) if isinstance(wanted, str) else tuple(wanted)
    known = signature_keys(saved_model)
    for key in wanted:
        if key not in known:
            have = ", ".join(known) or "none"
            raise ModelError(f"the SavedModel has no signature '{key}' (its signatures: {have})")
    return tuple(dict.fromkeys(wanted))


def _preserved_main_nodes(meta_graph: meta_graph_pb2.MetaGraphDef) -> list[str]:
    """Main-graph nodes that keep their dtypes: what Grappler preserves for a MetaGraphDef (saver, collections,
    initializers, feeds and fetches), and the asset tensors a SavedModel loader feeds."""
    present = {n.name for n in meta_graph.graph_def.node}
    assets = [parse_input(a.tensor_info.name)[0] for a in meta_graph.asset_file_def if a.tensor_info.name]
    return list(dict.fromkeys([*nodes_to_preserve(meta_graph), *(n for n in assets if n in present)]))


# --------------------------------------------------------------------------------------------- rewriting


def _as_tuple(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value or ())


def effective_lists(precision: str, lists: OpLists | None = None, lists_file: str | None = None, allow=(),
                    infer=(), deny=(), clear=(), remove=()) -> OpLists | None:
    """The op lists of a conversion: `lists` (else the built-in lists with TF's environment variables and
    `lists_file`), with every op named in allow/infer/deny/clear moved into that list (out of any other), and every
    op named in `remove` taken out of every list (it then keeps its dtype).

    Returns:
        The OpLists, or None when nothing changes the built-in ones (the core then loads them itself).

    Raises:
        OptionError: an op named for two lists, or both `lists` and `lists_file` given.
        ListError: a bad lists file, or an op name TensorFlow does not know.
    """
    target = {}
    for name, ops in zip(LIST_NAMES, (allow, infer, deny, clear)):
        for op in check_op_names(_as_tuple(ops), f"--{name}"):
            if target.get(op, name) != name:
                raise OptionError(f"op {op!r} is given to both --{target[op]} and --{name}; give it to one list")
            target[op] = name
    for op in check_op_names(_as_tuple(remove), "--remove"):
        if op in target:
            raise OptionError(f"op {op!r} is given to both --{target[op]} and --remove; give it to one of them")
        target[op] = None
    if lists is not None and lists_file:
        raise OptionError("give either lists (an OpLists) or lists_file (a TOML file), not both")
    if lists is None and not lists_file and not target:
        return None
    base = lists if lists is not None else load_lists(precision, lists_file=lists_file)
    if not target:
        return base
    add = {name: [op for op, t in target.items() if t == name] for name in LIST_NAMES if name in target.values()}
    remove = {name: [op for op, t in target.items() if t != name] for name in LIST_NAMES}
    return base.with_changes(add, remove, source="options")


def _rewrite_functions(library, opts, signatures: Signatures, todo: list, progress) -> dict:
    """rewrite_library over `todo`, naming the function that failed in the error."""
    done = []

    def report(count, total, name):
        done.append(name)
        if progress is not None:
            progress(count, total, name)
    try:
        return rewrite_library(library, opts, signatures, todo, report)
    except MpRewriteError as e:
        failing = todo[len(done)] if len(done) < len(todo) else "?"
        raise ModelError(f"cannot rewrite function '{failing}' of the SavedModel: {e}") from e


def rewrite_meta_graph(meta_graph: meta_graph_pb2.MetaGraphDef, opts, keys=None,
                       progress=None) -> tuple[meta_graph_pb2.MetaGraphDef, RewriteResult, dict]:
    """Rewrite one MetaGraph (a copy is returned; the input is never modified).

    Args:
        meta_graph: the MetaGraphDef.
        opts: rewrite Options (mp_rewrite.rewrite.make_options).
        keys: signature keys whose functions to rewrite; None: every signature and the object graph's functions.
        progress: optional callable (done, total, function name), after each function.

    Returns:
        (new MetaGraphDef, RewriteResult of the main graph with `.functions` filled, {skipped function: why}).

    Raises:
        GraphError, StageError, ModelError: the main graph or a function body cannot be rewritten.
    """
    graph = meta_graph.graph_def
    signatures = Signatures(graph.library)
    result = rewrite_body(graph, opts, signature_nodes(meta_graph), _preserved_main_nodes(meta_graph), signatures)
    names = functions_to_rewrite(meta_graph, keys)
    skipped = {n: why for n, why in skipped_functions(graph.library).items() if n in names}
    todo = [n for n in names if n not in skipped]
    result.functions = _rewrite_functions(result.graph_def.library, opts, signatures, todo, progress)
    new = meta_graph_pb2.MetaGraphDef()
    new.CopyFrom(meta_graph)
    new.graph_def.CopyFrom(result.graph_def)
    return new, result, skipped


def rewrite_saved_model(saved_model: saved_model_pb2.SavedModel, opts, keys=None,
                        progress=None) -> tuple[saved_model_pb2.SavedModel, dict, dict]:
    """Rewrite every MetaGraph of a SavedModel proto (see rewrite_meta_graph).

    Returns:
        (new SavedModel, {MetaGraph tags: RewriteResult}, {skipped function: why}).
    """
    new = saved_model_pb2.SavedModel(saved_model_schema_version=saved_model.saved_model_schema_version)
    graphs, skipped = {}, {}
    for index, meta_graph in enumerate(saved_model.meta_graphs):
        rewritten, result, skipped_here = rewrite_meta_graph(meta_graph, opts, keys, progress)
        new.meta_graphs.add().CopyFrom(rewritten)
        tags = ",".join(meta_graph.meta_info_def.tags) or f"metagraph {index}"
        graphs[tags if tags not in graphs else f"{tags} ({index})"] = result
        skipped.update(skipped_here)
    return new, graphs, skipped


def estimate_flops(graphs: dict) -> tuple:
    """FLOPs from known shapes: (FlopShare over every rewritten graph and function, {function name: FlopShare},
    {MetaGraph tags: FlopShare of the main graph})."""
    from ..analysis.flops import FlopShare, low_precision_flop_share, result_flops
    low = total = unknown = nodes = 0
    per_function, per_graph, seen = {}, {}, {}
    for tags, result in graphs.items():
        if id(result) in seen:  # a graph frozen for two signatures (Keras' serve, serving_default) counts once
            per_graph[tags] = per_graph[seen[id(result)]]
            continue
        seen[id(result)] = tags
        flops = result_flops(result)
        share = low_precision_flop_share(result, flops)
        low, total, unknown, nodes = low + share.low, total + share.total, unknown + share.unknown, nodes + share.nodes
        per_graph[tags] = low_precision_flop_share(result, {"": flops.get("", {})})
        for name, sub in result.functions.items():
            per_function[name] = low_precision_flop_share(sub, {"": flops.get(name, {})})
    return FlopShare(low, total, unknown, nodes), per_function, per_graph


# --------------------------------------------------------------------------------------------- the API


def convert_saved_model(source, output, precision: str = "float16", *, signatures=None, device: str | None = None,
                        lists: OpLists | None = None, lists_file: str | None = None, allow=(), infer=(), deny=(),
                        clear=(), keep_fp32=(), force_low=(), level: str | None = None, weights: str = "keep",
                        freeze: bool = False, keras_metadata: str = "keep", overwrite: bool = False,
                        flops: bool = True, progress=None) -> ConversionResult:
    """Convert a SavedModel to mixed precision: a new SavedModel with the same signatures (names, inputs, outputs,
    dtypes, shapes), variables, assets and object graph, whose functions compute in float16 or bfloat16.

    Args:
        source: the SavedModel directory (only read).
        output: the new SavedModel directory; it appears only when complete.
        precision: "float16" or "bfloat16".
        signatures: signature keys to convert (a str or several); None converts every signature and every function
            the object graph restores (what `tf.saved_model.load(...)` calls).
        device: "gpu", "cpu" or "any"; None: "gpu" for float16, "cpu" for bfloat16 (see rewrite_graph_def).
        lists: an OpLists for `precision` (mp_rewrite.load_lists); None: built-in lists, TF's env variables, lists_file.
        lists_file: a TOML file of list changes (see mp_rewrite.oplists.changes_from_file).
        allow, infer, deny, clear: op names moved into that list.
        keep_fp32, force_low, level: as for rewrite_graph_def (node-name patterns match nodes of function bodies).
        weights: "keep" stores variables as they are (with freeze=True: every weight consumed only in low precision
            in low precision, one read in both precisions in both); "low" needs freeze=True and refuses a weight
            that is also read in float32 (ModelError naming it), so every weight read in low precision is stored
            in low precision only.
        keras_metadata: "keep" copies a tf_keras model's keras_metadata.pb (tf_keras.models.load_model then runs
            float32 layers: result.notes says so), "drop" leaves it out (load_model then refuses the model).
        freeze: an inference artifact (mp_rewrite.savedmodel.freeze): variables folded into constants, Grappler's
            constant folding and arithmetic optimizer, then the pass; only the signatures are kept.
        overwrite: replace an existing output (a SavedModel or an empty directory), once the new one is complete.
        flops: estimate the share of matmul/conv FLOPs in low precision (result.flops).
        progress: optional callable (done, total, function name), called after each function body is rewritten.

    Returns:
        A ConversionResult.

    Raises:
        OptionError, ListError: bad options. ModelError: bad source or output, unknown signature, write failure.
        GraphError, StageError: a graph the pass cannot handle.
    """
    start = time.perf_counter()
    target_dtype(precision)
    if weights not in WEIGHTS:
        raise OptionError(f"unknown weights mode {weights!r}: use 'keep' or 'low'")
    if weights == "low" and not freeze:
        raise OptionError("--weights low needs --freeze: variables stay float32 in a SavedModel that keeps them; "
                          "with --freeze, weights consumed only in low precision are stored in low precision")
    check_mode(keras_metadata)
    chosen = effective_lists(precision, lists, lists_file, allow, infer, deny, clear)
    opts = make_options(precision, device, chosen, keep_fp32, force_low, level)
    # The lock is held from the output check to the rename, so that no other run interleaves with this one.
    with output_lock(absolute_output(output)):
        source_dir, output_dir = check_output(source, output, overwrite)
        saved_model = read_saved_model(source_dir)
        check_source(source_dir, saved_model)
        keys = select_signatures(saved_model, signatures)
        if freeze:
            from .freeze import convert_frozen
            return convert_frozen(source, output, source_dir, output_dir, saved_model, keys, opts, overwrite,
                                   flops, progress, start, weights)
        new, graphs, skipped = rewrite_saved_model(saved_model, opts, keys, progress)
        names = node_names(new, {name for result in graphs.values() for name in result.functions})
        for option in ("keep_fp32", "force_low"):
            check_patterns_match(getattr(opts, option), option, names)
        share, per_function, per_graph = estimate_flops(graphs) if flops else (None, {}, {})
        drop = (METADATA_FILE,) if keras_metadata == "drop" else ()
        write_model_dir(source_dir, output_dir, new, overwrite, drop=drop,
                        check=lambda written: check_written(source_dir, saved_model, written, new))
    notes = [metadata_note(output, keras_metadata)] if has_keras_metadata(source_dir) else []
    return ConversionResult(str(source), str(output), opts.precision, opts.device,
                            keys or tuple(signature_keys(saved_model)), graphs, skipped, share, per_function,
                            per_graph, time.perf_counter() - start, notes=notes)
