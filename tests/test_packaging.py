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
