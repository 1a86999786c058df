"""`llmconsole runs`: the sweeps and tunes under way in the daemon, and following one of them.

Every sweep and tune runs in the daemon (daemon/services/run_service.py): the CLI that started
one only follows it. Losing the terminal (SIGHUP, an SSH session gone) or killing the CLI ends
the following, never the run, and the runner puts the engine's config back whatever happens to
the CLI. Ctrl-C or SIGTERM in the CLI that started the run asks the daemon to cancel it and
waits for the engine to be put back; in `runs attach` they only stop the watching.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from llmconsole.console.cli_common import CliError, confirm, daemon_client, na
from llmconsole.console.client import DaemonClient
from llmconsole.console.run_follow import follow, get_run
from llmconsole.wire.runs import RunsAnswer, RunSummary


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("runs", help="the sweeps and tunes the daemon runs: list, attach, cancel")
    p.add_argument("--engine", help="only this engine's runs")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    rsub = p.add_subparsers(dest="runs_cmd")
    a = rsub.add_parser("attach", help="follow a run to its end, as the sweep or tune that started it prints it")
    a.add_argument("id", type=int)
    a.add_argument("--json", action="store_true", help="print the result as JSON")
    c = rsub.add_parser("cancel", help="stop a run after what is under way; it puts the engine back")
    c.add_argument("id", type=int)
    c.add_argument("--yes", action="store_true", help="do not ask first")
    p.set_defaults(func=cmd_runs)


def cmd_runs(ns: argparse.Namespace) -> int:
    with daemon_client() as client:
        if ns.runs_cmd == "attach":
            return attach(client, ns.id, as_json=ns.json)
        if ns.runs_cmd == "cancel":
            return cancel(client, ns.id, yes=ns.yes)
        runs = RunsAnswer.model_validate({"runs": client.runs(ns.engine)}).runs
    if ns.json:
        print(json.dumps([r.to_wire() for r in runs], indent=2))
    else:
        print("\n".join(runs_table(runs)) if runs else "no runs")
    return 0


def runs_table(runs: list[RunSummary]) -> list[str]:
    lines = [f"{'id':>4}  {'kind':<5} {'engine':<16} {'state':<10} {'started':<19} {'events':>6}  actor"]
    for r in sorted(runs, key=lambda r: r.id or 0):
        started = datetime.fromtimestamp(r.started_at).strftime("%Y-%m-%d %H:%M:%S") if r.started_at else "-"
        state = "cancelling" if r.state == "running" and r.cancel_requested else (r.state or "?")
        lines.append(
            f"{na(r.id):>4}  {r.kind or '?':<5} {r.engine or '?':<16} {state:<10} {started:<19} {r.events:>6}  {r.actor}"
        )
    return lines


def attach(client: DaemonClient, run_id: int, *, as_json: bool) -> int:
    """Follow a run that is under way (or show one that ended) as its own command shows it."""
    record = get_run(client, run_id, 0)
    if record["kind"] == "sweep":
        from llmconsole.console.commands import sweep

        return sweep.follow_run(client, record, out=None, as_json=as_json, owner=False)
    from llmconsole.console.commands import tune

    return tune.follow_run(client, record, apply=False, as_json=as_json, owner=False)


def cancel(client: DaemonClient, run_id: int, *, yes: bool) -> int:
    record = get_run(client, run_id, 0)
    if record["state"] != "running":
        print(f"run {run_id} has already ended: {record['state']}")
        return 0
    confirm(f"Cancel run {run_id} ({record['kind']} of {record['engine']}), putting the engine's config back?", yes)
    client.cancel_run(run_id)
    print(f"run {run_id}: cancelling; waiting for the engine's config to be put back", file=sys.stderr, flush=True)
    end = follow(client, record, lambda ev: None, owner=False)
    outcome = end.get("outcome") or {}
    if end["state"] == "failed" and not outcome:
        raise CliError(f"run {run_id} failed: {end.get('error')}")
    if not outcome.get("restored", False):
        raise CliError(
            f"run {run_id} ended, but the engine's original config was NOT restored: {outcome.get('restore_error')}"
        )
    print(f"run {run_id} {end['state']}; the engine runs its original config {outcome.get('original_config_id')}")
    return 0
