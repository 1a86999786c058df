"""Subcommands beyond the core ones in cli.py, one module each.

Every module here (names starting with '_' excluded) has `register(subparsers)`, which adds its
parsers and sets `func` on them; `func(ns)` returns an exit code or raises CliError.
"""
