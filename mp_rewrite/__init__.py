"""mp_rewrite: an explainable, Grappler-faithful mixed precision graph rewriter for TensorFlow.

The public names are imported lazily, so `import mp_rewrite` (and `mp-rewrite --version`) does not start
TensorFlow until something needs it.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "rewrite_graph_def": "rewrite", "RewriteResult": "rewrite",
    "OpLists": "oplists", "builtin_lists": "oplists", "load_lists": "oplists",
    "MpRewriteError": "errors", "GraphError": "errors", "ListError": "errors", "ModelError": "errors",
    "OptionError": "errors", "StageError": "errors",
    "enable_mixed_precision_graph_rewrite": "training", "disable_mixed_precision_graph_rewrite": "training",
    "mixed_precision_graph_rewrite": "training", "rewritten_functions": "training", "rewrite_failures": "training",
    "LossScaleOptimizer": "loss_scale",
    "guard": "accuracy_guard", "GuardResult": "accuracy_guard", "load_overrides": "accuracy_guard",
    "guard_saved_model": "guard_saved_model",
    "convert_saved_model": "saved_model", "ConversionResult": "saved_model",
    "verify_saved_models": "verify", "compare_outputs": "verify", "OutputCheck": "verify", "VerifyReport": "verify",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mp_rewrite' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
