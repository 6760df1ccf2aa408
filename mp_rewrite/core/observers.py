"""Observers of the pass: callables the core calls after every rewrite, without knowing who listens.

The core never imports a front end. A front end that wants to hear of every rewrite (the dump on demand of
mp_rewrite.report.dump, a progress display, a test) registers a callable here.
"""

from __future__ import annotations

import logging
import threading

_OBSERVERS: list = []
_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def add_rewrite_observer(observer) -> None:
    """Call `observer(result, input_graph_def, label)` after every rewrite of a graph or function body.

    Adding the same callable twice registers it once. An observer must not modify what it is given.
    """
    with _LOCK:
        if observer not in _OBSERVERS:
            _OBSERVERS.append(observer)


def remove_rewrite_observer(observer) -> None:
    """Stop calling `observer`; removing one that is not registered does nothing."""
    with _LOCK:
        if observer in _OBSERVERS:
            _OBSERVERS.remove(observer)


def notify_rewrite(result, input_graph_def, label: str) -> None:
    """Tell every observer of a finished rewrite. An observer that raises is logged and never breaks the rewrite."""
    with _LOCK:
        observers = list(_OBSERVERS)
    for observer in observers:
        try:
            observer(result, input_graph_def, label)
        except Exception as e:  # an observer's failure must not lose the user's rewrite
            log.warning("mp_rewrite: rewrite observer %r failed on '%s': %s", observer, label, e)
