"""Op lists as data: TensorFlow 2.21's Allow/Infer/Deny/Clear lists, loaded from lists/*.toml, with overrides.

The built-in lists are the ones TF compiles into `auto_mixed_precision_lists.h` (float16: the CUDA lists;
bfloat16: the oneDNN lists). Users change them the ways TF allows (environment variables, same semantics) and
the ways it does not (API arguments, a list file of their own). An op in two lists is an error naming both.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import tomllib
from types import MappingProxyType
from typing import Iterable, Mapping

from ..errors import ListError, OptionError

LIST_NAMES = ("allow", "infer", "deny", "clear")
# TF's environment variable names for each list; the legacy names are applied after the new ones (no legacy clear).
ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
ENV_NAMES = {"allow": ("ALLOWLIST", "WHITELIST"), "infer": ("INFERLIST", "GRAYLIST"),
             "deny": ("DENYLIST", "BLACKLIST"), "clear": ("CLEARLIST",)}
LEVELS = ("TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL", "TENSOR_CORES_ONLY")


@dataclasses.dataclass(frozen=True)
class OpLists:
    """The four op lists of one precision mode. Frozen; build changed copies with `with_changes`.

    Attributes:
        precision: "float16" or "bfloat16".
        allow, infer, deny, clear: frozensets of op type names.
        sources: where each list's contents came from, for reports ("built-in", "env", "api", a file path).
    """

    precision: str
    allow: frozenset
    infer: frozenset
    deny: frozenset
    clear: frozenset
    sources: tuple = ("built-in",)

    def __post_init__(self):
        _check_disjoint(self)
        category = {}
        for list_name in LIST_NAMES:
            for op in getattr(self, list_name):
                category[op] = list_name
        object.__setattr__(self, "_category", MappingProxyType(category))

    def category(self, op: str) -> str | None:
        """Return "allow", "infer", "deny" or "clear" for an op type, or None if it is in no list."""
        return self._category.get(op)

    def with_changes(self, add: Mapping[str, Iterable[str]] | None = None,
                     remove: Mapping[str, Iterable[str]] | None = None, source: str = "api") -> "OpLists":
        """Return a copy with ops added to and then removed from lists (TF's order: add, then remove).

        Args:
            add: list name ("allow", "infer", "deny", "clear") -> op names to add.
            remove: list name -> op names to remove.
            source: a label for reports.

        Raises:
            ListError: an unknown list name, or an op ends up in two lists.
        """
        lists = {n: set(getattr(self, n)) for n in LIST_NAMES}
        for changes, apply in ((add or {}, set.update), (remove or {}, set.difference_update)):
            for list_name, ops in changes.items():
                if list_name not in lists:
                    raise ListError(f"unknown op list {list_name!r}: use one of {', '.join(LIST_NAMES)}")
                apply(lists[list_name], [ops] if isinstance(ops, str) else ops)
        return OpLists(self.precision, *(frozenset(lists[n]) for n in LIST_NAMES),
                       sources=self.sources + (source,))

    def as_dict(self) -> dict:
        """Return the lists as {"allow": [sorted ops], ...}."""
        return {n: sorted(getattr(self, n)) for n in LIST_NAMES}


def _check_disjoint(lists: OpLists) -> None:
    seen = {}
    for list_name in LIST_NAMES:
        for op in getattr(lists, list_name):
            if op in seen:
                raise ListError(f"op {op!r} is in both the {seen[op]} and the {list_name} list "
                                f"(sources: {', '.join(lists.sources)}); remove it from one of them")
            seen[op] = list_name


def _read_toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ListError(f"cannot parse op list file {where}: {e}") from None


def builtin_lists(precision: str = "float16", cuda_version: int | None = None,
                  cudnn_version: int | None = None) -> OpLists:
    """Return TF 2.21's built-in lists for a precision, without any environment overrides.

    Args:
        precision: "float16" (TF's CUDA lists) or "bfloat16" (TF's oneDNN lists).
        cuda_version, cudnn_version: the target GPU stack as TF encodes it (e.g. 11080, 8600). Version-gated
            allow groups whose requirement is not met are left out. None assumes a new enough stack (all on),
            which is also what TF's CPU mode uses.

    Raises:
        OptionError: unknown precision.
    """
    from .dtypes import target_dtype  # imported here: the CLI reads LIST_NAMES before TensorFlow starts
    target_dtype(precision)
    resource = importlib.resources.files("mp_rewrite.lists") / f"{precision}.toml"
    data = _read_toml(resource.read_text(), str(resource))
    have = {"cuda": cuda_version, "cudnn": cudnn_version}
    allow = set(data["allow"]["ops"])
    for group in data["allow"].get("gated", ()):
        if all(have[k] is None or have[k] >= v for k, v in group["requires"].items()):
            allow.update(group["ops"])
    return OpLists(precision, frozenset(allow), *(frozenset(data[n]["ops"]) for n in LIST_NAMES[1:]))


def changes_from_env(env: Mapping[str, str] | None = None) -> tuple[dict, dict]:
    """Read TF's `TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_<LIST>_{ADD,REMOVE}` variables, legacy names included.

    Semantics are TF's: comma-separated, no trimming, empty means nothing. Returns (add, remove) dicts of
    list name -> ops, in the order TF applies them (new names, then legacy names).
    """
    env = os.environ if env is None else env
    add, remove = {}, {}
    for list_name, env_names in ENV_NAMES.items():
        for env_name in env_names:
            for suffix, target in (("_ADD", add), ("_REMOVE", remove)):
                value = env.get(ENV_PREFIX + env_name + suffix, "")
                if value:
                    target.setdefault(list_name, []).extend(value.split(","))
    return add, remove


def changes_from_file(path: str) -> tuple[dict, dict, dict]:
    """Read a user's list file: TOML with sections [allow] [infer] [deny] [clear], each with `add`/`remove`
    arrays, or `ops` to replace the list. Returns (replace, add, remove) dicts of list name -> ops.

    Raises:
        ListError: unreadable file, bad TOML, unknown section or key.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = _read_toml(f.read(), path)
    except OSError as e:
        raise ListError(f"cannot read op list file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ListError(f"op list file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8 TOML") from None
    replace, add, remove = {}, {}, {}
    for section, body in data.items():
        if section == "meta":
            continue
        if section not in LIST_NAMES or not isinstance(body, dict):
            raise ListError(f"{path}: unknown section [{section}]; use [allow], [infer], [deny] or [clear]")
        for key, ops in body.items():
            target = {"ops": replace, "add": add, "remove": remove}.get(key)
            if target is None or not isinstance(ops, list):
                raise ListError(f"{path}: [{section}] {key} must be one of ops/add/remove = [\"Op\", ...]")
            target[section] = check_op_names(ops, f"{path}: [{section}] {key}")
    return replace, add, remove


def check_op_names(ops, where: str) -> list:
    """Return `ops` as a list after checking each is the name of an op TensorFlow knows.

    Raises:
        ListError: an entry that is not a string (a number, a nested array), empty, or not a registered op.
    """
    from tensorflow.python.framework import op_def_registry
    ops = [ops] if isinstance(ops, str) else list(ops)
    for op in ops:
        if not isinstance(op, str) or not op.strip():
            raise ListError(f"{where}: {op!r} is not an op name; give op type names as strings, e.g. \"MatMul\"")
        if op_def_registry.get(op) is None:
            raise ListError(f"{where}: {op!r} is not an op TensorFlow knows (op type names are case-sensitive, e.g. "
                            "\"MatMul\", \"Conv2D\"; `mp-rewrite lists` shows the lists)")
    return ops


def load_lists(precision: str = "float16", *, lists_file: str | None = None,
               add: Mapping[str, Iterable[str]] | None = None, remove: Mapping[str, Iterable[str]] | None = None,
               level: str | None = None, env: Mapping[str, str] | None = None) -> OpLists:
    """Return the effective lists: built-in, then TF env vars, then a list file, then API add/remove, then level.

    Args:
        precision: "float16" or "bfloat16".
        lists_file: a TOML file of changes (see `changes_from_file`).
        add, remove: list name -> op names.
        level: None, "TREAT_INFER_AS_DENY" (infer ops join deny; infer empties) or "TENSOR_CORES_ONLY" (float16:
            infer, deny and clear lists empty, as in TF's CUDA mode).
        env: the environment to read TF's variables from (default os.environ; pass {} to ignore it).

    Raises:
        ListError, OptionError: bad file, unknown list, an op in two lists, an op TF does not know, unknown level.
    """
    lists = builtin_lists(precision)
    env_add, env_remove = changes_from_env(env)
    if env_add or env_remove:
        lists = lists.with_changes(env_add, env_remove, source="env")
    if lists_file:
        replace, file_add, file_remove = changes_from_file(lists_file)
        if replace:
            cleared = {n: getattr(lists, n) for n in replace}
            lists = lists.with_changes(None, cleared, source=lists_file).with_changes(replace, None, lists_file)
        lists = lists.with_changes(file_add, file_remove, source=lists_file)
    if add or remove:
        for changes in (add or {}, remove or {}):
            for list_name, ops in changes.items():
                check_op_names(ops, f"the {list_name} list")
        lists = lists.with_changes(add, remove, source="api")
    return apply_level(lists, level)


def _as_tuple(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value or ())


def edit_lists(precision: str, lists: OpLists | None = None, lists_file: str | None = None, allow=(), infer=(),
               deny=(), clear=(), remove=()) -> OpLists | None:
    """The op lists a user asked for: `lists` (else the built-in lists with TF's environment variables and
    `lists_file`), with every op named in allow/infer/deny/clear moved into that list (out of any other), and every
    op named in `remove` taken out of every list (it then keeps its dtype). The one meaning of the CLI's
    --lists/--allow/--infer/--deny/--clear/--remove.

    Returns:
        The OpLists, or None when nothing changes the built-in ones (make_options then loads them, cached).

    Raises:
        OptionError: an op named for two lists, or both `lists` and `lists_file` given.
        ListError: a bad lists file, or an op name TensorFlow does not know.
    """
    target = {}
    for name, ops in zip(LIST_NAMES, (allow, infer, deny, clear)):
        for op in check_op_names(_as_tuple(ops), f"--{name}"):
            if target.get(op, name) != name:
                raise OptionError(f"op {op!r} is given to both --{target[op]} and --{name}; give it to one list")
            target[op] = name
    for op in check_op_names(_as_tuple(remove), "--remove"):
        if op in target:
            raise OptionError(f"op {op!r} is given to both --{target[op]} and --remove; give it to one of them")
        target[op] = None
    if lists is not None and lists_file:
        raise OptionError("give either lists (an OpLists) or lists_file (a TOML file), not both")
    if lists is None and not lists_file and not target:
        return None
    base = lists if lists is not None else load_lists(precision, lists_file=lists_file)
    if not target:
        return base
    add = {name: [op for op, t in target.items() if t == name] for name in LIST_NAMES if name in target.values()}
    drop = {name: [op for op, t in target.items() if t != name] for name in LIST_NAMES}
    return base.with_changes(add, drop, source="options")


def apply_level(lists: OpLists, level: str | None) -> OpLists:
    """Apply TF's `..._LEVEL` list effects. UNSAFE_FORCE_ALL does not change lists (the pass handles it).

    Raises:
        OptionError: unknown level.
    """
    level = normalize_level(level)
    if level == "TREAT_INFER_AS_DENY":
        return lists.with_changes({"deny": lists.infer}, {"infer": lists.infer}, source="level")
    if level == "TENSOR_CORES_ONLY" and lists.precision == "float16":
        empty = {n: getattr(lists, n) for n in ("infer", "deny", "clear")}
        return lists.with_changes(None, empty, source="level")
    return lists


def normalize_level(level: str | None) -> str | None:
    """Upper-case a level name and check it (TF compares case-insensitively); "" and None mean the default."""
    if not level:
        return None
    level = level.upper()
    if level not in LEVELS:
        raise OptionError(f"unknown level {level!r}: use one of {', '.join(LEVELS)}")
    return level
