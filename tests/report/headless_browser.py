"""Debian's headless Chromium for the browser tests of the HTML pages: it runs a page's JavaScript and dumps the
resulting DOM (`--dump-dom`). Where it is missing or cannot run, the tests skip with the reason."""

from __future__ import annotations

import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no headless browser: apt-get install chromium "
                                    "(.ci/run installs it)")


def dump_dom(url: str, *options: str) -> str:
    """The DOM of `url` after its scripts ran (a 5 s virtual time budget), with more Chromium `options`."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           *options, "--virtual-time-budget=5000", "--dump-dom", url]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip("chromium did not finish in 120 s")
    if done.returncode != 0 or "<html" not in done.stdout:
        pytest.skip(f"chromium cannot run here: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout
