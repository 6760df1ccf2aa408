"""mp_rewrite: an explainable, Grappler-faithful mixed precision graph rewriter for TensorFlow."""

__version__ = "0.1.0"

from .errors import GraphError, ListError, ModelError, MpRewriteError, OptionError, StageError  # noqa: E402
from .oplists import OpLists, builtin_lists, load_lists  # noqa: E402
from .rewrite import RewriteResult, rewrite_graph_def  # noqa: E402

__all__ = ["rewrite_graph_def", "RewriteResult", "OpLists", "builtin_lists", "load_lists", "MpRewriteError",
           "GraphError", "ListError", "ModelError", "OptionError", "StageError"]
