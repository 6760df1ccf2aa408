"""The accuracy guard for SavedModels (a front end: it loads the model in TensorFlow).

A TF2 SavedModel computes in function bodies that read variables, which `run_graph_def` cannot run. So one
signature is frozen into a single graph (savedmodel/frozen_signature.py, as `convert --freeze` freezes it: the body
node "model/dense/MatMul" becomes "StatefulPartitionedCall/model/dense/MatMul"), the guard runs on that graph, and the
nodes it keeps are mapped back to the body nodes, as keep_fp32 patterns for `convert_saved_model`, which rewrites
the bodies themselves. The calibration inputs are made as `mp-rewrite verify` makes them (an .npz or a dict keyed
by input name or "SIGNATURE/name"; random for inputs not given), so `convert --guard --verify` checks what the
guard measured.
"""

from __future__ import annotations

import dataclasses

from ..errors import ModelError
from ..savedmodel.inputs import DEFAULT_BATCH
from .accuracy_guard import GuardResult, exact_patterns, guard
from .result import write_overrides


@dataclasses.dataclass
class SavedModelGuard:
    """The guard's outcome for one signature of a SavedModel.

    Attributes:
        result: the GuardResult on the frozen signature graph.
        signature: the signature key guarded.
        keep_fp32: patterns matching the kept nodes in the SavedModel's own graphs (function bodies, main graph),
            to pass to convert_saved_model together with the user's own.
        nodes: frozen-graph node -> (SavedModel node, its pattern) for every kept node that has one.
        unmapped: kept frozen-graph nodes with no counterpart in the SavedModel (inlining's own Identity nodes).
    """

    result: GuardResult
    signature: str
    keep_fp32: tuple
    nodes: dict
    unmapped: tuple

    def save_overrides(self, path):
        """Write the keep set in the SavedModel's names (TOML for ".toml", JSON otherwise), for
        `convert --keep-fp32-file` / load_overrides; the user's own patterns are not in it."""
        data = self.result.overrides()
        data["keep_fp32"] = list(self.keep_fp32)
        data["nodes"] = [{**n, "node": self.nodes[n["node"]][0], "pattern": self.nodes[n["node"]][1]}
                         for n in data["nodes"] if n["node"] in self.nodes]
        data["signature"] = self.signature
        return write_overrides(path, data)


def body_nodes(kept, graph_def) -> tuple:
    """({frozen node: (SavedModel node, exact keep_fp32 pattern)}, unmapped frozen nodes) for the SavedModel nodes
    the frozen `kept` nodes came from.

    A frozen name maps to the longest of its "/"-suffixes that names a node of the SavedModel's main graph or of a
    function body (the fewest inlining prefixes stripped).
    """
    names = [n.name for n in graph_def.node] + [n.name for f in graph_def.library.function for n in f.node_def]
    known = set(names)
    mapped, unmapped = {}, []
    for name in kept:
        parts = name.split("/")
        match = next(("/".join(parts[i:]) for i in range(len(parts)) if "/".join(parts[i:]) in known), None)
        if match is None:
            unmapped.append(name)
        else:
            mapped[name] = match
    patterns = exact_patterns(set(mapped.values()), names)
    return {frozen: (body, patterns[body]) for frozen, body in mapped.items()}, tuple(unmapped)


def guard_saved_model(source, inputs=None, signature: str | None = None, precision: str = "float16",
                      rtol: float | None = None, atol: float | None = None, *, batch_size: int = DEFAULT_BATCH,
                      seed: int = 0, tag_set=None, **rewrite_options) -> SavedModelGuard:
    """Run the accuracy guard on one signature of a SavedModel.

    Args:
        source: the SavedModel directory.
        inputs: calibration inputs: a dict or an .npz path keyed by input name (or "SIGNATURE/name"); inputs not
            given are random, as `mp-rewrite verify` makes them (batch_size, seed).
        signature: the signature to guard; None takes "serving_default", else the first.
        tag_set: the MetaGraph to guard ("serve,gpu"); None: the only one, or the only "serve" one.
        precision, rtol, atol, **rewrite_options: as for guard(); keep_fp32/force_low patterns are matched against
            the frozen graph's names with their inlining prefixes too.

    Returns:
        A SavedModelGuard; pass `.keep_fp32` (plus the user's own patterns) to convert_saved_model.

    Raises:
        ModelError: the model cannot be loaded, frozen or fed; OptionError: bad options.
    """
    from ..model.files import read_saved_model
    from ..model.runtime import load_saved_model
    from ..model.signatures import check_signature_keys, default_signature, require_signatures
    from ..model.tags import load_tags, parse_tag_set, single_meta_graph
    from ..savedmodel.frozen_signature import freeze_signature, inlined_patterns
    from ..savedmodel.inputs import check_finite, check_given_keys, load_inputs, signature_inputs
    _, meta_graph = single_meta_graph(read_saved_model(source), parse_tag_set(tag_set), "the accuracy guard")
    loaded = load_saved_model(source, "original", load_tags(meta_graph))
    keys = sorted(loaded.signatures.keys())
    key = check_signature_keys(signature, keys)[0] if signature else default_signature(require_signatures(keys, source))
    given = load_inputs(inputs) if isinstance(inputs, (str, bytes)) or hasattr(inputs, "__fspath__") else inputs
    given = dict(given or {})
    specs = loaded.signatures[key].structured_input_signature[1]
    check_given_keys(given, {key: specs})  # a misspelt key would silently become random data
    check_finite(given)
    arrays, _ = signature_inputs(key, specs, given, batch_size, seed)
    frozen = freeze_signature(loaded, key)
    if frozen.captured:
        raise ModelError(f"cannot guard signature '{key}': it reads lookup tables ({frozen.captured[0][0]}), which "
                         "a frozen GraphDef cannot hold; convert without --guard")
    for option in ("keep_fp32", "force_low"):
        if rewrite_options.get(option):
            rewrite_options[option] = inlined_patterns(rewrite_options[option])
    feeds = {frozen.feeds[k].split(":")[0]: v for k, v in arrays.items()}
    result = guard(frozen.graph_def, frozen.fetches, feeds, precision, rtol, atol, **rewrite_options)
    nodes, unmapped = body_nodes([k.node for k in result.kept], meta_graph.graph_def)
    keep = tuple(dict.fromkeys(pattern for _, pattern in nodes.values()))
    return SavedModelGuard(result, key, keep, nodes, unmapped)
