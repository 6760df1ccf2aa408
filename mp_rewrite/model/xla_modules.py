"""Computation the pass cannot see: `XlaCallModule` ops, which hold a whole serialized StableHLO program (attr
`module`) that TensorFlow hands to XLA. jax2tf writes them, and so does Keras 3's `model.export(...,
format="tf_saved_model")` on the JAX backend: such a SavedModel keeps every matmul inside one opaque op, and a
GraphDef pass (ours, and Grappler's) converts nothing. This module finds them and, where jaxlib's MLIR bindings are
installed, counts what each one computes (its `stablehlo.dot_general` and `stablehlo.convolution`, per element
type), so that `convert` can refuse to write an unchanged model as a success and `inspect` can say what was not
reached.
"""

from __future__ import annotations

import collections
import dataclasses

OP = "XlaCallModule"
HEAVY = ("stablehlo.dot_general", "stablehlo.convolution")  # what a mixed precision pass would convert
ELEMENT_TYPES = {"f32": "float32", "f64": "float64", "bf16": "bfloat16", "f16": "float16"}


@dataclasses.dataclass(frozen=True)
class XlaModule:
    """One XlaCallModule node.

    Attributes:
        graph: the function holding it ("" for the main graph).
        node: the node name.
        name: the StableHLO module's own name (e.g. 'jit_stateless_fn'), None when it could not be read.
        heavy: {(op, element type): count} of its dot_general/convolution ops (e.g. {("dot_general", "float32"):
            2}); None when it could not be read (see `unread`).
        unread: why it was not read (jaxlib missing, unknown serialization), or None.
    """

    graph: str
    node: str
    name: str | None
    heavy: dict | None
    unread: str | None

    @property
    def where(self) -> str:
        return f"node {self.node!r} of function {self.graph!r}" if self.graph else f"node {self.node!r}"

    @property
    def gradient(self) -> bool:
        """A gradient module (jax2tf's custom gradient, 'jit_..._vjp_...'): run when training, not serving."""
        return bool(self.name and "_vjp" in self.name) or "_grad_fn" in self.graph

    def origin(self) -> str:
        """Who most likely wrote it: Keras 3 names the function it hands to jax2tf 'stateless_fn'."""
        if self.name and "stateless_fn" in self.name:
            return "jax2tf, as Keras 3's model.export does on the JAX backend"
        return "jax2tf (or another JAX export)"


def xla_modules(graph_def, functions=None) -> list[XlaModule]:
    """The XlaCallModule nodes of a GraphDef's main graph and of its library functions.

    Args:
        graph_def: a GraphDef with its function library.
        functions: names of the library functions to search (those a conversion rewrites); None searches all.

    Returns:
        One XlaModule per node, main graph first, counted where jaxlib can read the module.
    """
    if OP.encode() not in graph_def.SerializeToString():  # serializing is much cheaper than a walk over the nodes
        return []
    found = [("", node) for node in graph_def.node if node.op == OP]
    wanted = None if functions is None else set(functions)
    found += [(f.signature.name, node) for f in graph_def.library.function
              if wanted is None or f.signature.name in wanted for node in f.node_def if node.op == OP]
    modules = [_read(graph, node) for graph, node in found]
    return sorted(modules, key=lambda m: m.gradient)  # what serving runs first


def _read(graph: str, node) -> XlaModule:
    serialized = node.attr["module"].s if "module" in node.attr else b""
    try:
        name, heavy = count_heavy_ops(serialized)
    except ImportError:
        return XlaModule(graph, node.name, None, None, "jaxlib is not installed (pip install jax to count what it "
                         "computes)")
    except Exception as e:  # MLIR raises its own errors for bytes it cannot parse
        return XlaModule(graph, node.name, None, None, f"its StableHLO could not be read ({str(e).splitlines()[0]})")
    return XlaModule(graph, node.name, name, heavy, None)


def count_heavy_ops(serialized: bytes) -> tuple[str | None, dict]:
    """Deserialize a StableHLO module (a portable artifact, as jax2tf writes it, or MLIR bytecode or text) and count
    its dot_general/convolution ops per result element type.

    Returns:
        (the module's symbol name or None, {(op, element type): count}).

    Raises:
        ImportError: jaxlib is not installed. Exception: MLIR's, for bytes that are not a StableHLO module.
    """
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo
    context = ir.Context()
    context.allow_unregistered_dialects = True
    stablehlo.register_dialect(context)
    # MLIR prints its diagnostics on stderr unless handled; the exception carries what the user needs to know.
    handler = context.attach_diagnostic_handler(lambda diagnostic: True)  # noqa: F841 -- kept while parsing
    with context:
        try:
            module = stablehlo.deserialize_portable_artifact(context, serialized)
        except Exception:  # an older XlaCallModule version holds plain MLIR bytecode or text
            module = ir.Module.parse(serialized)
        counts = collections.Counter()
        _count(module.operation, counts)
        name = module.operation.attributes["sym_name"] if "sym_name" in module.operation.attributes else None
    return (str(name).strip('"') if name is not None else None), dict(counts)


def _count(operation, counts) -> None:
    stack = [operation]
    while stack:
        op = stack.pop()
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    if child.name in HEAVY:
                        element = str(child.results[0].type.element_type) if len(child.results) else "?"
                        counts[(child.name.split(".")[1], ELEMENT_TYPES.get(element, element))] += 1
                    stack.append(child)


def summary(modules) -> str:
    """'2 XlaCallModule ops (2 dot_general in float32; its gradient: 6 dot_general in float32)': how many and what
    they compute, as far as they could be read."""
    count = f"{len(modules)} {OP} op{'' if len(modules) == 1 else 's'}"
    parts = [_heavy_words([m for m in modules if not m.gradient])]
    gradients = _heavy_words([m for m in modules if m.gradient])
    if gradients:
        parts.append("its gradient: " + gradients)
    unread = [m for m in modules if m.heavy is None]
    if unread:
        parts.append(f"{len(unread)} not read: {unread[0].unread}")
    return f"{count} ({'; '.join(p for p in parts if p)})"


def _heavy_words(modules) -> str:
    heavy = collections.Counter()
    for m in modules:
        heavy.update(m.heavy or {})
    if not heavy:
        return "" if any(m.heavy is None for m in modules) or not modules else "no dot_general or convolution"
    return ", ".join(f"{n} {op} in {dtype}" for (op, dtype), n in sorted(heavy.items()))


def low_precision_only(modules, precision: str) -> bool:
    """Whether every dot_general/convolution counted computes in `precision` already (none unread)."""
    if any(m.heavy is None for m in modules):
        return False
    dtypes = {dtype for m in modules for (_, dtype) in m.heavy}
    return bool(dtypes) and dtypes <= {precision, "bfloat16", "float16"}


def opaque_line(modules, precision: str) -> str:
    """What the modules are, where they came from and what to do, in one sentence (without what happens next)."""
    first = modules[0]
    head = (f"the model computes in {summary(modules)}: serialized StableHLO written by {first.origin()} (first: "
            f"{first.where}), which this GraphDef pass cannot see into")
    if low_precision_only(modules, precision):
        return head + "; its matmuls/convolutions already compute in low precision (exported with a mixed policy?)"
    policy = {"bfloat16": "mixed_bfloat16"}.get(precision, "mixed_float16")
    return (head + f"; to get {precision}, set keras.mixed_precision.set_global_policy('{policy}') before building "
            "and exporting the model, or convert the model in JAX")
