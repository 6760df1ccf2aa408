"""The package's layout stays true: imports point one way, modules stay small, `import mp_rewrite` stays light.

    commands/  ->  savedmodel/, training/, guard/, report/  ->  analysis/, model/, rules/  ->  core/  (and errors)

Every import is read from the source (module-level and inside functions, relative and absolute), so a lazy import
that breaks the direction is caught as surely as a top-level one.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mp_rewrite"
MAX_LINES = 400

# What each part of the package may import besides itself and mp_rewrite.errors. `guard` builds on the SavedModel
# reader for its SavedModel entry point; `commands.demo` runs the bundled example models of `testing`.
ALLOWED = {
    "errors": set(),
    "version": set(),
    "core": set(),
    "analysis": {"core"},
    "model": {"core"},
    "rules": {"core"},
    "savedmodel": {"analysis", "model", "rules", "core"},
    "training": {"analysis", "rules", "core"},
    "report": {"analysis", "model", "core"},
    "guard": {"savedmodel", "analysis", "model", "core"},
    "commands": {"savedmodel", "training", "guard", "report", "analysis", "model", "rules", "core"},
    "testing": {"savedmodel", "training", "guard", "report", "analysis", "model", "rules", "core"},
    # The package root wires the dump on demand (report) to the core's observers and exports the public names.
    "__init__": {"core", "report", "version"},
    "__main__": {"commands"},
}
# The SavedModel conversion is one orchestrator (savedmodel/convert.py) over strategies that never import it.
STRATEGIES = ("savedmodel.in_place", "savedmodel.freeze", "savedmodel.frozen_signature", "savedmodel.frozen_function",
              "savedmodel.loadable_copy", "savedmodel.result")
EXCEPTIONS = {("commands.demo", "testing")}


def module_name(path: pathlib.Path) -> str:
    """'core.rewrite' for mp_rewrite/core/rewrite.py, 'core' for mp_rewrite/core/__init__.py."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every mp_rewrite module `source` imports, as names relative to the package ('core.rewrite', 'errors')."""
    found = set()
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "mp_rewrite")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(["mp_rewrite", *base] + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "mp_rewrite":
                target = node.module
            else:
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import dtypes` imports a module
    return {name.removeprefix("mp_rewrite").lstrip(".") for name in found}


def violations(module: str, imports: set[str]) -> list[str]:
    """The imports of `module` that break the direction (names that are not modules are ignored upstream)."""
    part = module.split(".")[0] or "__init__"
    allowed = ALLOWED[part] | {part, "errors", "version"}  # two leaves that import nothing
    first = {}  # one line per forbidden part: its shortest imported name
    for name in sorted(imports, key=len):
        target = name.split(".")[0]
        if target in ALLOWED and target not in allowed and (module, target) not in EXCEPTIONS:
            first.setdefault(target, f"mp_rewrite.{module} imports mp_rewrite.{name}")
    return sorted(first.values())


def package_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, module_name(path)


def test_every_part_is_known():
    parts = {module.split(".")[0] for _, module in package_modules()}
    assert parts <= set(ALLOWED), f"add {sorted(parts - set(ALLOWED))} to ALLOWED with its allowed imports"


def test_imports_point_one_way():
    bad = []
    for path, module in package_modules():
        imports = imported_modules(path.read_text(), module, path.name == "__init__.py")
        bad += violations(module, imports)
    assert not bad, "imports against the layout (see docs/contracts.md):\n" + "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("from ..report.dump import dump_rewrite", ["mp_rewrite.core.rewrite imports mp_rewrite.report.dump"]),
    ("def f():\n    from ..savedmodel import convert\n", ["mp_rewrite.core.rewrite imports mp_rewrite.savedmodel"]),
    ("import mp_rewrite.commands.cli", ["mp_rewrite.core.rewrite imports mp_rewrite.commands.cli"]),
    ("from mp_rewrite.training import api", ["mp_rewrite.core.rewrite imports mp_rewrite.training"]),
    ("from . import dtypes\nfrom ..errors import GraphError", []),
])
def test_the_check_catches_a_core_module_importing_a_front_end(source, expected):
    assert violations("core.rewrite", imported_modules(source, "core.rewrite", False)) == expected


def test_strategies_do_not_import_the_orchestrator():
    bad = []
    for path, module in package_modules():
        if module in STRATEGIES:
            imports = imported_modules(path.read_text(), module, False)
            bad += [f"mp_rewrite.{module} imports mp_rewrite.{name}" for name in imports
                    if name == "savedmodel.convert" or name.startswith("savedmodel.convert.")]
    assert not bad, "a strategy imports the orchestrator:\n" + "\n".join(bad)


def test_modules_stay_under_400_lines():
    long = {module: n for path, module in package_modules() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules by concern (house limit {MAX_LINES} lines): {long}"


def test_import_mp_rewrite_does_not_start_tensorflow():
    code = ("import sys, mp_rewrite, mp_rewrite.commands.cli; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'; print(mp_rewrite.__version__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
