"""`python -m mp_rewrite ...` is the `mp-rewrite` command."""

import sys

from .commands.cli import main

sys.exit(main())
