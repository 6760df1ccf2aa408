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


def tf_reason(error: BaseException) -> str:
    """TensorFlow's first words on why `error` happened, on one line, for a message to quote: the first line of its
    message, or, for a graph execution error (whose first line is only "Graph execution error:", followed by the node
    and where it was defined), the first line after that stack ("assertion failed: ...", "could not create a
    primitive ...", "indices[0,0] = 893 is not in [0, 100)")."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if lines and lines[0].strip() == "Graph execution error:":
        detected = next((i for i, line in enumerate(lines) if line.startswith("Detected at node")), 0)
        after = lines[detected + 1:]  # a session's error may say the message at once, without the node's stack
        # The stack's lines are indented, or say that it is unavailable; a session's error names the node first
        # ("Node: 'y'"); the node's own line after the message starts with a tab.
        said = [line for line in after if not line[0].isspace() and line.strip() != "<stack traces unavailable>"
                and not line.startswith("Node: ")]
        lines = said or lines
    return lines[0].strip() if lines else type(error).__name__
