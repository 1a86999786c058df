"""The command-line layer: `--set KEY=VALUE`, repeatable, on the commands that resolve settings."""

from __future__ import annotations

import argparse


def add_set_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for this run, above config.toml and the environment (e.g. gateway_port=8000, "
        "supervision.start_timeout_s=1800; see `llmconsole config show`); never a secret",
    )
