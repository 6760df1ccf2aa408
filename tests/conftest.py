"""Shared test set-up: quiet TensorFlow, oneDNN on, fixed seeds.

The project depends on the `tensorflow` wheel (tf-keras and keras-hub need it, and one TensorFlow must be installed);
that wheel is built with CUDA and leaves oneDNN off by default, and TF's own bfloat16 pass (the oracle) and fast
bfloat16 CPU kernels need oneDNN. `mp-rewrite` turns it on the same way (mp_rewrite/commands/cli.py).
"""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# `convert`'s default for a CPU is the cost assignment, measured on the machine: the tests that check what a
# conversion writes check Grappler's lists, the same on every machine (tests/savedmodel/test_default_assign.py
# checks the default itself).
os.environ["MP_REWRITE_ASSIGN"] = "lists"
# What conversions keep between runs (measured costs, split timings) goes to a cache of the tests' own, removed at
# exit: the tests neither read what a user's conversions measured nor leave theirs in the user's cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="mp_rewrite-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


def pytest_collection_modifyitems(items):
    """The tests marked `first` run first (a stable sort): under two workers (-n 2 --dist loadfile) the README's
    commands, 5 minutes, started last and ran alone at the end while the other worker idled."""
    items.sort(key=lambda item: item.get_closest_marker("first") is None)


@pytest.fixture(scope="session")
def small_cnn(tmp_path_factory):
    """A small Keras CNN with BatchNorm (16x16 images), exported as a SavedModel once per session; only read."""
    from mp_rewrite.testing import example_models
    path = tmp_path_factory.mktemp("small_cnn") / "cnn"
    example_models.cnn_bn(image_size=16).export(str(path), verbose=False)
    return path
