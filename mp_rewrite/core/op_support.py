"""What TensorFlow's op registry says about ops: signatures (ports per type attribute), allowed dtypes, kernels.

`Signatures` answers "which type attribute does input/output port k of this node use" from OpDefs (TF's registry,
or the graph's function library for call ops). `KernelSupport` answers Grappler's `SupportsF16`: does a kernel
exist for the node with one type attribute set to the low-precision dtype, on the node's device. TensorFlow's
kernel registry answers for CPU (and for GPU in a GPU build); for GPU on a TF build without GPU kernels the
shipped table `lists/gpu_kernels.toml` answers instead.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import tomllib

from tensorflow.core.framework import attr_value_pb2, op_def_pb2
from tensorflow.python.framework import kernels, op_def_registry

from . import dtypes
from ..errors import GraphError


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One OpDef input or output argument, reduced to what port expansion needs."""

    name: str
    type_attr: str
    number_attr: str
    type_list_attr: str
    fixed_type: int
    is_ref: bool


@dataclasses.dataclass(frozen=True)
class OpSignature:
    """The parts of an OpDef the pass uses, precomputed once per op type.

    Attributes:
        inputs, outputs: the argument specs in order.
        type_attrs: (attr name, is_list, default) for every non-underscore attr of kind type or list(type).
        allowed: attr name -> frozenset of allowed dtypes, or None when any dtype is allowed.
        is_stateful: OpDef.is_stateful.
        simple: True when no argument depends on number/list attrs, so port keys are the same for every node.
        number_attrs: the attrs that give argument counts (number_attr), in order of first use.
    """

    op: str
    inputs: tuple
    outputs: tuple
    type_attrs: tuple
    allowed: dict
    is_stateful: bool
    simple: bool
    has_ref: bool
    number_attrs: tuple = ()


def _arg_spec(arg) -> ArgSpec:
    return ArgSpec(arg.name, arg.type_attr, arg.number_attr, arg.type_list_attr, arg.type, arg.is_ref)


def signature_from_op_def(op_def: op_def_pb2.OpDef) -> OpSignature:
    """Build an OpSignature from an OpDef (a registered op or a FunctionDef's signature)."""
    inputs = tuple(_arg_spec(a) for a in op_def.input_arg)
    outputs = tuple(_arg_spec(a) for a in op_def.output_arg)
    type_attrs, allowed = [], {}
    for attr in op_def.attr:
        if attr.name.startswith("_") or attr.type not in ("type", "list(type)"):
            continue
        default = attr.default_value if attr.HasField("default_value") else None
        type_attrs.append((attr.name, attr.type == "list(type)", default))
        values = attr.allowed_values.list.type if attr.HasField("allowed_values") else ()
        allowed[attr.name] = frozenset(values) if values else None
    args = inputs + outputs
    simple = all(not a.number_attr and not a.type_list_attr for a in args)
    number_attrs = tuple(dict.fromkeys(a.number_attr for a in args if a.number_attr))
    return OpSignature(op_def.name, inputs, outputs, tuple(type_attrs), allowed, op_def.is_stateful, simple,
                       any(a.is_ref for a in args), number_attrs)


def attr_default(op: str, name: str):
    """The OpDef default of attr `name` of a registered op (an AttrValue), or None (no default, or not registered)."""
    op_def = op_def_registry.get(op)
    return next((a.default_value for a in op_def.attr if a.name == name and a.HasField("default_value")),
                None) if op_def else None


def attr_or_default(node, name: str):
    """The value of attr `name` of a NodeDef, or its OpDef's default when absent, without adding it to the node.

    SavedModels leave out default-valued attrs (ParseSequenceExampleV2's 'Ncontext_sparse', ...), and reading
    `node.attr[name]` inserts an empty AttrValue, which would then travel into the written graph.
    """
    if name in node.attr:
        return node.attr[name]
    default = attr_default(node.op, name)
    return default if default is not None else attr_value_pb2.AttrValue()


class Signatures:
    """OpSignature lookup for a graph: TF's op registry first, then the graph's function library."""

    def __init__(self, library=None):
        self._functions = {f.signature.name: f.signature for f in library.function} if library else {}
        # Registered ops cannot change once registered, so their signatures are shared by every graph.
        self._cache = {} if self._functions else _REGISTRY_SIGNATURES
        self._layouts = {} if self._functions else _REGISTRY_LAYOUTS

    def is_function(self, op: str) -> bool:
        """True if `op` names a function of the graph's library (a direct function call node)."""
        return op in self._functions

    def get(self, op: str, node_name: str = "?") -> OpSignature:
        """Return the signature of an op type.

        Raises:
            GraphError: the op is neither registered in TF nor a function of the library.
        """
        sig = self._cache.get(op)
        if sig is None:
            op_def = self._functions.get(op) or op_def_registry.get(op)
            if op_def is None:
                raise GraphError(f"node '{node_name}' uses op '{op}', which this TensorFlow's op registry and the "
                                 "graph's function library do not define; load the library that registers it "
                                 "(tf.load_op_library) or check the TensorFlow version")
            sig = self._cache[op] = signature_from_op_def(op_def)
        return sig

    def layout(self, sig: OpSignature, lengths: tuple, counts: tuple) -> "PortLayout":
        """Return the (cached) PortLayout of a node of `sig` with these list lengths and argument counts.

        Args:
            lengths: per type attr of `sig.type_attrs`, the list length (None for a single type).
            counts: the values of `sig.number_attrs`, in that order.
        """
        key = (sig.op, lengths, counts)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = port_layout(sig, lengths, dict(zip(sig.number_attrs, counts)))
        return layout


_REGISTRY_SIGNATURES, _REGISTRY_LAYOUTS = {}, {}


@dataclasses.dataclass(frozen=True, eq=False)
class PortLayout:
    """The vertices of one node and the vertex of each of its ports, shared by nodes of the same shape.

    Attributes:
        keys: vertex keys in vertex order: the type attrs in OpDef order (a list attr as "T[0]", "T[1]", ...),
            then the fixed-dtype keys ("fixed:float") in order of first use by an input or output.
        attrs: per vertex, its type attr name ("" for a fixed dtype).
        fixed: the dtypes of the trailing fixed-dtype vertices.
        inputs, outputs: per data port, the offset of its vertex in `keys`.
        spans: (attr name, is_list, first offset, count) per type attr, to rebuild a node's attr values.
        size: the number of vertices (len(keys)).
    """

    keys: tuple
    attrs: tuple
    fixed: tuple
    inputs: tuple
    outputs: tuple
    spans: tuple
    size: int

    def attr_values(self, dtypes_of_node) -> dict:
        """attr name -> dtype (tuple of dtypes for a list attr), from the node's vertex dtypes in vertex order."""
        return {name: tuple(dtypes_of_node[first:first + count]) if is_list else dtypes_of_node[first]
                for name, is_list, first, count in self.spans}


def port_layout(sig: OpSignature, lengths: tuple, counts: dict) -> PortLayout:
    """Expand a signature into a PortLayout for the given list lengths and number-attr values (see PortLayout)."""
    keys, attrs, spans = [], [], []
    for (attr_name, is_list, _), length in zip(sig.type_attrs, lengths):
        spans.append((attr_name, is_list, len(keys), length if is_list else 1))
        if is_list:
            keys.extend(f"{attr_name}[{i}]" for i in range(length))
            attrs.extend([attr_name] * length)
        else:
            keys.append(attr_name)
            attrs.append(attr_name)
    list_lengths = {name: length for (name, is_list, _), length in zip(sig.type_attrs, lengths) if is_list}
    in_keys = _port_keys(sig.inputs, list_lengths, counts)
    out_keys = _port_keys(sig.outputs, list_lengths, counts)
    fixed = [key for key in dict.fromkeys(in_keys + out_keys) if key not in keys]
    keys.extend(fixed)
    attrs.extend([""] * len(fixed))
    offset = {key: i for i, key in enumerate(keys)}
    return PortLayout(tuple(keys), tuple(attrs), tuple(FIXED_DTYPES[k] for k in fixed),
                      tuple(offset[k] for k in in_keys), tuple(offset[k] for k in out_keys), tuple(spans), len(keys))


def _port_keys(args, list_lengths: dict, counts: dict) -> list:
    keys = []
    for arg in args:
        if arg.type_list_attr:
            keys.extend(f"{arg.type_list_attr}[{i}]" for i in range(list_lengths[arg.type_list_attr]))
        else:
            key = arg.type_attr or fixed_key(arg.fixed_type)
            keys.extend([key] * (counts[arg.number_attr] if arg.number_attr else 1))
    return keys


FIXED_DTYPES = {}


def fixed_key(dtype: int) -> str:
    """The vertex key of an argument with a fixed dtype, e.g. "fixed:float"."""
    key = "fixed:" + dtypes.name(dtype)
    FIXED_DTYPES[key] = dtype
    return key


@functools.lru_cache(maxsize=None)
def _registry_kernels(op: str) -> tuple:
    """(device_type, ((attr, frozenset(allowed)), ...)) for every kernel TF registered for `op`."""
    result = []
    for k in kernels.get_registered_kernels_for_op(op).kernel:
        constraints = tuple((c.name, frozenset(c.allowed_values.list.type)) for c in k.constraint)
        result.append((k.device_type, constraints))
    return tuple(result)


@functools.lru_cache(maxsize=None)
def _built_with_gpu() -> bool:
    from tensorflow.python.platform import test
    return test.is_built_with_gpu_support()


@functools.lru_cache(maxsize=None)
def gpu_kernel_table() -> dict:
    """Return {dtype enum: frozenset(op names)} of ops with GPU kernels for half/bfloat16 (lists/gpu_kernels.toml)."""
    resource = importlib.resources.files("mp_rewrite.lists") / "gpu_kernels.toml"
    data = tomllib.loads(resource.read_text())["gpu"]
    return {dtypes.HALF: frozenset(data.get("half", ())), dtypes.BFLOAT16: frozenset(data.get("bfloat16", ()))}


_KERNEL_ANSWERS = {}


class KernelSupport:
    """Grappler's SupportsF16 kernel half: is there a kernel for this node with one attr set to the target?"""

    def __init__(self, target: int):
        self.target = target
        self._cache = _KERNEL_ANSWERS.setdefault(target, {})  # TF's kernel registry is fixed once loaded

    def source(self, op: str, device_kind: str) -> str:
        """Say which source answers for (op, device kind): "registry" or "gpu table".

        A TF build without GPU support still registers a few GPU kernels (host-memory int32 ones), so the
        registry only answers for GPU when the build has GPU support at all.
        """
        return "gpu table" if device_kind == "gpu" and not _built_with_gpu() else "registry"

    def has_kernel(self, op: str, device_kind: str, attr: str, attr_values: dict) -> bool:
        """Return True if a kernel exists for `op` on `device_kind` ("cpu"/"gpu") with `attr` set to the target.

        Args:
            attr: the type attr being retyped (a list attr retypes its element; the check is per attr name).
            attr_values: the node's current type attr values, attr name -> dtype or tuple of dtypes.
        """
        key = (op, device_kind, attr, tuple(sorted(attr_values.items())))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lookup(op, device_kind, attr, attr_values)
        return hit

    def _lookup(self, op, device_kind, attr, attr_values) -> bool:
        if self.source(op, device_kind) == "gpu table":
            return op in gpu_kernel_table()[self.target]
        device_type = device_kind.upper()
        values = dict(attr_values)
        current = values.get(attr)
        values[attr] = tuple(self.target for _ in current) if isinstance(current, tuple) else self.target
        for dev, constraints in _registry_kernels(op):
            if dev != device_type and dev != "DEFAULT":  # DEFAULT kernels serve every device, as in TF
                continue
            if all(_satisfies(values.get(name), allowed) for name, allowed in constraints):
                return True
        return False


def _satisfies(value, allowed: frozenset) -> bool:
    if value is None:
        return True
    if isinstance(value, tuple):
        return all(v in allowed for v in value)
    return value in allowed
