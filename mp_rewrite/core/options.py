"""The options of a rewrite: `Options`, validated once by `make_options` where they enter (the CLI or an API call)
and passed down whole to every front end and every graph the pass rewrites."""

from __future__ import annotations

import dataclasses
import inspect
import os

from . import dtypes
from ..errors import OptionError
from .assignment import ASSIGN_MODES, CostTable
from .oplists import OpLists, apply_level, changes_from_env, edit_lists, load_lists, normalize_level
from .pass_context import DEVICES, compile_patterns


@dataclasses.dataclass(frozen=True)
class Options:
    """The validated options of one rewrite, shared by the main graph and every function body; build it with
    make_options (mp_rewrite.make_options), once, where the options enter (the CLI or an API call).

    Attributes:
        precision: "float16" or "bfloat16"; target: its DataType enum.
        device: "gpu", "cpu" or "any" (which placed nodes are converted).
        lists: the effective OpLists (built-in or given, with the edits and the level applied).
        keep_fp32, force_low: node-name patterns.
        force_all: level UNSAFE_FORCE_ALL.
        emulate: TF's CPU float16 emulation (round-trip Casts, nothing retyped).
        assign: "lists" (Grappler's coloring) or "cost" (then a minimum cut over `costs`, core.assignment).
        costs: with assign="cost", a core.assignment.CostTable of the graph, or a machine table with a
            `for_graph(graph_def, precision, fetches=...)` method (analysis.op_costs.MachineCosts) that makes one
            for each graph rewritten.
        rules: with assign="cost", run the graph rules (rules.canonicalize) before and after the pass in place; False
            where they broke the written copy (savedmodel.convert writes it again without them).
        float32_angles: keep the angles of Sin/Cos computed from integer positions in float32 (core.angles): set
            by make_options for assign="cost" and kept by its candidates (Grappler's lists raced beside the cut);
            assign="lists" asked for is Grappler's pass, node for node, and converts them.
    """

    precision: str
    target: int
    device: str
    lists: OpLists
    keep_fp32: tuple = ()
    force_low: tuple = ()
    force_all: bool = False
    emulate: bool = False
    assign: str = "lists"
    costs: object = None
    rules: bool = True
    float32_angles: bool = False


EMULATE_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"


def make_options(precision="float16", device=None, lists=None, keep_fp32=(), force_low=(), level=None,
                 emulate=None, *, lists_file=None, allow=(), infer=(), deny=(), clear=(), remove=(), assign="lists",
                 costs=None) -> Options:
    """Validate every rewrite option once (see rewrite_graph_def) into an Options, which the front ends (convert,
    freeze, tune, the guard, inspect, training) then pass down whole.

    Args:
        precision, device, keep_fp32, force_low, level, emulate: as for rewrite_graph_def.
        lists: an OpLists for `precision`; None: the built-in lists with TF's environment variables (and
            `lists_file`).
        lists_file, allow, infer, deny, clear, remove: edits of the lists (oplists.edit_lists).
        assign, costs: the precision assignment (see Options).

    Raises:
        OptionError, ListError: a bad precision, device, level, pattern, lists or list edit.
    """
    target = dtypes.target_dtype(precision)
    device = _check_device(device, precision)
    env_level = os.environ.get("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL")
    level = normalize_level(level if level is not None else env_level)
    lists = edit_lists(precision, lists, lists_file, allow, infer, deny, clear, remove)
    lists = _effective_lists(lists, precision, level)
    for option, patterns in (("keep_fp32", keep_fp32), ("force_low", force_low)):
        compile_patterns(patterns, option)
    as_tuple = lambda p: (p,) if isinstance(p, str) else tuple(p or ())  # noqa: E731
    emulate = _emulate(emulate, precision, device)
    _check_assign(assign, costs, precision, emulate)
    return Options(precision, target, device, lists, as_tuple(keep_fp32), as_tuple(force_low),
                   level == "UNSAFE_FORCE_ALL", emulate, assign, costs if assign == "cost" else None,
                   float32_angles=assign == "cost")


def given_or_made(options: Options | None, precision: str = "float16", **parts) -> Options:
    """`options` when given, else make_options(precision, **parts): the one way an API that takes either an Options
    or the options it is made of builds it.

    Raises:
        OptionError: both an Options and some of its parts (they would be silently ignored), as make_options does
            for bad parts.
    """
    if options is None:
        return make_options(precision, **parts)
    if not isinstance(options, Options):
        raise OptionError(f"options must be an Options (mp_rewrite.make_options), got {type(options).__name__}")
    defaults = inspect.signature(make_options).parameters
    unset = lambda name, value: (name in defaults and value == defaults[name].default  # noqa: E731
                                 or not isinstance(value, bool) and not value)  # None, (), [], ""
    mixed = sorted(name for name, value in parts.items() if not unset(name, value))
    if mixed:
        raise OptionError(f"give either options= (an Options) or {', '.join(mixed)}, not both: make the Options with "
                          "them (mp_rewrite.make_options)")
    return options


def _check_assign(assign, costs, precision: str, emulate: bool) -> None:
    if assign not in ASSIGN_MODES:
        raise OptionError(f"unknown assign mode {assign!r}: use 'lists' (Grappler's op lists) or 'cost' (a minimum "
                          "cut over measured op costs)")
    if assign != "cost":
        return
    if not isinstance(costs, CostTable) and not hasattr(costs, "for_graph"):
        raise OptionError("assign='cost' needs costs: a cost table (mp_rewrite.analysis.op_costs.measure_costs, "
                          f"or load_costs(FILE)); got {type(costs).__name__}")
    if getattr(costs, "precision", precision) != precision:
        raise OptionError(f"the cost table was measured for {costs.precision}, not {precision}; measure it for "
                          f"{precision} (mp-rewrite costs MODEL --precision {precision})")
    if emulate:
        raise OptionError("assign='cost' and emulate exclude each other: emulation computes in float32")


def _emulate(emulate, precision: str, device: str) -> bool:
    """The emulate option: an explicit bool, else TF's variable where TF reads it (float16 on CPU nodes, i.e. TF's
    auto_mixed_precision_cpu), parsed like TF's ReadBoolFromEnvVar; unset, the rewrite is real."""
    if emulate is None:
        value = os.environ.get(EMULATE_ENV)
        if value is None or precision != "float16" or device != "cpu":
            return False
        if value.lower() not in ("0", "false", "1", "true"):
            raise OptionError(f"{EMULATE_ENV}={value!r} is not a boolean: use 1/true or 0/false (or unset it)")
        return value.lower() in ("1", "true")
    if not isinstance(emulate, bool):
        raise OptionError(f"emulate must be True, False or None, got {emulate!r}")
    if emulate and precision != "float16":
        raise OptionError("emulate=True needs precision 'float16': TF emulates float16 only (in its CPU mode)")
    return emulate


_LISTS = {}


def _check_device(device: str | None, precision: str) -> str:
    if device is None:
        return "gpu" if precision == "float16" else "cpu"
    if device not in DEVICES:
        raise OptionError(f"unknown device {device!r}: use 'gpu', 'cpu' or 'any'")
    return device


def _effective_lists(lists: OpLists | None, precision: str, level: str | None) -> OpLists:
    if level == "UNSAFE_FORCE_ALL" and precision == "bfloat16":
        raise OptionError("level UNSAFE_FORCE_ALL is not supported with bfloat16 (TF refuses it with oneDNN too)")
    if lists is None:
        # Reading the TOML lists costs milliseconds, a lot for a small graph; the result only depends on these.
        key = (precision, level, repr(changes_from_env()))
        if key not in _LISTS:
            _LISTS[key] = load_lists(precision, level=level)
        return _LISTS[key]
    if not isinstance(lists, OpLists) or lists.precision != precision:
        raise OptionError(f"lists must be an OpLists for {precision!r} (see mp_rewrite.load_lists)")
    return apply_level(lists, level)
