"""`llmconsole console`: open the console even where `llmconsole` alone would print the status
(as when stdout is not a terminal the shell can see, e.g. under make)."""

from __future__ import annotations

import argparse


def cmd_console(ns: argparse.Namespace) -> int:
    from llmconsole.console.tui.run import run_console

    return run_console()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("console", help="open the console (what `llmconsole` alone does at a terminal)")
    c.set_defaults(func=cmd_console)
