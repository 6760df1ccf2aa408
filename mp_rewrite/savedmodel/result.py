"""What a conversion produces: a strategy's `Rewritten` SavedModel (before it is written) and the
`ConversionResult` the orchestrator returns."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class Rewritten:
    """A strategy's output, ready to be checked and written by the orchestrator.

    Attributes:
        saved_model: the new SavedModel proto.
        files: the directory whose other files (variables, assets, assets.extra, ...) go with it.
        graphs: label -> RewriteResult (MetaGraph tags, or "signature KEY (frozen)").
        skipped: function name -> why it was reachable but not rewritten.
        node_names: the names the user's keep_fp32/force_low patterns are checked against.
        keys: the signature keys converted.
        drop: top-level file names of `files` not to copy.
        notes: what the user must know about the output.
        staging: a temporary directory of the strategy's, removed once written (None: nothing to remove).
        split: the in-place split's lines (split_in_place.py), also in `notes`.
    """

    saved_model: object
    files: Path
    graphs: dict
    skipped: dict
    node_names: object
    keys: tuple
    drop: tuple = ()
    notes: list = dataclasses.field(default_factory=list)
    staging: str | None = None
    split: tuple = ()


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
        ran: the signature keys called on the written copy before it was moved into place (the run check); None
            when the check was skipped. Signatures not run are in `notes`.
        written: (nodes computing in the low precision, Casts to or from it) read back from the written copy, less
            the source's own (low_precision_counts); what the summary line reports.
        opaque: the XlaCallModule ops written unchanged (model/xla_modules.py; with allow_opaque_xla), whose work
            no FLOP figure counts.
        split: what `split` made of each signature, one line each (also in `notes`; the CLI prints them as
            "split: ..." lines).
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
    ran: tuple | None = None
    written: tuple | None = None
    opaque: tuple = ()
    split: tuple = ()

    @property
    def functions(self) -> dict:
        """Function name -> RewriteResult, over every MetaGraph."""
        return {name: r for g in self.graphs.values() for name, r in g.functions.items()}

    @property
    def converted_nodes(self) -> int:
        """Nodes now computing in low precision, main graphs and functions together (shared graphs once)."""
        return sum(len(r.converted_nodes) for r in self.results())

    @property
    def casts(self) -> int:
        """Casts inserted, main graphs and functions together (a graph frozen for two signatures counts once)."""
        return sum(len(r.casts) for r in self.results())

    def results(self) -> list:
        """Every RewriteResult, main graphs and functions together, each once."""
        return list({id(r): r for r in list(self.graphs.values()) + list(self.functions.values())}.values())

    def summary(self) -> str:
        """One line: what was converted, with how many casts, and the low-precision share of matmul/conv FLOPs."""
        line = (f"converted {self.converted_nodes} nodes in {len(self.functions)} functions to {self.precision} "
                f"with {self.casts} casts")
        share = self.flops.share if self.flops is not None else None
        if share is not None:
            line += f"; {share:.1%} of matmul/conv FLOPs now in {self.precision}"
        return f"{line} ({self.seconds:.1f} s) -> {self.output}"


def low_precision_counts(saved_model, precision: str) -> tuple[int, int]:
    """(nodes with a type attr of `precision`, other than Casts and Consts; Casts to or from it) over every main
    graph and library function of a SavedModel proto: what a written copy holds, whatever the rewrite recorded."""
    from ..core import dtypes
    low = dtypes.PRECISIONS[precision]
    nodes = casts = 0
    for meta_graph in saved_model.meta_graphs:
        bodies = [meta_graph.graph_def.node, *(f.node_def for f in meta_graph.graph_def.library.function)]
        for node in (node for body in bodies for node in body):
            types = {v.type for v in node.attr.values()} | {t for v in node.attr.values() for t in v.list.type}
            if low in types:
                casts += node.op == "Cast"
                nodes += node.op not in ("Cast", "Const")
    return nodes, casts
