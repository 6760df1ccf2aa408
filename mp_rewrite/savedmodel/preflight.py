"""Everything a conversion checks before it rewrites, as one call a front end makes before slow work of its own (the
accuracy guard runs for minutes before converting): a bad option or source then fails in a second, not after."""

from __future__ import annotations

from ..core.body import make_options
from ..core.pass_context import check_patterns_match
from ..core.meta_graph import functions_to_rewrite
from .convert import effective_lists, read_saved_model, select_signatures
from .model_dir import check_output
from .source_check import check_source, node_names


def check_conversion(source, output, precision: str = "float16", *, signatures=None, device: str | None = None,
                     lists_file: str | None = None, allow=(), infer=(), deny=(), clear=(), keep_fp32=(),
                     force_low=(), level: str | None = None, overwrite: bool = False) -> None:
    """Check what `convert_saved_model` would check before writing, without rewriting: the options and op lists,
    the source (files, variables, references) and output paths, the signatures, and that every keep_fp32 /
    force_low pattern matches a node of the graphs and functions that would be rewritten.

    Raises:
        OptionError, ListError, ModelError, GraphError: as convert_saved_model would.
    """
    chosen = effective_lists(precision, None, lists_file, allow, infer, deny, clear)
    opts = make_options(precision, device, chosen, keep_fp32, force_low, level)
    source_dir, _ = check_output(source, output, overwrite)
    saved_model = read_saved_model(source_dir)
    check_source(source_dir, saved_model)
    keys = select_signatures(saved_model, signatures)
    functions = {name for mg in saved_model.meta_graphs for name in functions_to_rewrite(mg, keys)}
    names = node_names(saved_model, functions)
    for option in ("keep_fp32", "force_low"):
        check_patterns_match(getattr(opts, option), option, names)
