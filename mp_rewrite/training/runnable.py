"""Whether TensorFlow can run a rewritten function body on this machine, checked before the body is swapped in:
TF validates a FunctionDef only when it first runs it, too late to fall back to the traced original.
"""

from __future__ import annotations

import functools

from tensorflow.python.framework import kernels

from ..core.graph_view import device_kind
from ..errors import GraphError


def check_runnable(fdef, result, signatures) -> None:
    """Check that TF can run every retyped node of a rewritten body: the OpDef allows its dtypes and a kernel for
    them exists on a device of this machine (its own device's kind if placed). A body that fails is never swapped in:
    TF validates a FunctionDef only when it first runs it, too late to fall back.

    Raises:
        GraphError: naming the first node that could not run.
    """
    retyped = {node for node, _ in result.retyped}
    kinds = _device_types()
    for node in fdef.node_def:
        if node.name not in retyped:
            continue
        sig = signatures.get(node.op, node.name)
        values = {attr: tuple(node.attr[attr].list.type) if is_list else (node.attr[attr].type,)
                  for attr, is_list, _ in sig.type_attrs if attr in node.attr}
        for attr, allowed in sig.allowed.items():
            if allowed is not None and not set(values.get(attr, ())) <= allowed:
                raise GraphError(f"the rewrite gave node '{node.name}' (op {node.op}) a dtype its attr '{attr}' does "
                                 "not allow")
        own = device_kind(node.device).upper()
        candidates = [own] if own else kinds
        if not any(_has_kernel(node.op, kind, values) for kind in candidates):
            raise GraphError(f"the rewrite gave node '{node.name}' (op {node.op}) dtypes no {'/'.join(candidates)} "
                             "kernel of this TensorFlow supports")


@functools.lru_cache(maxsize=None)
def _device_types() -> tuple:
    """The kernel device types of this machine's physical devices ("CPU", and "GPU" when there is one)."""
    from tensorflow.python.framework import config

    return tuple(sorted({d.device_type for d in config.list_physical_devices()} & {"CPU", "GPU"}))


@functools.lru_cache(maxsize=None)
def _kernel_constraints(op: str) -> tuple:
    return tuple((k.device_type, tuple((c.name, frozenset(c.allowed_values.list.type)) for c in k.constraint))
                 for k in kernels.get_registered_kernels_for_op(op).kernel)


def _has_kernel(op: str, device_type: str, values: dict) -> bool:
    # DEFAULT kernels (IdentityN, Identity for some dtypes) serve every device, as in TF's kernel lookup.
    return any(dev in (device_type, "DEFAULT")
               and all(set(values.get(name, ())) <= allowed for name, allowed in constraints)
               for dev, constraints in _kernel_constraints(op))
