"""A client of the daemon's control API, and starting the daemon when none is running.

The client speaks to this host's daemon over its Unix socket, or to another host's over SSH
(console/ssh.py supplies the transport; console/hosts.py says which host): every call is the
same HTTP either way."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpcore
import httpx

from llmconsole.engine.startup_log import read_tail
from llmconsole.engine.tune.ranges import EngineFacts
from llmconsole.paths import Paths, check_control_peer, check_control_socket
from llmconsole.wire import UNVERSIONED, WIRE_HEADER
from llmconsole.wire.history import ExportAnswer, ExportRequest, HistoryAnswer, HistoryQuery
from llmconsole.wire.status import DaemonInfo, EngineInfo, StatusAnswer


class DaemonNotRunning(RuntimeError):
    pass


class HostUnreachable(DaemonNotRunning):
    """ssh could not reach a host (or run llmconsole there); `reason` is ssh's own words.

    `retry_in_s` is set when the call was not even tried: the host failed a moment ago and the
    client waits out its backoff before the next attempt."""

    def __init__(self, host: str, reason: str, retry_in_s: float | None = None):
        self.host = host
        self.reason = reason.strip() or "ssh failed and said nothing"
        self.retry_in_s = retry_in_s
        retry = f" (next try in {retry_in_s:.0f} s)" if retry_in_s is not None else ""
        super().__init__(f"host {host} is unreachable: {self.reason}{retry}")


class DaemonError(RuntimeError):
    """The daemon refused a request; `details` says what to fix."""

    def __init__(self, status: int, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.status = status
        self.details = details or []

    def __str__(self) -> str:
        lines = [self.args[0]] + [f"  {d}" for d in self.details]
        return "\n".join(lines)


def _as_httpx(e: Exception) -> httpx.TransportError:
    """httpcore's exception as httpx's of the same name (httpx has one for each)."""
    cls = getattr(httpx, type(e).__name__, None)
    if isinstance(cls, type) and issubclass(cls, httpx.TransportError):
        return cls(str(e))
    return httpx.TransportError(str(e))


def send_through(pool: httpcore.ConnectionPool, request: httpx.Request) -> httpx.Response:
    """One httpx request through an httpcore pool, read whole; httpcore's errors as httpx's.
    Anything else a connection raises (a host that cannot be reached, a socket that is not
    ours) goes to the caller as it is."""
    assert isinstance(request.stream, httpx.SyncByteStream)
    req = httpcore.Request(
        method=request.method,
        url=httpcore.URL(
            scheme=request.url.raw_scheme,
            host=request.url.raw_host,
            port=request.url.port,
            target=request.url.raw_path,
        ),
        headers=request.headers.raw,
        content=request.stream,
        extensions=request.extensions,
    )
    try:
        resp = pool.handle_request(req)
        try:
            content = resp.read()
        finally:
            resp.close()
    except (
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        httpcore.UnsupportedProtocol,
    ) as e:
        raise _as_httpx(e) from None
    return httpx.Response(
        status_code=resp.status, headers=resp.headers, stream=httpx.ByteStream(content), extensions=resp.extensions
    )


class _CheckedUnixBackend(httpcore.SyncBackend):
    """Unix-socket connections that are used only once the socket file and the process
    listening on it are known to be this user's (paths.py): a request can carry an API key."""

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        check_control_socket(Path(path))
        stream = super().connect_unix_socket(path, timeout=timeout, socket_options=socket_options)
        try:
            check_control_peer(stream.get_extra_info("socket"), Path(path))
        except BaseException:
            stream.close()
            raise
        return stream


class ControlTransport(httpx.BaseTransport):
    """HTTP over this host's control socket, every connection checked before its first byte."""

    def __init__(self, paths: Paths):
        paths.verify()  # the directories: before any connection is tried
        # httpx's own limits for a transport of its own (100 connections, 20 kept alive).
        self._pool = httpcore.ConnectionPool(
            uds=str(paths.socket),
            network_backend=_CheckedUnixBackend(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return send_through(self._pool, request)

    def close(self) -> None:
        self._pool.close()


class DaemonClient:
    """The control API of one daemon: this host's through `paths` (its Unix socket), or another
    host's through `transport` (console/hosts.py's Host.client builds one over SSH)."""

    def __init__(
        self,
        paths: Paths | None = None,
        timeout_s: float = 120.0,
        *,
        transport: httpx.BaseTransport | None = None,
        where: str | None = None,
    ):
        if transport is None:
            if paths is None:
                raise ValueError("a DaemonClient needs the local paths or a transport")
            # A socket in a directory someone else controls, or answered by someone else's
            # process, could be anyone's daemon: refuse it (UnsafeDirectory, UntrustedSocket)
            # before a request, which may carry an API key, is sent.
            transport = ControlTransport(paths)
        self.paths = paths
        self.where = where or (str(paths.socket) if paths is not None else "the daemon")
        self._http = httpx.Client(transport=transport, base_url="http://llmconsole", timeout=timeout_s)
        # The wire schema the daemon named in its newest answer (UNVERSIONED: it names none, an
        # llmconsole from before the typed wire); None until it answered once.
        self.wire_version: int | None = None

    def close(self) -> None:
        self._http.close()

    def set_session(self, session_id: int | None) -> None:
        """Tag every later request with an operator session, so its actions are attributed."""
        if session_id is None:
            self._http.headers.pop("X-Llmconsole-Session", None)
        else:
            self._http.headers["X-Llmconsole-Session"] = str(session_id)

    def begin_session(self, client: str) -> int:
        return int(self._call("POST", "/sessions", json={"client": client})["session_id"])

    def end_session(self, session_id: int) -> None:
        self._call("POST", f"/sessions/{session_id}/end")

    def history(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/engines/{name}/history")

    def rollback(self, name: str, to_config_id: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/engines/{name}/rollback", json={"to": to_config_id})

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """The daemon's answer: every route answers with a JSON object."""
        try:
            r = self._http.request(method, f"/v1{path}", **kw)
        except (
            httpx.ConnectError,
            httpx.RemoteProtocolError,
            httpx.ReadError,
            httpx.WriteError,
            FileNotFoundError,
        ) as e:
            raise DaemonNotRunning(f"no daemon answers on {self.where} ({e})") from None
        self.wire_version = _wire_version(r.headers.get(WIRE_HEADER))
        body: dict[str, Any]
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text}
        if r.status_code >= 400:
            raise DaemonError(r.status_code, body.get("error", r.text), body.get("details"))
        return body

    def ping(self) -> DaemonInfo | None:
        """The daemon's facts, or None when none runs. A host ssh cannot reach is not a daemon
        that is not running: HostUnreachable goes to the caller."""
        try:
            return self.daemon_info()
        except HostUnreachable:
            raise
        except DaemonNotRunning:
            return None

    def daemon_info(self) -> DaemonInfo:
        return DaemonInfo.model_validate(self._call("GET", "/daemon"))

    def stop_daemon(self, stop_engines: bool = False) -> dict[str, Any]:
        return self._call("POST", "/daemon/stop", json={"stop_engines": stop_engines})

    def status(self) -> dict[str, Any]:
        """GET /v1/status as it came: what the console records and replays (its frames, read
        through the wire's models where they are shown: tui/views/status.py)."""
        return self._call("GET", "/status")

    def status_answer(self) -> StatusAnswer:
        """GET /v1/status through the wire's models: whatever version the daemon speaks, what
        both know is there (`wire_version` says which it spoke)."""
        return StatusAnswer.model_validate(self.status())

    def engine(self, name: str) -> dict[str, Any] | None:
        """One engine's status as it came (see `engine_info` for it read through the models)."""
        return next((e for e in self.status()["engines"] if e.get("name") == name), None)

    def engine_info(self, name: str) -> EngineInfo | None:
        return self.status_answer().engine(name)

    def start_engine(
        self,
        name: str,
        spec: dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None,
        api_key: str | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": spec, "overrides": overrides or {}}
        if force:
            body["force"] = True
        if api_key is not None:
            body["api_key"] = api_key
        return self._call("POST", f"/engines/{name}/start", json=body)

    def restart_engine(
        self, name: str, overrides: dict[str, Any] | None = None, force: bool = False, api_key: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"overrides": overrides or {}}
        if force:
            body["force"] = True
        if api_key is not None:
            body["api_key"] = api_key
        return self._call("POST", f"/engines/{name}/restart", json=body)

    def stop_engine(self, name: str, drain_timeout_s: float | None = None) -> dict[str, Any]:
        return self._call("POST", f"/engines/{name}/stop", json={"drain_timeout_s": drain_timeout_s})

    def remove_engine(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/engines/{name}")

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 64 * 1024) -> dict[str, Any]:
        params: dict[str, Any] = {"max_bytes": max_bytes}
        if offset is not None:
            params["offset"] = offset
        return self._call("GET", f"/engines/{name}/logs", params=params)

    def samples(self, name: str, since_s: float = 900.0, points: int = 600) -> dict[str, Any]:
        """The engine's stored 1 s samples and its group's window trace, as columns (charts)."""
        return self._call("GET", f"/engines/{name}/samples", params={"since_s": since_s, "points": points})

    def window(self, name: str, trace_points: int = 600) -> dict[str, Any]:
        return self._call("GET", f"/engines/{name}/window", params={"trace_points": trace_points})

    def mode(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/engines/{name}/mode")

    def alerts(self) -> dict[str, Any]:
        return self._call("GET", "/alerts")

    def exporter(self) -> dict[str, Any]:
        """Where the daemon's Prometheus endpoint listens: {"url", "port"}."""
        return self._call("GET", "/exporter")

    def undo_response(self, action_id: int) -> dict[str, Any]:
        """Undo an automated response; a rollback it implies restarts an engine (minutes on CPU)."""
        return self._call("POST", f"/responses/{action_id}/undo", timeout=1800.0)

    def response_config(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        if settings is None:
            return self._call("GET", "/responses/config")
        return self._call("POST", "/responses/config", json=settings)

    def set_mode(
        self, name: str, mode: str, force: bool = False, budget_bytes: int | None = None, timeout_s: float = 1800.0
    ) -> dict[str, Any]:
        """A guarded switch: returns once the engine serves on the new mode (or is back on the old)."""
        body: dict[str, Any] = {"mode": mode, "force": force}
        if budget_bytes is not None:
            body["budget_bytes"] = budget_bytes
        return self._call("POST", f"/engines/{name}/mode", json=body, timeout=timeout_s)

    def change_window(self, name: str, **changes: Any) -> dict[str, Any]:
        """Window settings, "freeze" or "set" (see daemon/api/window.py); nothing changes on a 400."""
        return self._call("POST", f"/engines/{name}/window", json=changes)

    def autopilot(self, name: str | None = None) -> dict[str, Any]:
        """Every group the autopilot drives (or the one `name` is in): its controls and timeline."""
        return self._call("GET", "/autopilot" + (f"/{name}" if name else ""))

    def autopilot_on(self, name: str, plan: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", f"/autopilot/{name}", json=plan)

    def autopilot_off(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/autopilot/{name}")

    def groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self._call("GET", "/groups")["groups"]
        return groups

    def set_group(
        self, name: str, engines: list[str], remote: dict[str, dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """`remote`: ENGINE@HOST -> {"url", "api_key", "models"} for the members of other hosts."""
        body: dict[str, Any] = {"engines": engines}
        if remote:
            body["remote"] = remote
        return self._call("PUT", f"/groups/{name}", json=body)

    def member(self, name: str) -> dict[str, Any]:
        """Where an engine listens, its model names and its API key: what a gateway group of
        another host needs to route to it."""
        return self._call("GET", f"/engines/{name}/member")

    def remove_group(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/groups/{name}")

    # --- sweeps and tunes run in the daemon (daemon/api/runs.py) ---------------------------

    def start_run(self, kind: str, request: dict[str, Any]) -> dict[str, Any]:
        """Start a sweep or tune in the daemon; it runs on whatever happens to this client."""
        return self._call("POST", "/runs", json={"kind": kind, "request": request})

    def run(self, run_id: int, since: int = 0) -> dict[str, Any]:
        """The run, its progress events from the `since`-th on, and its outcome once it ended."""
        return self._call("GET", f"/runs/{run_id}", params={"since": since})

    def runs(self, engine: str | None = None) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self._call("GET", "/runs", params={"engine": engine} if engine else None)["runs"]
        return runs

    def cancel_run(self, run_id: int) -> dict[str, Any]:
        return self._call("POST", f"/runs/{run_id}/cancel")

    def apply_tuned(
        self, name: str, overrides: dict[str, Any], slo: dict[str, Any], study: str | None = None
    ) -> dict[str, Any]:
        """A tuned config through the daemon's guarded apply, which then watches the SLO and rolls
        back on its own if production degrades."""
        return self._call(
            "POST",
            f"/engines/{name}/tune/apply",
            timeout=900.0,
            json={"overrides": overrides, "slo": slo, "study": study},
        )

    # --- the store's history and exports, read by the daemon that owns it (daemon/api/history.py)

    def history_listing(self, query: HistoryQuery) -> HistoryAnswer:
        """Config versions (and with `query.actions` the action log) of one engine or of all."""
        return HistoryAnswer.model_validate(self._call("GET", "/history", params=query.params()))

    def export_bundle(self, request: ExportRequest, timeout_s: float = 1800.0) -> ExportAnswer:
        """The daemon writes the bundle into `request.out_dir`; returns once it is written (a long
        span's logs and samples take a while, hence the long wait)."""
        answer = self._call("POST", "/export", json=request.model_dump(mode="json"), timeout=timeout_s)
        return ExportAnswer.model_validate(answer)


def engine_facts(client: DaemonClient, name: str, *, with_window: bool) -> EngineFacts:
    """What a tune's ranges come from, as the daemon reports the engine: its model, device and
    spec, and the gateway's window bounds when a knob moves them. DaemonError when the engine is
    unknown or not ready (a tune restarts it: it must be serving first)."""
    e = client.engine_info(name)
    if e is None:
        raise DaemonError(404, f"no engine named {name!r}")
    if e.state != "ready" or not e.url:
        raise DaemonError(409, f"engine {name} is {e.state}, not ready; nothing was sent")
    window = None
    if with_window:
        try:
            w = client.window(name, trace_points=0)
        except DaemonError as err:
            raise DaemonError(err.status, f"the gateway's window cannot be tuned: {err}") from None
        window = {"min_window": int(w["min_window"]), "max_window": int(w["max_window"])}
    return EngineFacts(
        model=str(e.model),
        device=e.device or "cpu",
        spec=dict(e.spec),
        window=window,
        custom_kernel_refusal=e.custom_kernel_refusal,
    )


def _wire_version(header: str | None) -> int:
    """The version a daemon's header names; an answer without one is the untyped wire's."""
    try:
        return int(header) if header else UNVERSIONED
    except ValueError:
        return UNVERSIONED


def spawn_daemon(paths: Paths, daemon_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    paths.ensure()
    fd = os.open(paths.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        # A new session: the daemon must not die with the terminal or SSH login that started it.
        return subprocess.Popen(
            [sys.executable, "-m", "llmconsole.daemon.main", *daemon_args],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    finally:
        os.close(fd)


def ensure_daemon(paths: Paths, timeout_s: float = 30.0, daemon_args: Sequence[str] = ()) -> tuple[DaemonClient, bool]:
    """A client of the running daemon, starting one if needed. Returns (client, started)."""
    client = DaemonClient(paths)
    if client.ping() is not None:
        return client, False
    proc = spawn_daemon(paths, daemon_args)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.ping() is not None:
            return client, True
        code = proc.poll()
        if code is not None:
            if client.ping() is not None:  # lost a race with another starter: theirs serves
                return client, False
            tail = read_tail(paths.daemon_log, 4000).strip().splitlines()[-15:]
            raise DaemonNotRunning(
                f"the daemon exited with code {code} while starting; {paths.daemon_log} ends with:\n" + "\n".join(tail)
            )
        time.sleep(0.1)
    raise DaemonNotRunning(f"the daemon did not answer within {timeout_s:.0f} s; see {paths.daemon_log}")
