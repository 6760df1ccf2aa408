"""Subcommands of `mp-rewrite`, one module each (see mp_rewrite/commands/cli.py)."""
