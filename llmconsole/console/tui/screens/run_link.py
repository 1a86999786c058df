"""A run screen's calls to the daemon about its sweep or tune (POST /v1/runs and the run's own
routes). Each is made in a worker thread, one at a time, and its answer goes back to the screen
as a message (messages.py): nothing here raises into the UI."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel
from textual.message import Message

from llmconsole.console.tui.messages import RunFinished, RunPolled, RunStarted

if TYPE_CHECKING:
    from llmconsole.console.client import DaemonClient
    from llmconsole.console.tui.sources.daemon import Dial

NO_DAEMON = "this console is not attached to a live daemon (a recording replays); nothing was started"


def error_text(e: BaseException) -> str:
    # The CLI's own errors (engine not ready, ...) and the daemon's refusals read as sentences.
    from llmconsole.console.cli_common import CliError
    from llmconsole.console.client import DaemonError

    return str(e) if isinstance(e, (CliError, DaemonError)) else f"{type(e).__name__}: {e}"


class RunLink:
    def __init__(self, dial: Callable[[], Dial | None], what: str, post: Callable[[Message], object]) -> None:
        self.dial = dial  # the screen's, read when the client is made (None: a replayed console)
        self.what = what  # the daemon's run kind: sweep | tune
        self.post = post  # the screen's post_message
        self._client: DaemonClient | None = None

    def client(self) -> DaemonClient:
        """One client of the daemon for the screen's calls."""
        if self._client is None:
            dial = self.dial()
            if dial is None:
                raise RuntimeError(NO_DAEMON)
            self._client = dial(30.0)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def start(self, request: BaseModel) -> None:
        try:
            run = self.client().start_run(self.what, request.model_dump())
        except Exception as e:  # noqa: BLE001 - the daemon's refusal, or no daemon: shown, never raised
            self.post(RunFinished(None, f"the {self.what} did not start: {error_text(e)}"))
        else:
            self.post(RunStarted(run))

    def find(self, engine: str) -> None:
        """A run of `engine` under way (started by any console), if there is one."""
        try:
            runs = self.client().runs(engine)
        except Exception:  # noqa: BLE001 - an older daemon, or none: the form stays as it is
            return
        running = [r for r in runs if r["kind"] == self.what and r["state"] == "running"]
        if running:
            self.post(RunStarted(running[-1], found=True))

    def poll(self, run_id: int | None, since: int) -> None:
        if run_id is None:
            return
        try:
            reply = self.client().run(run_id, since=since)
        except Exception as e:  # noqa: BLE001 - a daemon restart, say: shown, and polled again
            self.post(RunPolled(None, error_text(e)))
        else:
            self.post(RunPolled(reply))

    def cancel(self, run_id: int) -> None:
        try:
            self.client().cancel_run(run_id)
        except Exception as e:  # noqa: BLE001
            self.post(RunPolled(None, f"the cancel did not reach the daemon: {error_text(e)}"))
