"""Everything the stages read: the view, the lists, per-node facts, and Grappler's predicates over vertices."""

from __future__ import annotations

import fnmatch

from . import dtypes
from ..errors import OptionError
from .graph_view import GraphView, device_kind
from .op_support import KernelSupport
from .oplists import OpLists

DEVICES = ("gpu", "cpu", "any")
# Grappler's IsSourceOrSinkOp: a TensorList reaching one of these leaves the graph's view, so it must stay float32.
SOURCE_OR_SINK_OPS = frozenset({"_Arg", "_Retval", "OptionalFromValue", "OptionalGetValue", "PartitionedCall",
                                "Placeholder", "StatefulPartitionedCall"})
# Beyond Grappler: functional control flow hands the list to a body that is rewritten on its own, so the two sides
# can disagree on the element dtype. TF 2.21's pass paints such lists half in the caller while the body keeps
# float32, and the graph fails at run time ("op elements float but list elements half"); these are sinks here.
FUNCTIONAL_CONTROL_FLOW_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"})
# Grappler's CanForceFP16 exclusions (UNSAFE_FORCE_ALL).
NEVER_FORCED_OPS = frozenset({"Const", "SoftmaxCrossEntropyWithLogits"})


def compile_patterns(patterns, option: str):
    """Return a predicate name -> bool for node-name patterns: globs ("dense*/MatMul"), names with their name
    scopes ("loss" or "loss/" matches "loss" and "loss/Log"), and exact names ("=dense/Tensordot" matches that node
    only, not "dense/Tensordot/MatMul"; what the accuracy guard writes).

    Raises:
        OptionError: a pattern that is not a non-empty string.
    """
    patterns = [patterns] if isinstance(patterns, str) else list(patterns or ())
    for p in patterns:
        if not isinstance(p, str) or not p.strip("/"):
            raise OptionError(f"{option}: {p!r} is not a node name, scope or glob pattern")
    exact = {p[1:] for p in patterns if p.startswith("=")}
    globs = [p for p in patterns if not p.startswith("=") and any(c in p for c in "*?[")]
    scopes = tuple(p.rstrip("/") for p in patterns if p not in globs and not p.startswith("="))

    def matches(name: str) -> bool:
        if name in exact or any(name == s or name.startswith(s + "/") for s in scopes):
            return True
        return any(fnmatch.fnmatchcase(name, g) for g in globs)
    return matches


def check_patterns_match(patterns, option: str, names) -> None:
    """Refuse node-name patterns that match none of `names`: a typo would otherwise silently change nothing (a
    node the user meant to keep in float32 would be converted).

    Raises:
        OptionError: naming the first pattern that matches nothing.
    """
    unmatched = unmatched_patterns(patterns, option, names)
    if unmatched:
        raise OptionError(f"--{option.replace('_', '-')} {unmatched[0]!r} matches no node of what is converted; check "
                          "the name (`mp-rewrite inspect` lists the nodes), or drop the pattern")


def unmatched_patterns(patterns, option: str, names) -> list:
    """The node-name patterns (in their order) that match none of `names`."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns or ())
    names = list(names) if patterns else []
    return [p for p in patterns if not any(map(compile_patterns([p], option), names))]


class PassContext:
    """Read-only facts for one run of the pass.

    Attributes:
        view, lists, target: the graph view, the op lists, the target dtype enum.
        processed: per node, Grappler's ShouldProcess (not preserved, on the target device).
        skip_reason: per node, why it is not processed ("" when it is).
        category: per node, its list ("allow"/"infer"/"deny"/"clear"/None) after the user's node overrides.
        override: per node, "keep_fp32" / "force_low" (the user's overrides that decided `category`), "angle" (the
            angle of a Sin/Cos from integer positions, kept float32 by the default conversion: core.angles), or "".
        angle_of: {node index: the Sin/Cos whose angle it computes} of the "angle" overrides.
        force_all: UNSAFE_FORCE_ALL.
    """

    def __init__(self, view: GraphView, lists: OpLists, target: int, device: str, preserved: dict,
                 keep_fp32=None, force_low=None, force_all: bool = False, angles=None):
        self.view, self.lists, self.target, self.force_all = view, lists, target, force_all
        self.kernels = KernelSupport(target)
        self.device = device
        self.default_kind = device if device != "any" else ("gpu" if target == dtypes.HALF else "cpu")
        kind_of = {d: device_kind(d) or self.default_kind for d in set(view.devices)}
        self.kinds = [kind_of[d] for d in view.devices]
        mismatch = {kind: self._device_mismatch(kind) for kind in set(kind_of.values())}
        self.skip_reason = [mismatch[kind] for kind in self.kinds]
        for name, why in preserved.items():
            index = view.node_index.get(name)
            if index is not None and why:
                self.skip_reason[index] = why
        self.processed = [not r for r in self.skip_reason]
        self.category, self.override = self._categories(keep_fp32, force_low)
        self.angle_of = {}
        for name, periodic in (angles or {}).items():
            index = view.node_index.get(name)
            if index is not None and not self.override[index]:  # the user's own override of the node wins
                self.category[index], self.override[index] = "deny", "angle"
                self.angle_of[index] = periodic
        self._kernel_answers, self._low_capable = {}, None

    def _device_mismatch(self, kind: str) -> str:
        if self.device == "any" or kind == self.device:
            return ""
        return f"placed on {kind.upper()} and the rewrite targets {self.device.upper()} nodes (device={self.device!r})"

    def _categories(self, keep_fp32, force_low):
        # Functional control flow is a boundary whatever the lists say (bfloat16's clear list has While): its body
        # is rewritten on its own and keeps float32 arguments, so retyping the op's T would break the call.
        category_of = {op: None if op in FUNCTIONAL_CONTROL_FLOW_OPS else self.lists.category(op)
                       for op in set(self.view.ops)}
        category = [category_of[op] for op in self.view.ops]
        override = [""] * len(category)
        for option, color in (("force_low", "allow"), ("keep_fp32", "deny")):  # keep_fp32 wins over force_low
            patterns = keep_fp32 if option == "keep_fp32" else force_low
            if not patterns:
                continue
            matches = compile_patterns(patterns, option)
            for i, name in enumerate(self.view.names):
                # a Const's value, a variable read's or a stateful op's dtype cannot just be retyped: forcing them
                # wrote graphs that aborted in TF (a bfloat16 Const holding float32 data)
                if matches(name) and (option == "keep_fp32" or self.can_force(i)):
                    category[i], override[i] = color, option
        return category, override

    def low_candidates(self, categories) -> bytearray:
        """Per vertex, 1 where Grappler's static test for joining allow holds: the node is processed and in one of
        `categories` ("clear", "infer"), the vertex is float32, and the op supports the target dtype for it (OpDef
        and kernel)."""
        if self._low_capable is None:
            self._low_capable = self._find_low_capable()
        flags = bytearray(self._low_capable)
        view = self.view
        for node, category in enumerate(self.category):
            if category in ("clear", "infer") and category not in categories:
                first = view.node_first[node]
                flags[first:first + view.layouts[node].size] = bytes(view.layouts[node].size)
        return flags

    def _find_low_capable(self) -> bytearray:
        view, float32 = self.view, dtypes.FLOAT
        flags = bytearray(view.num_vertices)
        answers = {}  # nodes with the same layout, device kind and vertex dtypes get the same answers
        for node, category in enumerate(self.category):
            if category not in ("clear", "infer") or not self.processed[node]:
                continue
            first, size = view.node_first[node], view.layouts[node].size
            dtypes_key = view.v_dtype[first] if size == 1 else tuple(view.v_dtype[first:first + size])
            key = (id(view.layouts[node]), self.kinds[node], dtypes_key)
            answer = answers.get(key)
            if answer is None:
                answer = answers[key] = bytes(view.v_dtype[v] == float32 and self.supports_low(v)
                                              for v in range(first, first + size))
            flags[first:first + size] = answer
        return flags

    # -- Grappler's predicates, per vertex ---------------------------------------------------------------------
    def node_of(self, v: int) -> int:
        return self.view.v_node[v]

    def is_float32(self, v: int) -> bool:
        return self.view.v_dtype[v] == dtypes.FLOAT

    def supports_dtype(self, v: int) -> bool:
        """SupportsF16DataType: the OpDef allows the target dtype for this type attribute."""
        view = self.view
        attr = view.v_attr[v]
        if not attr:
            return view.v_dtype[v] == self.target
        allowed = view.sigs[view.v_node[v]].allowed.get(attr)
        return allowed is None or self.target in allowed

    def has_kernel(self, v: int) -> bool:
        """The kernel half of SupportsF16 (a kernel exists for the node with this attr at the target dtype)."""
        view = self.view
        node = view.v_node[v]
        first, layout = view.node_first[node], view.layouts[node]
        # Nodes with the same layout and vertex dtypes have the same attr values, so they share the answer.
        key = (id(layout), self.kinds[node], view.v_attr[v], tuple(view.v_dtype[first:first + layout.size]))
        answer = self._kernel_answers.get(key)
        if answer is None:
            answer = self._kernel_answers[key] = self.kernels.has_kernel(
                view.ops[node], self.kinds[node], view.v_attr[v], view.attr_values(node))
        return answer

    def supports_low(self, v: int) -> bool:
        """SupportsF16: the OpDef allows the target dtype and a kernel exists for it on the node's device."""
        return self.supports_dtype(v) and self.has_kernel(v)

    def is_quantized(self, v: int) -> bool:
        """Some type attr of the node (not a fixed-dtype argument) has a quantized dtype."""
        view = self.view
        node = view.v_node[v]
        first, layout = view.node_first[node], view.layouts[node]
        typed = layout.size - len(layout.fixed)  # the type attrs' vertices come first, fixed dtypes last
        return any(d in dtypes.QUANTIZED for d in view.v_dtype[first:first + typed])

    def reads_ref_variable(self, node: int) -> bool:
        """Grappler's NodeImplicitlyReadsNonResourceVariable: Identity(VariableV2), or Enter of such a read."""
        view = self.view
        op = view.ops[node]
        if op not in ("Identity", "Enter") or view.in_start[node] == view.in_start[node + 1]:
            return False
        src = view.e_src[view.in_start[node]]
        if op == "Identity":
            return view.ops[src] in ("Variable", "VariableV2")
        return self.reads_ref_variable(src)

    def can_force(self, node: int) -> bool:
        """Grappler's CanForceFP16 (UNSAFE_FORCE_ALL): not Const/SoftmaxCrossEntropyWithLogits, stateless, no refs."""
        sig = self.view.sigs[node]
        return self.view.ops[node] not in NEVER_FORCED_OPS and not sig.is_stateful and not sig.has_ref

    def is_source_or_sink(self, node: int) -> bool:
        op = self.view.ops[node]
        return (op in SOURCE_OR_SINK_OPS or op in FUNCTIONAL_CONTROL_FLOW_OPS
                or self.view.signatures.is_function(op))

