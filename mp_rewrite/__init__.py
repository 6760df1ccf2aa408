"""mp_rewrite: an explainable, Grappler-faithful mixed precision graph rewriter for TensorFlow.

The package is the pass and its front ends; imports point one way (see docs/contracts.md):

    commands/  ->  savedmodel/, training/, guard/, report/  ->  analysis/, model/, rules/  ->  core/  (and errors)

The public names are imported lazily, so `import mp_rewrite` (and `mp-rewrite --version`) does not start
TensorFlow until something needs it.
"""

import importlib

from .core.observers import add_rewrite_observer as _add_rewrite_observer
from .report.dump import dump_on_demand as _dump_on_demand

from .version import __version__  # noqa: F401

_EXPORTS = {
    "rewrite_graph_def": "core.rewrite", "rewrite_meta_graph_def": "core.rewrite", "RewriteResult": "core.body",
    "Options": "core.options", "make_options": "core.options",
    "OpLists": "core.oplists", "builtin_lists": "core.oplists", "load_lists": "core.oplists",
    "add_rewrite_observer": "core.observers", "remove_rewrite_observer": "core.observers",
    "MpRewriteError": "errors", "GraphError": "errors", "ListError": "errors", "ModelError": "errors",
    "OptionError": "errors", "StageError": "errors",
    "enable_mixed_precision_graph_rewrite": "training.api", "disable_mixed_precision_graph_rewrite": "training.api",
    "enable_graph_rewrite": "training.api",
    "mixed_precision_graph_rewrite": "training.api", "rewritten_functions": "training.api",
    "rewrite_failures": "training.api", "finish_measuring": "training.api",
    "LossScaleOptimizer": "training.loss_scale.optimizer",
    "guard": "guard.accuracy_guard", "GuardResult": "guard.accuracy_guard", "load_overrides": "guard.accuracy_guard",
    "guard_saved_model": "guard.saved_model",
    "convert_saved_model": "savedmodel.convert", "ConversionResult": "savedmodel.result",
    "verify_saved_models": "savedmodel.verify", "VerifyReport": "savedmodel.verify",
    "compare_outputs": "analysis.compare", "OutputCheck": "analysis.compare",
}
__all__ = sorted(_EXPORTS)

# The core reports every rewrite to its observers; the dump behind $MP_REWRITE_DUMP_DIR is one (a no-op unless set).
_add_rewrite_observer(_dump_on_demand)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mp_rewrite' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
