"""The package metadata covers the code: every subpackage ships, and the console script points at a real main."""

import configparser
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {p.strip() for p in cfg["options"]["packages"].replace(",", "\n").split() if p.strip()}
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mp_rewrite").rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [options] packages in setup.cfg"
    assert "mp_rewrite.lists" in listed


def test_console_script_target_exists():
    from mp_rewrite.commands import cli
    assert callable(cli.main)
    assert cli.main(["--version"]) == 0


def test_the_built_wheel_ships_every_module_and_the_lists(tmp_path):
    """Build the wheel as pip would (from a copy of the sources, so the checkout stays clean) and read it."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "src"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("mp_rewrite", "lists"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("mp_rewrite-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "mp_rewrite").rglob("*.py")}
    assert not modules - shipped, f"missing from the wheel: {sorted(modules - shipped)}"
    lists = {f"mp_rewrite/lists/{p.name}" for p in (ROOT / "lists").glob("*.toml")}
    assert lists and not lists - shipped, f"op lists missing from the wheel: {sorted(lists - shipped)}"
    entry_points = next(n for n in shipped if n.endswith(".dist-info/entry_points.txt"))
    assert "mp-rewrite = mp_rewrite.commands.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
