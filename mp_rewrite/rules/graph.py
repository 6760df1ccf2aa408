"""`EditableGraph`: a private copy of a GraphDef that rules read and edit (the caller's proto is never touched).

It answers the questions every rule asks (who produces an input, who reads an output, what value a Const holds,
is a node preserved) and makes the edits they need (new nodes with fresh names, renames, removals).
"""

from __future__ import annotations

import numpy as np

FLOAT_TYPES = (1, 14)  # types_pb2.DT_FLOAT, DT_BFLOAT16: the contraction types the CPU remapper fuses


def node_name(tensor: str) -> str:
    """'a' for 'a', 'a:1' and '^a'."""
    return tensor.lstrip("^").split(":")[0]


def reachable(graph_def, fetches) -> set:
    """The names of the nodes the fetches depend on (data or control); empty without fetches."""
    inputs = {node.name: node.input for node in graph_def.node}
    found, stack = set(), [node_name(f) for f in fetches]
    while stack:
        name = stack.pop()
        if name not in found and name in inputs:
            found.add(name)
            stack.extend(node_name(i) for i in inputs[name])
    return found


def is_first_output(tensor: str) -> bool:
    """Whether an input reads a node's output 0 as data (not a control input, not another port)."""
    return not tensor.startswith("^") and tensor.partition(":")[2] in ("", "0")


def drop_unset_attrs(graph_def) -> int:
    """Remove the attributes that hold no value from every node (in place); returns how many.

    Reading `node.attr[key]` for an attribute a node does not have (one left at its default, as SavedModels store
    them) inserts an empty AttrValue, and TensorFlow then refuses the graph at its first run ("Failed to bind all
    placeholders in <Unknown AttrValue type>"). Rules read such attributes; this undoes what the reads added."""
    dropped = 0
    for node in graph_def.node:
        for key in [k for k, v in node.attr.items() if v.WhichOneof("value") is None]:
            del node.attr[key]
            dropped += 1
    return dropped


class EditableGraph:
    """A copy of a GraphDef with lookups by name and the consumers of each node, kept current across edits."""

    def __init__(self, graph_def, fetches=(), shapes=None):
        """Args: graph_def, copied (never modified); fetches: tensor or node names whose nodes keep their name,
        op and output; shapes: {node name: shape} of tensors the graph does not state, e.g. the variables a
        traced training step reads (keyed by the resource placeholder or the ReadVariableOp)."""
        self.graph_def = type(graph_def)()
        self.graph_def.CopyFrom(graph_def)
        self.nodes = {node.name: node for node in self.graph_def.node}
        self.kept = {node_name(f) for f in fetches}
        self.shapes = {name: tuple(shape) for name, shape in (shapes or {}).items()}
        self._readers = None
        self._shapes = None

    def inferred_shape(self, tensor: str) -> tuple | None:
        """The shape TensorFlow's shape inference gives `tensor` (output 0 of a node; None for an unknown
        dimension), or None when its rank is unknown or the node was added after the first question (the graph is
        imported once, when first asked)."""
        if self._shapes is None:
            self._shapes = _inferred_shapes(self.graph_def, self.shapes)
        return self._shapes.get(node_name(tensor)) if is_first_output(tensor) else None

    def forget_shapes(self) -> None:
        """Let the next shape question import the graph as it is now (the nodes rewrites added have shapes too)."""
        self._shapes = None

    def readers(self, name: str) -> list:
        """The nodes that read any output of `name` as data (a node reading it twice appears twice)."""
        if self._readers is None:
            self._readers = {}
            for node in self.graph_def.node:
                for tensor in node.input:
                    if not tensor.startswith("^"):
                        self._readers.setdefault(node_name(tensor), []).append(node)
        return self._readers.get(name, [])

    def only_reader(self, name: str):
        """The one node that reads `name`'s output (once), or None."""
        readers = self.readers(name)
        return readers[0] if len(readers) == 1 else None

    def producer(self, tensor: str):
        """The node whose output 0 the input `tensor` reads, or None (control input, other port, unknown)."""
        return self.nodes.get(node_name(tensor)) if is_first_output(tensor) else None

    def constant(self, tensor: str) -> np.ndarray | None:
        """The value of the Const the input `tensor` reads, or None."""
        import tensorflow as tf
        node = self.producer(tensor)
        if node is None or node.op != "Const":
            return None
        return tf.make_ndarray(node.attr["value"].tensor)

    def weight_shape(self, tensor: str) -> tuple | None:
        """The shape of a weight: a Const's, or one given in `shapes` (for a ReadVariableOp, its variable's), or
        that of a Reshape of either to a constant target (how tf.einsum feeds a variable to its BatchMatMulV2)."""
        value = self.constant(tensor)
        if value is not None:
            return value.shape
        node = self.producer(tensor)
        if node is None:
            return None
        if node.op == "Reshape" and is_first_output(tensor):
            source, target = self.weight_shape(node.input[0]), self.constant(node.input[1])
            if source is None or None in source or target is None or target.ndim != 1 or (target < -1).any():
                return None
            size, known = int(np.prod(source)), int(np.prod([d for d in target if d >= 0]))
            if (target == -1).sum() > 1 or known == 0 or size % known:
                return None
            return tuple(int(d) if d >= 0 else size // known for d in target)
        if node.name not in self.shapes and node.op == "ReadVariableOp":
            return self.shapes.get(resource_source(self.nodes, node.input[0]))
        return self.shapes.get(node.name)

    def data_inputs(self, node) -> list:
        """The node's data inputs (control inputs left out)."""
        return [tensor for tensor in node.input if not tensor.startswith("^")]

    def fresh_name(self, base: str) -> str:
        """`base`, or `base_1`, `base_2`, ... whichever no node has."""
        name, count = base, 0
        while name in self.nodes:
            count += 1
            name = f"{base}_{count}"
        return name

    def add_node(self, name: str, op: str, inputs, device: str = "", attrs: dict | None = None):
        """Add a node named `fresh_name(name)`; attrs maps names to AttrValue protos. Returns the node."""
        node = self.graph_def.node.add(name=self.fresh_name(name), op=op, device=device)
        node.input.extend(inputs)
        for key, value in (attrs or {}).items():
            node.attr[key].CopyFrom(value)
        self.nodes[node.name] = node
        self._readers = None
        return node

    def add_constant(self, name: str, value: np.ndarray, device: str = ""):
        """Add a Const node holding `value` (its dtype kept); returns the node."""
        import tensorflow as tf
        node = self.add_node(name, "Const", [], device)
        tensor = tf.make_tensor_proto(value)
        node.attr["dtype"].type = tensor.dtype
        node.attr["value"].tensor.CopyFrom(tensor)
        return node

    def rename(self, node, new: str) -> None:
        """Give `node` the name `new` (unused) and point every input that read it at the new name."""
        old = node.name
        readers = {id(n): n for n in self.readers(old) + self.control_readers(old)}
        for reader in readers.values():
            for index, tensor in enumerate(reader.input):
                if node_name(tensor) == old:
                    reader.input[index] = tensor.replace(old, new, 1)
        del self.nodes[old]
        node.name = new
        self.nodes[new] = node
        self._readers = None

    def control_readers(self, name: str) -> list:
        """The nodes that wait for the named node (a control input `^name`)."""
        return [node for node in self.graph_def.node if f"^{name}" in node.input]

    def forwarded(self, tensor: str) -> str:
        """The tensor a chain of Identities forwards to `tensor` (TF's dependency optimizer removes them before the
        remapper looks), or `tensor` itself. An Identity that waits for anything but a constant is not looked
        through: its control input orders the graph."""
        node = self.producer(tensor)
        while node is not None and node.op == "Identity" and node.input and all(
                self.nodes.get(t[1:]) is not None and self.nodes[t[1:]].op == "Const"
                for t in node.input[1:] if t.startswith("^")):
            tensor, node = node.input[0], self.producer(node.input[0])
        return tensor

    def set_inputs(self, node, inputs) -> None:
        """Replace the node's data inputs by `inputs`, keeping its control inputs after them."""
        controls = [tensor for tensor in node.input if tensor.startswith("^")]
        del node.input[:]
        node.input.extend(list(inputs) + controls)
        self._readers = None

    def remove(self, names) -> None:
        """Remove the named nodes (nothing may read them any more)."""
        names = set(names)
        for index in reversed([i for i, node in enumerate(self.graph_def.node) if node.name in names]):
            del self.graph_def.node[index]
        for name in names:
            self.nodes.pop(name, None)
        self._readers = None

    def remove_orphans(self) -> None:
        """Remove the nodes (not fetches) that read, directly or through others, a node that no longer exists."""
        while True:
            orphans = {node.name for node in self.graph_def.node if node.name not in self.kept and
                       any(node_name(tensor) not in self.nodes for tensor in node.input)}
            if not orphans:
                return
            self.remove(orphans)

    def is_kept(self, node) -> bool:
        """Whether the node is a fetch (its name, op and output must stay)."""
        return node.name in self.kept


def _inferred_shapes(graph_def, stated: dict) -> dict:
    """{node name: shape of its output 0} from importing the graph into TensorFlow (`imported`); {} if it does not
    import."""
    import tensorflow as tf
    try:
        graph = imported(graph_def, stated)
    except (ValueError, TypeError, tf.errors.OpError):
        return {}
    return {op.name: tuple(op.outputs[0].shape.as_list()) for op in graph.get_operations()
            if op.outputs and op.outputs[0].shape.rank is not None}


def imported(graph_def, stated: dict, stated_shapes: bool = True):
    """The graph imported into a new tf.Graph, which runs TensorFlow's own checks of it (inputs, types, shapes,
    `_output_shapes`); raises what TensorFlow's importer raises.

    Weights are imported as Placeholders of their shape (a shape never depends on a weight's values), so a model of
    several GB is not copied into a second graph to answer a question about shapes. A function body's arguments
    (`_Arg`) and the reads of its variables are Placeholders of the shapes `stated` gives them (unknown when it
    gives none); its `_Retval`s are left out. Without `stated_shapes`, the nodes' `_output_shapes` are left out too
    (TF's importer takes them over its own inference): the shapes are TF's inference alone."""
    import tensorflow as tf
    light = type(graph_def)()
    light.library.CopyFrom(graph_def.library)
    light.versions.CopyFrom(graph_def.versions)

    def placeholder(node, dtype: int, shape) -> None:
        light.node.add(name=node.name, op="Placeholder", device=node.device)
        light.node[-1].attr["dtype"].type = dtype
        light.node[-1].attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())

    nodes = {node.name: node for node in graph_def.node}
    for node in graph_def.node:
        tensor = node.attr["value"].tensor if node.op == "Const" and "value" in node.attr else None
        if tensor is not None and len(tensor.tensor_content) + len(tensor.float_val) * 4 > 1 << 16:
            placeholder(node, tensor.dtype, tensor.tensor_shape)
        elif node.op == "_Arg":
            placeholder(node, node.attr["T"].type, stated.get(node.name))
        elif node.op == "ReadVariableOp" and resource_source(nodes, node.input[0]) in stated:
            placeholder(node, node.attr["dtype"].type, stated[resource_source(nodes, node.input[0])])
        elif node.op != "_Retval":
            light.node.add().CopyFrom(node)
            if not stated_shapes and "_output_shapes" in node.attr:
                del light.node[-1].attr["_output_shapes"]
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(light, name="")
    return graph


def resource_source(nodes: dict, tensor: str) -> str:
    """The node a resource input comes from through Identities (an inlined function's inputs are Identities of the
    captured placeholders)."""
    name = node_name(tensor)
    while name in nodes and nodes[name].op == "Identity" and nodes[name].input:
        name = node_name(nodes[name].input[0])
    return name
