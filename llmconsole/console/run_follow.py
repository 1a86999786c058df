"""Following a sweep or tune the daemon runs: starting it, its events until it ends, and what
Ctrl-C, SIGTERM and SIGHUP do to the CLI that follows it (commands/runs.py says why).

`sweep`, `tune` and `runs attach` follow runs through here; `runs` hands a run to the sweep or tune
command that prints it, so this is apart from both.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from llmconsole.console.cli_common import EXIT_FAILED, EXIT_USAGE, CliError
from llmconsole.console.client import DaemonClient, DaemonError

POLL_S = 1.0
EXIT_INTERRUPTED = 130

Event = dict[str, Any]


def start(client: DaemonClient, kind: str, request: dict[str, Any]) -> dict[str, Any]:
    """The run as the daemon started it; a request it refuses is the CLI's error, nothing started."""
    try:
        return client.start_run(kind, request)
    except DaemonError as e:
        raise CliError(str(e), EXIT_USAGE if e.status == 400 else EXIT_FAILED) from None


def detached(record: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps({k: v for k, v in record.items() if k not in ("new_events", "outcome")}, indent=2))
    else:
        print(
            f"run {record['id']}: {record['kind']} of {record['engine']} runs in the daemon; "
            f"follow it with `llmconsole runs attach {record['id']}`, stop it with `llmconsole runs cancel {record['id']}`"
        )
    return 0


@contextmanager
def _signals(handled: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM counted into `handled` rather than ending the CLI. SIGHUP keeps its
    default, which ends the CLI alone: the run goes on in the daemon."""

    def count(signum: int, frame: object) -> None:
        handled.append(signum)

    old = {s: signal.signal(s, count) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def follow(
    client: DaemonClient, record: dict[str, Any], on_event: Callable[[Event], None], *, owner: bool
) -> dict[str, Any]:
    """Hand each of the run's events to `on_event` until it ends; the run's final record.

    `owner` (the CLI that started the run): the first Ctrl-C or SIGTERM cancels the run and the
    following goes on until the engine is back; a second leaves the rest to the daemon. Otherwise
    (attach) the first one stops the watching, and the run goes on."""
    run_id = record["id"]
    for ev in record.get("new_events") or ():
        on_event(ev)
    since = int(record.get("events_from", 0)) + len(record.get("new_events") or ())
    handled: list[int] = []
    cancelled = False
    with _signals(handled):
        while record["state"] == "running":
            if handled and (not owner or cancelled and len(handled) > 1):
                raise CliError(
                    f"run {run_id} goes on in the daemon; `llmconsole runs attach {run_id}` follows it, "
                    f"`llmconsole runs cancel {run_id}` stops it",
                    EXIT_INTERRUPTED,
                )
            if handled and not cancelled:
                cancelled = True
                client.cancel_run(run_id)
                print(
                    f"[run {run_id}] cancelling: what is under way finishes, then the engine's config is put back "
                    "(interrupt again to leave that to the daemon)",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(POLL_S)
            record = get_run(client, run_id, since)
            for ev in record["new_events"]:
                on_event(ev)
            since += len(record["new_events"])
    return record


def get_run(client: DaemonClient, run_id: int, since: int) -> dict[str, Any]:
    try:
        return client.run(run_id, since)
    except DaemonError as e:
        raise CliError(str(e)) from None
