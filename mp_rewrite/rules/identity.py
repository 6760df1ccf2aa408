"""`identity_n`: what reads an IdentityN reads its inputs instead, and the IdentityN goes.

Keras 3 writes swish (and every activation defined with `tf.custom_gradient`) as `IdentityN(activation, its input,
...)`: in a frozen graph a pass-through, but one that reads the contraction's BiasAdd, and TF's remapper fuses a
BiasAdd into its convolution only when nothing outside the pattern reads it. Exact: IdentityN forwards its inputs.
"""

from __future__ import annotations

from .graph import EditableGraph, node_name
from .record import Match


def match_identity_n(graph: EditableGraph, node) -> Match | None:
    """An IdentityN nothing depends on as a whole: not fetched, no control input in or out."""
    if graph.is_kept(node):
        return Match().fail(f"'{node.name}' is fetched, so its outputs keep their name")
    if any(tensor.startswith("^") for tensor in node.input) or graph.control_readers(node.name):
        return Match().fail(f"'{node.name}' orders other nodes by a control dependency")
    return Match(nodes={"identity_n": node})


def rewrite_identity_n(graph: EditableGraph, match: Match) -> str:
    """Point each reader of `name:k` at the IdentityN's k-th input; remove the IdentityN."""
    node = match.nodes["identity_n"]
    for reader in graph.readers(node.name):
        for index, tensor in enumerate(reader.input):
            if node_name(tensor) == node.name:
                port = int(tensor.rpartition(":")[2]) if ":" in tensor else 0
                reader.input[index] = node.input[port]
    graph.remove([node.name])
    return f"the IdentityN '{node.name}' is gone; its readers read its inputs"
