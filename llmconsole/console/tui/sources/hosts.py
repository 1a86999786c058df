"""The console's source over several hosts' daemons: each host polled on its own, commands sent to
the host of the engine they name.

Every host has two long-lived clients (console/hosts.py `client_for`): one for the polls (and the
log, history and samples reads), one for commands, so a stop that drains for 30 s never holds up
the 1 Hz poll. A poll asks every host that has no question pending, in parallel, and waits for
the answers at most WAIT_S: a host that is slow (or whose ssh hangs) keeps its question pending
and its last figures, and does not hold up the others, whose new figures show at once. A host
ssh cannot reach shows ssh's reason; its client backs off (1 s, 2 s, ... a minute) and the polls
in between are answered at once from the backoff. What asks every host at once (the alerts, a
stop of everything, closing at quit) asks them in parallel and waits a bounded time: a host that
took the connection and never answers is named as such, the others' answers are not held up.
No daemon is started by a poll, nor by any command but an engine start, which starts its host's
daemon as `llmconsole engine start ENGINE@HOST` does.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning, HostUnreachable, ensure_daemon
from llmconsole.console.hosts import Host, client_for
from llmconsole.console.tui.sources.daemon import Command, Dial, carry_out
from llmconsole.console.tui.sources.merge import HostState, engine_key, fleet_alerts, fleet_status, split_key
from llmconsole.paths import resolve
from llmconsole.wire.status import EngineInfo

STOPPABLE = ("starting", "ready", "unhealthy", "crashed")
NO_DAEMON = "no llmconsole daemon is running"


class _Link:
    """One host's clients, made when first needed."""

    def __init__(self, host: Host, poll_timeout_s: float, dial: Callable[..., DaemonClient]) -> None:
        self.host, self.poll_timeout_s, self.dial = host, poll_timeout_s, dial
        self.lock = threading.Lock()  # one command at a time per host
        self._dialing = threading.Lock()  # the polls' client is made once, whichever thread asks first
        self._poll: DaemonClient | None = None
        self._commands: DaemonClient | None = None
        self.session_id: int | None = None

    def poller(self) -> DaemonClient:
        with self._dialing:
            if self._poll is None:
                self._poll = self.dial(self.host, timeout_s=self.poll_timeout_s)
            return self._poll

    def status(self) -> dict[str, Any]:
        return self.poller().status()

    def commander(self) -> DaemonClient:
        """The commands' client, tagged with this console's operator session on that host."""
        if self._commands is None:
            self._commands = self.dial(self.host, timeout_s=180.0)
            try:
                self.session_id = self._commands.begin_session("tui")
            except Exception:  # an older daemon, or none yet: commands go without a session
                self.session_id = None
            self._commands.set_session(self.session_id)
        return self._commands

    def start_daemon(self) -> None:
        """Start the host's daemon, as `engine start` does: here directly, there by dial-stdio."""
        if self.host.is_local:
            ensure_daemon(resolve())[0].close()
        else:
            with self.dial(self.host, timeout_s=60.0, start_daemon=True) as c:
                c.daemon_info()
        if self._commands is not None:  # its session was refused by no daemon: begin it again
            self._commands.close()
            self._commands = None

    def alerts(self) -> dict[str, Any]:
        return self.poller().alerts()

    def engines(self) -> list[EngineInfo]:
        """The host's engines, asked with the polls' timeout: a host that does not answer is
        known for it in seconds, not after a command's minutes."""
        return self.poller().status_answer().engines

    def close(self) -> None:
        if self._commands is not None and self.session_id is not None:
            try:
                self._commands.end_session(self.session_id)
            except Exception:
                pass  # the host went first; the session stays open-ended in its store
        for c in (self._poll, self._commands):
            if c is not None:
                c.close()


def _outcome(call: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any] | None, str | None, bool, float | None]:
    """(answer, why there is none, reachable, next try in s) of one call to a host."""
    try:
        return call(), None, True, None
    except HostUnreachable as e:
        return None, e.reason, False, e.retry_in_s
    except DaemonNotRunning:
        return None, NO_DAEMON, True, None
    except DaemonError as e:
        return None, str(e), True, None
    except Exception as e:  # a timeout, a garbled answer: said as it is, the host polled again
        return None, f"{type(e).__name__}: {e}", True, None


def _in_parallel(calls: dict[str, Callable[[], Any]], timeout_s: float) -> dict[str, Future[Any]]:
    """Start each call in a thread of its own (a daemon thread: one stuck on a host that never
    answers must not keep the console's process alive at exit) and wait for all of them at most
    `timeout_s`; what is not done by then is the caller's to name."""
    futures: dict[str, Future[Any]] = {}
    for name, call in calls.items():
        future: Future[Any] = Future()

        def run(call: Callable[[], Any] = call, future: Future[Any] = future) -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(call())
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(e)

        threading.Thread(target=run, daemon=True, name=f"host-{name}").start()
        futures[name] = future
    wait(list(futures.values()), timeout=timeout_s)
    return futures


def _no_answer(timeout_s: float) -> str:
    return f"no answer within {timeout_s:.0f} s"


class HostsSource:
    """A StateSource over `hosts`; engines are ENGINE@HOST (tui/sources/merge.py)."""

    NO_DAEMON_S = 5.0  # a host that runs no daemon is asked again after this long (each ask is an ssh login)
    POLL_TIMEOUT_S = 15.0  # a host's first request includes ssh's own connection and login
    WAIT_S = 0.8  # how long a poll waits for the hosts before showing what it has
    FIRST_WAIT_S = 5.0  # the first poll: long enough that the first screen is not empty
    STOP_ALL_S = 240.0  # a stop of everything: each host's engines drain (the daemon's own bound) in parallel
    CLOSE_S = 5.0  # quitting: each host's session is ended in parallel, the slow ones left behind

    def __init__(
        self,
        hosts: list[Host],
        *,
        dial: Callable[..., DaemonClient] = client_for,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not hosts:
            raise ValueError("a console over several hosts needs at least one")
        self.hosts = list(hosts)
        self.clock = clock
        self.links = {h.name: _Link(h, self.POLL_TIMEOUT_S, dial) for h in hosts}
        self.states = {h.name: HostState(h.name, h.label, h.is_local) for h in hosts}
        self._pending: dict[str, Future[tuple[Any, ...]]] = {}
        self._quiet_until: dict[str, float] = {}  # hosts with no daemon, asked again from then
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(hosts)), thread_name_prefix="host-poll")
        self._polls = 0

    # --- reading ---------------------------------------------------------------------------

    def poll(self) -> dict[str, Any]:
        asked = []
        for name, link in self.links.items():
            if name not in self._pending and self._quiet_until.get(name, 0.0) <= self.clock():
                self.states[name].asked_at = self.clock()
                self._pending[name] = self._pool.submit(_outcome, link.status)
                asked.append(self._pending[name])
        # Only this poll's questions are waited for: a host still on an older one is slow, and
        # its answer is taken whenever it comes.
        wait(asked, timeout=self.FIRST_WAIT_S if not self._polls else self.WAIT_S)
        self._polls += 1
        for name, future in list(self._pending.items()):
            if future.done():
                del self._pending[name]
                status, error, reachable, retry = future.result()
                state = self.states[name]
                if status is not None:
                    state.answered(status, self.clock())
                else:
                    state.failed(error or "no answer", reachable=reachable, retry_in_s=retry)
                    if reachable and status is None and error == NO_DAEMON:
                        self._quiet_until[name] = self.clock() + self.NO_DAEMON_S
        return fleet_status(list(self.states.values()), self.clock())

    def _reader(self, key: str) -> tuple[str, DaemonClient]:
        """The engine's own name and its host's polling client; a host that does not answer now
        is not asked (a read must not hold up the poll that follows it)."""
        name, host = split_key(key)
        state = self.states.get(host)
        if state is None:
            raise KeyError(f"no host {host!r} in this console")
        if host in self._pending or not state.reachable:
            raise HostUnreachable(host, state.error or "its poll is not answered yet")
        return name, self.links[host].poller()

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 4096) -> dict[str, Any]:
        engine, client = self._reader(name)
        return client.logs(engine, offset=offset, max_bytes=max_bytes)

    def history(self, name: str) -> dict[str, Any]:
        engine, client = self._reader(name)
        return dict(client.history(engine), engine=name)

    def samples(self, name: str, since_s: float = 900.0, points: int = 600) -> dict[str, Any]:
        engine, client = self._reader(name)
        return client.samples(engine, since_s=since_s, points=points)

    def alerts(self) -> dict[str, Any]:
        """Every host's alerts, asked in parallel and waited for at most a poll's timeout; a host
        that does not answer (or was not asked: its poll is out) is a note."""
        names = [n for n, s in self.states.items() if s.reachable and n not in self._pending]
        futures = _in_parallel(
            {n: functools.partial(_outcome, self.links[n].alerts) for n in names}, self.POLL_TIMEOUT_S + 1.0
        )
        answers: dict[str, dict[str, Any] | str] = {}
        for name, state in self.states.items():
            future = futures.get(name)
            if future is None:
                answers[name] = f"{state.error or 'not answering'} (not asked)"
            elif not future.done():
                answers[name] = _no_answer(self.POLL_TIMEOUT_S)
            else:
                answer, error, _, _ = future.result()
                answers[name] = answer if answer is not None else (error or "no answer")
        return fleet_alerts(answers)

    def dialer(self, key: str) -> tuple[str, Dial]:
        """The engine's own name, and new clients of its host's daemon (a sweep or tune screen's)."""
        name, host = split_key(key)
        link = self.links[host]
        return name, lambda timeout_s: link.dial(link.host, timeout_s=timeout_s)

    # --- commands ----------------------------------------------------------------------------

    def send(self, command: Command) -> dict[str, Any]:
        if command.verb == "stop_all":
            return self._stop_all()
        if command.verb == "undo":
            host = str((command.spec or {}).get("host"))
            name = None
        else:
            name, host = split_key(command.target)
        link = self.links.get(host)
        if link is None:
            raise KeyError(f"no host {host!r} in this console")
        bare = dataclasses.replace(command, engine=name)
        self._quiet_until.pop(host, None)  # what the command did shows at the next poll
        with link.lock:
            try:
                return carry_out(link.commander(), bare)
            except HostUnreachable:
                raise
            except DaemonNotRunning:
                if command.verb != "start":
                    raise
            link.start_daemon()  # no daemon there yet: an engine start starts one
            return carry_out(link.commander(), bare)

    def _stop_all(self) -> dict[str, Any]:
        """Every host's serving engines, all hosts at once; a host that cannot be reached, or
        does not answer, is said (its engines are left as they are)."""
        stopped: dict[str, list[str]] = {name: [] for name in self.links}
        missed: list[str] = []

        def stop_host(name: str, link: _Link) -> None:
            serving = [e.name for e in link.engines() if e.state in STOPPABLE]
            with link.lock:
                c = link.commander()
                for engine in serving:
                    c.stop_engine(engine)
                    stopped[name].append(engine_key(engine, name))

        calls: dict[str, Callable[[], Any]] = {}
        for name, link in self.links.items():
            if not self.states[name].reachable:
                missed.append(f"{name} ({self.states[name].error})")
            else:
                calls[name] = functools.partial(stop_host, name, link)
        futures = _in_parallel(calls, self.STOP_ALL_S)
        for name, future in futures.items():
            if not future.done():
                missed.append(f"{name} ({_no_answer(self.STOP_ALL_S)})")
                continue
            error = future.exception()
            if isinstance(error, HostUnreachable):
                missed.append(f"{name} ({error.reason})")
            elif error is None or isinstance(error, DaemonNotRunning):
                continue  # done, or no daemon there (so no engine serves there)
            elif isinstance(error, httpx.TimeoutException):
                missed.append(f"{name} ({_no_answer(self.POLL_TIMEOUT_S)})")
            else:
                missed.append(f"{name} ({type(error).__name__}: {error})")
        return {"stopped": [key for name in self.links for key in stopped[name]], "missed": missed}

    def close(self) -> None:
        """Every host's clients closed at once (its operator session ended first); a host that
        does not answer within CLOSE_S is left to its own timeouts, in a daemon thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        _in_parallel({name: link.close for name, link in self.links.items()}, self.CLOSE_S)
