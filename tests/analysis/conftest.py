"""One cost cache for the whole session, so the Cast timings and shared op signatures are measured once."""

import os

import pytest


@pytest.fixture(scope="session")
def cost_cache(tmp_path_factory):
    """Point $XDG_CACHE_HOME at a fresh directory for the session (restored afterwards); returns it."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))
    yield os.environ["XDG_CACHE_HOME"]
    if old is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = old
