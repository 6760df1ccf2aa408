"""Which box of the layer picture each op lands in: the model's layers, found from name scopes.

A Keras model traces every layer under a name scope (`mobilenetv2_1.00_96_1/block_1_expand_1/convolution`). The
boxes start one scope below the model's own scope (the scope nearly every op shares); a box opens into its
sub-scopes and ops when it holds two or more sub-scopes that carry weights (a Transformer layer holds an attention
layer and two dense layers; an attention layer holds query, key, value and output) — a whole depth at a time, and
only while the picture stays within its box budget. A Dense layer (whose only weighted sub-scope is `Tensordot/`)
stays one box.
"""

from __future__ import annotations

import collections
import dataclasses
import re

from .network import WEIGHT_OPS

DOMINANT = 0.8  # the share of ops under one scope that makes it the model's own scope
TRACE_SUFFIX = re.compile(r"_\d+$")


@dataclasses.dataclass
class Grouping:
    """Ops grouped into boxes.

    Attributes:
        box_of: op name -> box key (a scope "a/b/" or, for an op drawn alone, the op's name).
        root: the model's own scope, stripped from labels ("" when none).
        depth: scopes below `root` that were opened (1: one box per top-level layer).
        note: why no deeper level was opened, when a deeper level would have split a layer.
        strip_suffix: labels drop the "_1" suffix TF adds when a Keras 3 model is traced again.
    """

    box_of: dict
    root: str
    depth: int
    note: str | None = None
    strip_suffix: bool = False

    def label(self, key: str) -> str:
        """The short name of a box: its last scope component (or the op's last two), without the trace suffix."""
        if key.endswith("/"):
            last = key.rstrip("/").split("/")[-1]
            return TRACE_SUFFIX.sub("", last) if self.strip_suffix else last
        rest = key[len(self.root):] if key.startswith(self.root) else key
        parts = rest.split("/")[-2:]
        if self.strip_suffix and len(parts) == 2:
            parts[0] = TRACE_SUFFIX.sub("", parts[0])
        return "/".join(parts)


def model_scope(names) -> str:
    """The scope almost every op lives in ("mobilenetv2_1.00_96_1/"), repeated while one child dominates."""
    root = ""
    while True:
        inside = [n[len(root):] for n in names if n.startswith(root)]
        heads = collections.Counter(n.split("/")[0] for n in inside if "/" in n)
        if not heads:
            return root
        head, count = heads.most_common(1)[0]
        if count < DOMINANT * len(names):
            return root
        root += head + "/"


def _box_at(name: str, root: str, depth: int) -> str:
    """The box of `name` with `depth` scopes below root opened: its scope at that depth, or itself if shallower."""
    if not name.startswith(root):
        return name
    parts = name[len(root):].split("/")
    if len(parts) <= depth:
        return name
    return root + "/".join(parts[:depth]) + "/"


def _openable(members: list[str], key: str, ops: dict) -> bool:
    """A box opens when two or more of its direct sub-scopes hold weight-bearing ops."""
    weighted = {m[len(key):].split("/")[0] for m in members
                if ops[m] in WEIGHT_OPS and "/" in m[len(key):]}
    return len(weighted) >= 2


def group_ops(ops: dict, budget: int) -> Grouping:
    """Group ops into boxes (see the module docstring).

    Args:
        ops: op name -> op type, of the ops drawn.
        budget: the most boxes a deeper level may bring the picture to.

    Returns:
        A Grouping.
    """
    names = list(ops)
    root = model_scope(names)
    box_of = {n: _box_at(n, root, 1) for n in names}
    depth, note = 1, None
    while True:
        members = collections.defaultdict(list)
        for name, key in box_of.items():
            members[key].append(name)
        opening = {k for k, m in members.items() if k.endswith("/") and _openable(m, k, ops)}
        if not opening:
            break
        deeper = {n: (_box_at(n, root, depth + 1) if box_of[n] in opening else box_of[n]) for n in names}
        count = len(set(deeper.values()))
        if count > budget:
            note = (f"layers shown {depth} scope level(s) deep: one level more would draw {count} boxes, over the "
                    f"budget of {budget}")
            break
        box_of, depth = deeper, depth + 1
    scopes = [k.rstrip("/").split("/")[-1] for k in set(box_of.values()) if k.endswith("/")]
    suffixed = sum(1 for s in scopes if TRACE_SUFFIX.search(s))
    return Grouping(box_of, root, depth, note, bool(scopes) and suffixed >= 0.9 * len(scopes))


def distinct_labels(keys) -> dict:
    """{box key: the shortest tail of its scope path (trace suffixes dropped) that no other box shares}: the four
    "value" boxes of a BERT read "transformer_layer_0/self_attention_layer/value", ... where a list names them
    outside the picture."""
    # An op drawn alone keeps its own name's number: "transpose_1" is another op than "transpose", not a trace.
    paths = {key: [TRACE_SUFFIX.sub("", part) if i < len(parts) - 1 or key.endswith("/") else part
                   for i, part in enumerate(parts)]
             for key, parts in ((key, key.rstrip("/").split("/")) for key in keys)}
    out = {}
    for key, parts in paths.items():
        for n in range(1, len(parts) + 1):
            tail = parts[-n:]
            if n == len(parts) or sum(1 for other in paths.values() if other[-n:] == tail) == 1:
                out[key] = "/".join(tail)
                break
    return out
