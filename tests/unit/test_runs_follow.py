"""How the CLI follows a run the daemon holds: which signal cancels it and which only stops the
watching. The run's records are scripted; the signals are real, sent to this process."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from llmconsole.console import run_follow as runs
from llmconsole.console.cli_common import CliError


class ScriptedRuns:
    """The daemon's side of one run: `running` polls, then it ends; `signal_at` sends this
    process a signal on that poll, as a terminal would while the CLI waits."""

    def __init__(self, running: int, signal_at: dict[int, int]):
        self.running, self.signal_at = running, signal_at
        self.polls = 0
        self.cancels: list[int] = []

    def run(self, run_id: int, since: int = 0) -> dict[str, Any]:
        self.polls += 1
        if self.polls in self.signal_at:
            os.kill(os.getpid(), self.signal_at[self.polls])
        state = "running" if self.polls <= self.running else ("cancelled" if self.cancels else "done")
        return record(run_id, state, [{"event": "tick", "n": self.polls}], since)

    def cancel_run(self, run_id: int) -> dict[str, Any]:
        self.cancels.append(run_id)
        return record(run_id, "running", [], 0)


def record(run_id: int, state: str, events: list[dict[str, Any]], since: int) -> dict[str, Any]:
    return {"id": run_id, "state": state, "events_from": since, "new_events": events, "outcome": None}


@pytest.fixture(autouse=True)
def no_wait(monkeypatch):
    monkeypatch.setattr(runs, "POLL_S", 0.0)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_starting_cli_cancels_once_and_waits_for_the_end(signum):
    client = ScriptedRuns(running=4, signal_at={1: signum})
    seen: list[int] = []
    # What the handlers were: Python's own, or ignored where the suite runs as a background job.
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    end = runs.follow(client, record(7, "running", [], 0), lambda ev: seen.append(ev["n"]), owner=True)  # type: ignore[arg-type]
    assert client.cancels == [7]
    assert end["state"] == "cancelled" and seen == [1, 2, 3, 4, 5]  # followed to the end, every event once
    assert {s: signal.getsignal(s) for s in before} == before  # put back


def test_a_second_interrupt_leaves_the_rest_to_the_daemon():
    client = ScriptedRuns(running=10, signal_at={1: signal.SIGINT, 3: signal.SIGINT})
    with pytest.raises(CliError) as err:
        runs.follow(client, record(7, "running", [], 0), lambda ev: None, owner=True)  # type: ignore[arg-type]
    assert err.value.code == runs.EXIT_INTERRUPTED and "runs attach 7" in str(err.value)
    assert client.cancels == [7] and client.polls == 3


def test_attach_stops_watching_and_never_cancels():
    client = ScriptedRuns(running=10, signal_at={2: signal.SIGINT})
    with pytest.raises(CliError) as err:
        runs.follow(client, record(7, "running", [], 0), lambda ev: None, owner=False)  # type: ignore[arg-type]
    assert err.value.code == runs.EXIT_INTERRUPTED and "goes on in the daemon" in str(err.value)
    assert client.cancels == []
