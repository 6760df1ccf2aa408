"""MP_REWRITE_ASSIGN: the precision assignment when none is asked for, read the same way by the API and the CLI
(no TensorFlow here: the CLI reads it before TensorFlow's logging is set up)."""

from __future__ import annotations

import os

from ..errors import OptionError

ASSIGN_ENV = "MP_REWRITE_ASSIGN"  # lists|cost: the assignment when none is asked for (the API and the CLI alike)


def assign_from_env() -> str:
    """The assignment MP_REWRITE_ASSIGN asks for: "lists", "cost", or "" where it is unset.

    Raises:
        OptionError: it is set to anything else.
    """
    chosen = os.environ.get(ASSIGN_ENV, "").strip()
    if chosen and chosen not in ("lists", "cost"):
        raise OptionError(f"{ASSIGN_ENV}={chosen!r} is not an assignment: set it to 'lists' or 'cost', or unset it")
    return chosen
