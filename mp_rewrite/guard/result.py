"""The accuracy guard's results: what it kept and why, the Coloring that shows it, and the overrides file that
re-applies the keep set (TOML or JSON)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ..core.coloring import Coloring
from ..errors import OptionError
from .search import OutputError
from ..core.body import RewriteResult

OVERRIDES_FORMAT = "mp_rewrite.accuracy_guard/1"
PREFIX = "kept float32 by the accuracy guard: "


@dataclasses.dataclass(frozen=True)
class KeptNode:
    """One node the guard keeps in float32.

    Attributes:
        node: the node name; pattern: the keep_fp32 pattern matching exactly it.
        stage: "screen" (a range finding) or "search" (its unit was needed to meet the tolerance).
        detail: the Reason detail shown by inspect/explain ("kept float32 by the accuracy guard: ...").
        unit: the unit's allow-list node (search), or the tensor whose range decided it (screen).
        share: the unit's share of the output error over all units measured alone (search), else None.
        alone: the outputs' error with only this unit in low precision (search), else None.
        flops: matmul/conv FLOPs of the unit (search) or node (screen) that now run in float32.
    """

    node: str
    pattern: str
    stage: str
    detail: str
    unit: str
    share: float | None = None
    alone: OutputError | None = None
    flops: int = 0


class GuardColoring(Coloring):
    """A Coloring whose keep_fp32 Reasons carry the guard's detail for the nodes it kept."""

    def __init__(self, base: Coloring, details: dict):
        self.__dict__.update(base.__dict__)
        self._details = details

    def decision(self, v: int):
        """The base Decision, with the guard's detail on its user_keep_fp32 Reason."""
        decision = super().decision(v)
        detail = self._details.get(decision.node)
        if detail is None or decision.reason.rule != "user_keep_fp32":
            return decision
        return dataclasses.replace(decision, reason=dataclasses.replace(decision.reason, detail=detail))


@dataclasses.dataclass
class Analysis:
    """What the guard measured before and while searching.

    Attributes:
        findings: the range screen's Findings (nodes that must stay float32).
        units: UnitErrors the side-by-side runs measured (units or whole regions, then the units of the regions
            kept; function bodies), each with its share of the error; empty when not attributed.
        boundaries: (Cast-to-float32 tensor of the mixed graph, its relative error against float32), per boundary.
        level: "unit" or "region" (what the first side-by-side run isolated), "" when attribution could not run
            (v1 control flow, or too big) and the search halved the units blind.
        unvarying: {output tensor: how its float32 value shows it does not depend on the calibration inputs}
            (analysis.compare.unvarying): the tolerance met there proves nothing.
    """

    findings: list = dataclasses.field(default_factory=list)
    units: list = dataclasses.field(default_factory=list)
    boundaries: list = dataclasses.field(default_factory=list)
    level: str = "unit"
    unvarying: dict = dataclasses.field(default_factory=dict)

    @property
    def attributed(self) -> bool:
        """True when the search was ranked by attribution."""
        return bool(self.level)


@dataclasses.dataclass
class GuardResult:
    """What `guard` did.

    Attributes:
        rewrite: the final RewriteResult (the plain one, untouched, when it met the tolerance).
        kept: the nodes kept in float32, in graph order (KeptNode).
        before, after: the outputs' error of the plain rewrite and of the final one.
        executions: graph executions used; runs: (what, seconds) per execution; seconds: wall time of the guard.
        analysis: what the screen and the attribution measured (Analysis).
        attempts: every keep set checked, in order; precision, rtol, atol: the check's settings.
        user_keep_fp32: the caller's own keep_fp32 patterns (applied in every rewrite).
    """

    rewrite: RewriteResult
    kept: list
    before: OutputError
    after: OutputError
    executions: int
    runs: list
    seconds: float
    analysis: Analysis
    attempts: list
    precision: str
    rtol: float
    atol: float
    user_keep_fp32: tuple = ()

    @property
    def met(self) -> bool:
        """True when the final rewrite meets the tolerance."""
        return self.after.passed

    @property
    def keep_fp32(self) -> tuple:
        """The keep_fp32 patterns that reproduce the final rewrite (the caller's, then the guard's)."""
        return tuple(self.user_keep_fp32) + tuple(k.pattern for k in self.kept)

    def flop_share(self):
        """flops.FlopShare of the final rewrite: matmul/conv FLOPs in low precision against all of them."""
        from ..analysis.flops import low_precision_flop_share
        return low_precision_flop_share(self.rewrite)

    def summary(self) -> str:
        """A few lines: outcome, errors before/after, executions, and each kept node with its reason."""
        state = "met" if self.met else "NOT met"
        lines = [f"accuracy guard ({self.precision}, rtol={self.rtol:g}, atol={self.atol:g}): tolerance {state} "
                 f"after {self.executions} graph executions in {self.seconds:.1f} s",
                 f"  plain conversion: {self.before.text()}", f"  final:            {self.after.text()}"]
        same = self.analysis.unvarying
        if same:
            lines.append(f"  {len(same)} of the outputs do not depend on the calibration inputs ("
                         + "; ".join(f"{name}: {how}" for name, how in same.items())
                         + "): the tolerance met there proves nothing; give inputs they depend on (--inputs)")
        screen = sum(k.stage == "screen" for k in self.kept)
        lines.append(f"  kept float32: {len(self.kept)} nodes ({screen} by the range screen, "
                     f"{len(self.kept) - screen} by the search)")
        lines += _grouped_reasons(self.kept)
        if self.analysis.findings and not self.kept:
            lines.append(f"  (the range screen flagged {len(self.analysis.findings)} nodes, e.g. "
                         f"{self.analysis.findings[0].node}: {self.analysis.findings[0].detail}; the plain "
                         "conversion meets the tolerance anyway, so nothing was kept)")
        lines.append("  graph executions:")
        lines += [f"    {i}. {what} ({seconds:.2f} s)" for i, (what, seconds) in enumerate(self.runs, 1)]
        return "\n".join(lines)

    def overrides(self) -> dict:
        """The keep set as plain data (what save_overrides writes)."""
        return {"format": OVERRIDES_FORMAT, "precision": self.precision, "rtol": self.rtol, "atol": self.atol,
                "keep_fp32": list(self.keep_fp32),
                "nodes": [{"node": k.node, "pattern": k.pattern, "stage": k.stage, "reason": k.detail}
                          for k in self.kept]}

    def save_overrides(self, path) -> Path:
        """Write the keep set to `path`: TOML for a ".toml" suffix, JSON otherwise. Returns the path."""
        return write_overrides(path, self.overrides())


def check_overrides_path(path) -> Path:
    """Check, before any work, that an overrides file can be written at `path` (its directory exists and is
    writable, and it is not a directory).

    Raises:
        OptionError: saying what is wrong with the path.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        why = "is a directory"
    elif not parent.is_dir():
        why = f"its directory '{parent}' does not exist"
    elif not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = "cannot be written (permission denied)"
    else:
        return path
    raise OptionError(f"--guard-overrides '{path}' {why}; give a file path (.toml or .json) you can write to")


def write_overrides(path, data: dict) -> Path:
    """Write overrides data (GuardResult.overrides()) as TOML for a ".toml" suffix, JSON otherwise.

    Raises:
        OptionError: the file cannot be written.
    """
    path = Path(path)
    text = _toml(data) if path.suffix == ".toml" else json.dumps(data, indent=1) + "\n"
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OptionError(f"cannot write the guard overrides to '{path}': {e.strerror}") from None
    return path


def load_overrides(path) -> tuple:
    """The keep_fp32 patterns of an overrides file written by GuardResult.save_overrides (TOML or JSON).

    Raises:
        OptionError: the file is missing, unreadable or not a guard overrides file.
    """
    return tuple(_read_overrides(path)["keep_fp32"])


def load_override_reasons(path) -> dict:
    """pattern -> the guard's reason for it ("" for the user's own patterns), from an overrides file: the text a
    Reason detail can carry when the file is re-applied (see load_overrides)."""
    data = _read_overrides(path)
    reasons = {n.get("pattern"): n.get("reason", "") for n in data.get("nodes", []) if isinstance(n, dict)}
    return {p: reasons.get(p, "") for p in data["keep_fp32"]}


def _read_overrides(path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".toml":
            import tomllib
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except (OSError, ValueError) as e:
        raise OptionError(f"cannot read guard overrides '{path}': {e}") from None
    if not isinstance(data, dict) or data.get("format") != OVERRIDES_FORMAT:
        raise OptionError(f"'{path}' is not an accuracy guard overrides file (format {OVERRIDES_FORMAT!r}); "
                          "write one with GuardResult.save_overrides")
    patterns = data.get("keep_fp32")
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise OptionError(f"'{path}': keep_fp32 must be a list of node-name patterns")
    return data


def _toml(data: dict) -> str:
    q = lambda s: json.dumps(s, ensure_ascii=False)  # noqa: E731  (a JSON string is a TOML basic string)
    lines = [f"format = {q(data['format'])}", f"precision = {q(data['precision'])}",
             f"rtol = {data['rtol']!r}", f"atol = {data['atol']!r}", "keep_fp32 = ["]
    lines += [f"    {q(p)}," for p in data["keep_fp32"]] + ["]"]
    for node in data["nodes"]:
        lines += ["", "[[nodes]]"] + [f"{key} = {q(value)}" for key, value in node.items()]
    return "\n".join(lines) + "\n"


def _grouped_reasons(kept, shown: int = 3) -> list[str]:
    """One line per kept node, or per reason when several nodes share it (the first few named, then a count)."""
    groups = {}
    for k in kept:
        groups.setdefault(k.detail[len(PREFIX):], []).append(k.node)
    lines = []
    for reason, nodes in groups.items():
        if len(nodes) == 1:
            lines.append(f"    {nodes[0]}: {reason}")
        else:
            more = f" and {len(nodes) - shown} more" if len(nodes) > shown else ""
            lines.append(f"    {len(nodes)} nodes ({', '.join(nodes[:shown])}{more}): {reason}")
    return lines
