"""`llmconsole console`: open the console even where `llmconsole` alone would print the status
(as when stdout is not a terminal the shell can see, e.g. under make). With `--host` (before the
command, repeatable) or `--all-hosts` it is one console over those hosts' daemons."""

from __future__ import annotations

import argparse


def cmd_console(ns: argparse.Namespace) -> int:
    from llmconsole.console.tui.run import run_console, run_fleet_console

    hosts = ns.catalog.all_hosts() if ns.all_hosts else ns.targets
    if any(not h.is_local for h in hosts):
        return run_fleet_console(hosts)
    return run_console()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("console", help="open the console (what `llmconsole` alone does at a terminal)")
    c.add_argument(
        "--all-hosts",
        action="store_true",
        help="one console over this host and every host of the hosts file (else the --host given, or this one)",
    )
    c.set_defaults(func=cmd_console)
