"""Effects: the ops of a model whose work reaches outside the graph (files written, checkpoints saved, summaries
written, prints to a file), found in everything a signature -- or loading the model -- runs.

A conversion runs the model to measure and check it; it runs a copy in which these ops do nothing
(stand_ins.py) unless told to run the model as it is (`EffectsPolicy.run`, the CLI's --run-effects). Which ops reach
outside is TensorFlow's op registry's answer where it has one (a stateless op never does) and the table
lists/effects.toml's where it has not (a stateful op may write a file or only read a variable).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib.resources
import tomllib

from tensorflow.python.framework import op_def_registry

from ..errors import ListError
from .meta_graph import INTERNAL_PREFIX, _upstream_nodes, signature_nodes

LOADING = ""  # an Effect's `where` when loading the model runs it (a resource's initializer), not a signature
# Children of a SavedObjectGraph resource that tf.saved_model.load calls while it loads the model.
LOAD_FUNCTIONS = ("_create_resource", "_initialize")
# TF1 collections of ops the loader runs (tf.compat.v1.saved_model.loader: the main op or the legacy init op).
LOAD_COLLECTIONS = ("saved_model_main_op", "legacy_init_op", "table_initializer")


@dataclasses.dataclass(frozen=True)
class EffectKind:
    """One kind of effect: how a line says it ("writes files"), its ops, the ops that pass their first input through
    (stood in by an Identity of it), and {attribute: prefix} a node's attributes must have to count."""

    says: str
    ops: frozenset
    passes_through: frozenset = frozenset()
    when_attr: tuple = ()


@dataclasses.dataclass(frozen=True)
class EffectTable:
    """The kinds of effect, loaded once from lists/effects.toml."""

    kinds: tuple

    def kind_of(self, node) -> EffectKind | None:
        """The kind of effect `node` (a NodeDef) has, or None: stateless ops never have one (the registry), a
        stateful one has the kind the table names it in, if its attributes say it reaches outside."""
        kind = next((k for k in self.kinds if node.op in k.ops), None)
        if kind is None or not _stateful(node.op):
            return None
        for attr, prefix in kind.when_attr:
            if attr in node.attr and not node.attr[attr].s.decode(errors="replace").startswith(prefix):
                return None
        return kind

    @functools.cached_property
    def ops(self) -> frozenset:
        """Every op named."""
        return frozenset(op for kind in self.kinds for op in kind.ops)


@dataclasses.dataclass(frozen=True)
class Effect:
    """One op with an effect: the signature that runs it (LOADING: loading the model does), the function holding it
    ("" for the main graph), the node, its op and what it does ("writes files")."""

    where: str
    function: str
    node: str
    op: str
    says: str


def _stateful(op: str) -> bool:
    op_def = op_def_registry.get(op)
    return op_def is None or op_def.is_stateful  # an op this TensorFlow does not know: the table decides


@functools.lru_cache(maxsize=None)
def effect_table() -> EffectTable:
    """The table of lists/effects.toml.

    Raises:
        ListError: the file is malformed, or names an op in two kinds.
    """
    resource = importlib.resources.files("mp_rewrite.lists") / "effects.toml"
    try:
        data = tomllib.loads(resource.read_text())
        kinds = tuple(EffectKind(entry["says"], frozenset(entry["ops"]), frozenset(entry.get("passes_through", ())),
                                 tuple(entry.get("when_attr", {}).items())) for entry in data.values())
    except (tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ListError(f"the effects table {resource} is malformed ({e}); reinstall mp_rewrite") from None
    seen = {}
    for kind in kinds:
        for op in kind.ops:
            if op in seen:
                raise ListError(f"the effects table names {op} twice ({seen[op]!r} and {kind.says!r}); keep one")
            seen[op] = kind.says
    return EffectTable(kinds)


def find_effects(meta_graph, keys=None) -> tuple:
    """The effects of a MetaGraph: in what each signature (those of `keys`, else every user signature) runs -- its
    main-graph nodes and every function they call, nested calls, loop and branch bodies included -- and in what
    loading the model runs (its resources' initializers, a TF1 main op). The saver's own ops are not counted: a
    conversion never calls it.

    Returns:
        A tuple of Effects, in the order found.
    """
    roots = {key: signature_nodes(meta_graph, [key], outputs_only=True)
             for key in sorted(meta_graph.signature_def)
             if not key.startswith(INTERNAL_PREFIX) and (not keys or key in keys)}
    # `in` first: reading a missing key of a proto map would add it to the MetaGraph (and to what is written).
    roots[LOADING] = [n.split(":")[0].lstrip("^") for name in LOAD_COLLECTIONS if name in meta_graph.collection_def
                      for n in meta_graph.collection_def[name].node_list.value]
    walk = _Walk(meta_graph.graph_def)
    found = []
    for where, names in roots.items():
        calls = walk.main_graph(where, _upstream_nodes(meta_graph.graph_def, names), found)
        if where == LOADING:
            calls += _load_functions(meta_graph.object_graph_def)
        walk.functions(where, calls, found)
    return tuple(found)


def graph_effects(graph_def, fetches, where: str) -> tuple:
    """The effects of a bare GraphDef (a frozen signature, `where` its key): what running `fetches` (tensor or node
    names) runs."""
    walk, found = _Walk(graph_def), []
    names = [f.lstrip("^").split(":")[0] for f in fetches]
    walk.functions(where, walk.main_graph(where, _upstream_nodes(graph_def, names), found), found)
    return tuple(found)


def effects_awaited(graph_def, fetches):
    """`graph_def` (a frozen signature), or a copy of it in which each fetched node waits (a control input) for
    every op with an effect of the main graph that no fetch needed: TensorFlow's function runtime runs every
    stateful op of a body, but a graph run for its fetches -- and Grappler's pruning -- drops the others (a SaveV2
    that automatic control dependencies leave out of a function's control outputs), and the frozen model would
    no longer do what the source did. Never modifies `graph_def`."""
    table = effect_table()
    if not any(node.op in table.ops for node in graph_def.node):
        return graph_def
    names = list(dict.fromkeys(f.lstrip("^").split(":")[0] for f in fetches))
    needed = {node.name for node in _upstream_nodes(graph_def, names)}
    missing = [node.name for node in graph_def.node if node.name not in needed and table.kind_of(node)]
    if not missing:
        return graph_def
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name in names:
            node.input.extend(f"^{name}" for name in missing)
    return out


class _Walk:
    """Effects found in a graph's main nodes and library functions (each function's nodes read once)."""

    def __init__(self, graph_def):
        self.table = effect_table()
        self.bodies = {f.signature.name: f for f in graph_def.library.function}
        self.read = {}  # function name -> ([(node, op, says)], the functions it calls)

    def main_graph(self, where: str, nodes, found: list) -> list:
        """Record the effects among main-graph `nodes`; return the functions they call."""
        found += [Effect(where, "", name, op, says) for name, op, says in sorted(self._effects(nodes))]
        return [name for node in nodes for name in called(node, self.bodies)]

    def functions(self, where: str, names, found: list) -> None:
        """Record the effects in the functions `names` and every function they call."""
        seen, stack = set(), list(names)
        while stack:
            name = stack.pop()
            if name in seen or name not in self.bodies:
                continue
            seen.add(name)
            if name not in self.read:
                nodes = self.bodies[name].node_def
                self.read[name] = (self._effects(nodes), [f for node in nodes for f in called(node, self.bodies)])
            effects, calls = self.read[name]
            found += [Effect(where, name, node, op, says) for node, op, says in effects]
            stack += calls

    def _effects(self, nodes) -> list:
        """(node name, op, what it does) of the nodes with an effect."""
        kinds = [(node, self.table.kind_of(node)) for node in nodes if node.op in self.table.ops]
        return [(node.name, node.op, kind.says) for node, kind in kinds if kind is not None]


def called(node, bodies) -> list:
    """The library functions a node calls: by its op (a function called by name) or any function attribute
    (PartitionedCall's f, If's branches, While's cond and body, ...)."""
    names = [node.op] if node.op in bodies else []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return names


def _load_functions(object_graph) -> list:
    """The concrete functions tf.saved_model.load calls while loading: each resource's creator and initializer."""
    nodes = object_graph.nodes
    names = []
    for node in nodes:
        if node.WhichOneof("kind") != "resource":
            continue
        for child in node.children:
            target = nodes[child.node_id] if child.local_name in LOAD_FUNCTIONS else None
            if target is not None and target.WhichOneof("kind") == "function":
                names += list(target.function.concrete_functions)
    return names


def effect_line(effects) -> str:
    """What the effects do, by signature: "serving_default writes files (WriteFile), saves checkpoints (SaveV2);
    loading the model writes summaries (CreateSummaryFileWriter)"."""
    parts = {}
    for effect in effects:
        parts.setdefault(effect.where, {}).setdefault(effect.says, set()).add(effect.op)
    order = {kind.says: i for i, kind in enumerate(effect_table().kinds)}  # the table's order, whatever was found first
    return "; ".join(
        f"{where or 'loading the model'} " + ", ".join(f"{says} ({', '.join(sorted(kinds[says]))})"
                                                      for says in sorted(kinds, key=order.get))
        for where, kinds in parts.items())


# --------------------------------------------------------------------------------------------- the policy


@dataclasses.dataclass
class EffectsPolicy:
    """Whether what a conversion runs performs the model's effects (`run`: as the model is; else a copy in which
    they do nothing), and who is told when a copy stands in (`on_note`: callable(str), each line once)."""

    run: bool = False
    on_note: object = None
    said: set = dataclasses.field(default_factory=set)

    def tell(self, line: str) -> None:
        """Tell `on_note` the line, once."""
        if self.on_note is not None and line not in self.said:
            self.said.add(line)
            self.on_note(line)


_POLICY = contextvars.ContextVar("mp_rewrite_effects_policy", default=EffectsPolicy())


def effects_policy() -> EffectsPolicy:
    """The policy in force (the default: effects are not run, nobody is told)."""
    return _POLICY.get()


@contextlib.contextmanager
def running_effects(run: bool = False, on_note=None):
    """Within the block, what runs the model performs its effects (`run`) or runs a copy without them; `on_note`
    is told, once per line, what a copy stood in for."""
    token = _POLICY.set(EffectsPolicy(run, on_note))
    try:
        yield _POLICY.get()
    finally:
        _POLICY.reset(token)
