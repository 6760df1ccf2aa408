"""mp_rewrite: an explainable, Grappler-faithful mixed precision graph rewriter for TensorFlow."""

__version__ = "0.1.0"
