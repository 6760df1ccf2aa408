"""Subcommands of `mp-rewrite`, one module each (see mp_rewrite/cli.py)."""
