"""`llmconsole config show`: every setting, its value, and where that value came from.

  llmconsole config show                      default / config.toml:LINE / env NAME / flag, per setting
  llmconsole config show --json               the same for scripts; a secret is only {"set": true}
  llmconsole config show --set gateway_port=9000   what a daemon started with that flag would use
  llmconsole --host gpu1 config show          that host's, as its shell would give them (over ssh)

It resolves the layers as a daemon started from this shell would (docs/settings.md): a daemon
already running keeps the settings it started with. A bad setting is reported with its source,
exit 2, exactly as the daemon would refuse it.
"""

from __future__ import annotations

import argparse
import json

from llmconsole.console.cli_common import EXIT_USAGE, CliError
from llmconsole.settings import SettingsError, load
from llmconsole.settings.flags import add_set_flag
from llmconsole.settings.table import rows


def cmd_show(ns: argparse.Namespace) -> int:
    try:
        resolved = load(ns.set)
    except SettingsError as e:
        raise CliError(f"settings: {e}", EXIT_USAGE) from None
    table = rows(resolved)
    if ns.json:
        doc = {
            "config_file": str(resolved.config_file),
            "config_found": resolved.config_found,
            "settings": [r.as_json() for r in table],
        }
        print(json.dumps(doc, indent=1))
        return 0
    found = "" if resolved.config_found else " (none there: defaults, environment and flags only)"
    print(f"config file {resolved.config_file}{found}")
    width_key = max(len(r.key) for r in table)
    width_value = min(40, max(len(r.value) for r in table))
    print(f"{'SETTING':<{width_key}}  {'VALUE':<{width_value}}  FROM")
    for r in table:
        print(f"{r.key:<{width_key}}  {r.value:<{width_value}}  {r.origin}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("config", help="llmconsole's settings: values and where each came from")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    show = csub.add_parser(
        "show", help="every setting, its value and its source (default, config.toml, env, flag); secrets hidden"
    )
    show.add_argument("--json", action="store_true")
    add_set_flag(show)
    show.set_defaults(func=cmd_show)
