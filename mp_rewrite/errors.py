"""The package's errors: one base class, each subclass says what went wrong, where, and what to do."""


class MpRewriteError(Exception):
    """Base class of every error mp_rewrite raises on bad input or a failed rewrite."""


class ListError(MpRewriteError):
    """An op list is malformed, or an op sits in two lists."""


class GraphError(MpRewriteError):
    """The GraphDef is malformed: a missing input node, an unknown op, a wrong input count."""


class OptionError(MpRewriteError):
    """An argument has a value mp_rewrite does not accept (precision, device, level, pattern)."""


class StageError(MpRewriteError):
    """A stage of the pass failed on a specific node."""

    def __init__(self, stage: str, node: str, op: str, message: str):
        super().__init__(f"stage '{stage}' failed on node '{node}' (op {op}): {message}")
        self.stage, self.node, self.op, self.message = stage, node, op, message


class ModelError(MpRewriteError):
    """A model (SavedModel, GraphDef file) cannot be read or written."""


class CostTableError(MpRewriteError):
    """A cost table file is malformed, or was measured for another TensorFlow, precision or model."""
