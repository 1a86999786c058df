"""The `llmconsole` command line. Users and scripts rely on it: keep it stable.

Exit codes: 0 done; 1 the operation failed (an engine did not start, ...); 2 bad input (nothing
was changed); 3 no daemon is running (for commands that do not start one); 4 a host could not be
reached over SSH.

Every command acts on this host unless `--host DEST` (before the command) or ENGINE@HOST names
another; see console/hosts.py for hosts and the hosts file. `llmconsole` alone at a terminal is
the console: this host's, or, with `--host` naming another host, one console over the hosts
named (`local` among them only when named); without a terminal it prints their status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import httpx
from pydantic import ValidationError

from llmconsole import __version__
from llmconsole.console.cli_common import (  # noqa: F401  (re-exported for scripts)
    EXIT_FAILED,
    EXIT_NO_DAEMON,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    confirm,
    current_host,
    daemon_client,
    na,
    started_daemon_client,
    use_host,
)
from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning, HostUnreachable
from llmconsole.console.host_status import HOST_TIMEOUT_S, HostReport
from llmconsole.console.hosts import LOCAL_HOST, Host, HostCatalog, HostsError, client_for, split_engine
from llmconsole.console.spec_flags import add_spec_flags, read_api_key, spec_overrides
from llmconsole.engine.spec import EngineSpec, KernelUnavailable, validation_messages
from llmconsole.engine.spec_checks import SpecUnrunnable, check_name, enforce_kernel, enforce_runnable
from llmconsole.paths import UnsafeDirectory, resolve
from llmconsole.settings import SettingsError
from llmconsole.settings.flags import add_set_flag
from llmconsole.wire import version_note
from llmconsole.wire.status import DaemonInfo, EngineInfo, RankMetrics, StatusAnswer

# --- status ---------------------------------------------------------------------------------

_COLUMNS: list[tuple[str, Callable[[EngineInfo], str]]] = [
    ("NAME", lambda e: e.name),
    ("STATE", lambda e: e.state + (" (crash loop)" if e.crash_looping else "")),
    ("PID", lambda e: na(e.pid)),
    ("PORT", lambda e: na(e.port)),
    ("CONFIG", lambda e: na(e.config_id)),
    ("RESTARTS", lambda e: na(e.restarts)),
    ("KV", lambda e: _kv_text(e.kv_cache_usage)),
    ("RUN", lambda e: na(e.num_requests_running, "{:.0f}")),
    ("WAIT", lambda e: na(e.num_requests_waiting, "{:.0f}")),
    ("GEN TOK/S", lambda e: na(e.generation_tok_s, "{:.1f}")),
    # The bucket the p99 falls in where the daemon says (a figure inside it would be invented).
    ("P99 TTFT", lambda e: e.p99_ttft_text or na(None if e.p99_ttft_s is None else 1000 * e.p99_ttft_s, "{:.0f} ms")),
]


def _kv_text(fraction: float | None) -> str:
    return na(None if fraction is None else 100 * fraction, "{:.0f}%")


# A data-parallel engine's ranks: rows under the engine's, in the columns they have figures for.
_RANK_COLUMNS: dict[str, Callable[[RankMetrics], str]] = {
    "NAME": lambda r: f"  rank {r.rank}",
    "STATE": lambda r: "lagging" if r.lagging else "",
    "KV": lambda r: _kv_text(r.kv_cache_usage),
    "RUN": lambda r: na(r.running, "{:.0f}"),
    "WAIT": lambda r: na(r.waiting, "{:.0f}"),
}


def _ranks(e: EngineInfo) -> list[RankMetrics]:
    return e.metrics.ranks if e.metrics is not None and len(e.metrics.ranks) > 1 else []


def parallel_text(e: EngineInfo) -> str:
    """How many nodes an engine spans when it says so, else its spec's tensor x pipeline size
    (vLLM places the tp x pp workers, on one node or, with Ray, across several), and the
    data-parallel ranks its /metrics shows (the engine's word, not the spec's)."""
    if e.nodes:
        return f"{e.nodes} nodes"
    spec = e.spec
    tp, pp = int(spec.get("tensor_parallel_size") or 1), int(spec.get("pipeline_parallel_size") or 1)
    dp = f"dp{len(_ranks(e))}" if _ranks(e) else ""
    if tp * pp == 1:
        return dp or "1"
    backend = spec.get("distributed_executor_backend")
    return " ".join(filter(None, [f"tp{tp}xpp{pp}", backend, dp]))


def _positive_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def format_status(status: StatusAnswer, host: str = "the daemon") -> str:
    engines = status.engines
    warnings = [f"warning: {w}" for w in status.daemon.warnings]
    note = version_note(host, status.wire_version, status.daemon.version)
    if note is not None:  # another llmconsole's daemon: its answer shown as far as both know
        warnings.append(f"note: {note}")
    if not engines:
        return "\n".join(["no engines (start one with `llmconsole engine start NAME --model DIR`)", *warnings])
    columns = list(_COLUMNS)
    if any(parallel_text(e) != "1" for e in engines):  # only where some engine spans workers
        columns.insert(3, ("PARALLEL", parallel_text))
    rows = [[h for h, _ in columns]]
    for e in engines:
        rows.append([f(e) for _, f in columns])
        for r in _ranks(e):  # the merged figures above, each rank's below them
            rows.append([_RANK_COLUMNS[h](r) if h in _RANK_COLUMNS else "" for h, _ in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for e in engines:
        for r in _ranks(e):
            if r.lagging:
                lines.append(f"{e.name}: rank {r.rank} lags its peers: {r.note or 'far from their mean'}")
        if e.last_error and (e.state in ("failed", "crashed", "unhealthy", "invalid") or e.spec_error):
            lines.append(f"{e.name}: {e.last_error}")
        if e.port_note:
            lines.append(f"{e.name}: {e.port_note}")
        if e.state == "crashed" and e.next_restart_in_s is not None:
            lines.append(
                f"{e.name}: {e.consecutive_failures} failed run(s) in a row; restarting after a "
                f"{e.backoff_s or 0:.0f} s backoff, in {e.next_restart_in_s:.0f} s"
            )
    record_error = next((e.record_error for e in engines if e.record_error), None)
    if record_error:
        lines.append(f"warning: {record_error}")
    for e in engines:
        if e.kernel_note and e.kernel:  # the engine runs another kernel than asked
            lines.append(f"{e.name}: kernel {e.kernel} ({e.kernel_note})")
    return "\n".join(lines + warnings)


def format_hosts_status(reports: list[HostReport]) -> str:
    """Each host's section: its engines, or why there are none to show."""
    out = []
    for r in reports:
        head = r.host.label
        if r.status is not None:
            body = format_status(r.status, r.host.name)
        elif r.slow:
            body = f"slow: {r.error}"
        elif not r.reachable:
            body = f"unreachable: {r.error}"
        else:
            body = r.error or "no answer"
        out.append(head + "\n" + "\n".join("  " + line for line in body.splitlines()))
    return "\n\n".join(out)


def _status_across(ns: argparse.Namespace, hosts: list[Host]) -> int:
    from llmconsole.console.host_status import gather

    # Long-lived clients: with --watch an unreachable host is retried with backoff, not per round.
    timeout_s = ns.host_timeout
    clients = {h.name: client_for(h, timeout_s=timeout_s) for h in hosts}
    try:
        while True:
            reports = _only_engine_across(gather(hosts, timeout_s, clients=clients), getattr(ns, "engine", None))
            if ns.json:
                print(json.dumps({"hosts": [r.to_json() for r in reports]}, indent=2))
            else:
                print(format_hosts_status(reports))
            if not ns.watch:
                return 0 if all(r.answered for r in reports) else EXIT_UNREACHABLE
            time.sleep(ns.watch)
            print()
    finally:
        for c in clients.values():
            c.close()


def _only_engine(status: StatusAnswer, name: str | None) -> StatusAnswer:
    """The status narrowed to one engine (`status NAME`); an unknown name is refused."""
    if name is None:
        return status
    engines = [e for e in status.engines if e.name == name]
    if not engines:
        known = ", ".join(e.name for e in status.engines) or "none"
        raise CliError(f"no engine named {name!r} (engines: {known})", EXIT_USAGE)
    return status.model_copy(update={"engines": engines})


def _only_engine_across(reports: list[HostReport], name: str | None) -> list[HostReport]:
    """Each host's status narrowed to `name` (a host without it shows none; not an error there,
    as the engine may live on any of them)."""
    if name is None:
        return reports
    return [
        dataclasses.replace(
            r, status=r.status.model_copy(update={"engines": [e for e in r.status.engines if e.name == name]})
        )
        if r.status is not None
        else r
        for r in reports
    ]


def cmd_status(ns: argparse.Namespace) -> int:
    targets: list[Host] = ns.targets
    if ns.all_hosts or len(targets) > 1:
        hosts = ns.catalog.all_hosts() if ns.all_hosts else targets
        return _status_across(ns, hosts)
    with daemon_client() as c:
        while True:
            st = _only_engine(c.status_answer(), getattr(ns, "engine", None))
            if ns.json:  # what this client read of the answer: a newer daemon's extra fields are not in it
                print(json.dumps(st.to_wire(), indent=2))
            else:
                print(format_status(st))
            if not ns.watch:
                return 0
            time.sleep(ns.watch)
            print()


# --- daemon ---------------------------------------------------------------------------------


def _daemon_service(ns: argparse.Namespace) -> int:
    from llmconsole.console import service_unit

    if ns.daemon_cmd == "install":
        if not ns.user:
            raise CliError("only a user service is supported: `llmconsole daemon install --user`", EXIT_USAGE)
        try:
            path, replaced = service_unit.install(force=ns.force)
        except FileExistsError:
            raise CliError(f"{service_unit.unit_path()} exists and differs; --force replaces it", EXIT_USAGE) from None
        except ValueError as e:
            raise CliError(str(e), EXIT_USAGE) from None
        print(f"{'replaced' if replaced else 'wrote'} {path}")
        settings = ", ".join(service_unit.daemon_settings(os.environ)) or "none set in this shell"
        print(f"wrote {service_unit.env_file_path()} (0600): the daemon's settings ({settings})")
        print("then, to start it now and at every boot:")
        for line in service_unit.next_steps():
            print(f"  {line}")
        return 0
    removed = service_unit.uninstall()
    if removed is None:
        print(f"no unit at {service_unit.unit_path()}; nothing to remove")
        return 0
    print(f"removed {removed}")
    print(
        f"if it was enabled: systemctl --user disable --now {service_unit.UNIT_NAME} && "
        "systemctl --user daemon-reload (engines keep serving)"
    )
    return 0


def _daemon_remote(ns: argparse.Namespace, host: Host) -> int:
    """daemon start, status and stop of another host's daemon, through SSH."""
    if ns.daemon_cmd == "start":
        if ns.foreground:
            raise CliError("--foreground runs the daemon in this terminal; on another host run it there", EXIT_USAGE)
        client, _ = started_daemon_client()
        with client:
            running = client.daemon_info()
        print(f"daemon running on {host.name}: pid {running.pid}, socket {running.socket}")
        return 0
    with client_for(host) as client:
        info = client.ping()
        if ns.daemon_cmd == "status":
            if info is None:
                print(
                    json.dumps({"running": False, "host": host.name})
                    if ns.json
                    else f"no daemon running on {host.name}"
                )
                return EXIT_NO_DAEMON
            print(
                json.dumps({**info.to_wire(), "running": True, "host": host.name}, indent=2)
                if ns.json
                else _daemon_line(info, host.name)
            )
            return 0
        if info is None:
            print(f"no daemon running on {host.name}")
            return 0
        return _stop_daemon(ns, client, info, f"daemon on {host.name}", "; see its log there")


def cmd_daemon(ns: argparse.Namespace) -> int:
    paths = resolve()
    if ns.daemon_cmd in ("install", "uninstall"):
        return _daemon_service(ns)
    if ns.daemon_cmd == "dial-stdio":
        from llmconsole.console.dial_stdio import dial_stdio

        return dial_stdio(paths, start=not ns.no_start)
    host = current_host()
    flags = list(getattr(ns, "set", None) or [])
    if not host.is_local:
        if flags:
            raise CliError(
                f"--set acts on this host's daemon; on {host.name} use its config.toml or environment", EXIT_USAGE
            )
        return _daemon_remote(ns, host)
    if ns.daemon_cmd == "start":
        from llmconsole.settings import load

        try:  # a bad setting is refused here, with its source, before any daemon is started
            load(flags)
        except SettingsError as e:
            raise CliError(f"settings: {e}", EXIT_USAGE) from None
        daemon_args = [f"--set={f}" for f in flags]
        if ns.foreground:
            from llmconsole.daemon.main import main as daemon_main

            return daemon_main(daemon_args)
        client, started = started_daemon_client(daemon_args)
        running = client.daemon_info()
        print(f"daemon {'started' if started else 'already running'}: pid {running.pid}, socket {running.socket}")
        if flags and not started:
            print("the running daemon keeps the settings it started with; --set applies to one started now")
        return 0
    if ns.daemon_cmd == "status":
        client = DaemonClient(paths)
        info = client.ping()
        if info is None:
            if ns.json:
                print(json.dumps({"running": False}))
            else:
                print(f"no daemon running for {paths.data_dir}")
            return EXIT_NO_DAEMON
        if ns.json:
            print(json.dumps({**info.to_wire(), "running": True}, indent=2))
        else:
            print(_daemon_line(info, None))
        return 0
    # stop
    client = DaemonClient(paths)
    info = client.ping()
    if info is None:
        print(f"no daemon running for {paths.data_dir}")
        return 0
    return _stop_daemon(ns, client, info, "daemon", "; see its log")


def _daemon_line(info: DaemonInfo, host: str | None) -> str:
    """`daemon status` in words, and the wire it speaks where that is not this client's."""
    line = (
        f"{host + ': ' if host else ''}daemon pid {na(info.pid)} (v{na(info.version)}), up {info.uptime_s or 0:.0f} s, "
        f"{info.engines} engine(s), socket {na(info.socket)}"
    )
    note = version_note(host or "the daemon", info.wire_version, info.version)
    return line if note is None else f"{line}\nnote: {note}"


def _stop_daemon(ns: argparse.Namespace, client: DaemonClient, info: DaemonInfo, which: str, log_hint: str) -> int:
    """daemon stop, once a daemon answered: ask first when its engines go with it, then wait
    until it is gone."""
    if ns.stop_engines:
        confirm(f"Stop the {which} AND every engine it supervises ({info.engines})?", ns.yes)
    serving = _serving_names(client)
    client.stop_daemon(stop_engines=ns.stop_engines)
    deadline = time.monotonic() + (120 if ns.stop_engines else 30)
    while time.monotonic() < deadline and client.ping() is not None:
        time.sleep(0.2)
    if client.ping() is not None:
        raise CliError(f"the {which} did not stop in time{log_hint}")
    print(f"{which} stopped; {_engines_after_stop(serving, ns.stop_engines)}")
    return 0


_RUNNING = ("starting", "ready", "unhealthy", "stopping")  # states with a live engine process


def _serving_names(client: DaemonClient) -> list[str] | None:
    """The engines that run now (None if the daemon would not say): what a stop leaves serving."""
    try:
        return [e.name for e in client.status_answer().engines if e.state in _RUNNING]
    except (DaemonError, DaemonNotRunning):
        return None


def _engines_after_stop(serving: list[str] | None, stopped_them: bool) -> str:
    """What became of the engines, as it is: none ran, they were stopped, or they keep serving."""
    if serving is None:
        return "engines stopped" if stopped_them else "engines that were running keep serving"
    if not serving:
        return "no engine was running"
    names = ", ".join(serving)
    return f"engines stopped: {names}" if stopped_them else f"engines keep serving: {names}"


# --- engines --------------------------------------------------------------------------------


def _wait_ready(
    client: DaemonClient, name: str, timeout_s: float, quiet: bool, config_id: str | None = None
) -> EngineInfo:
    """Wait until `name` is ready on `config_id`. A config that fails may be rolled back by the
    daemon to the last known-good one: that is a failure of the config asked for, said as such."""
    began = time.monotonic()
    show = sys.stderr.isatty() and not quiet
    last_state = None
    while True:
        e = client.engine_info(name)
        if e is None:
            raise CliError(f"engine {name} disappeared while starting")
        state = e.state
        if config_id is not None and e.failed_config_id == config_id:
            # The same words whether the daemon's rollback has moved the engine yet or not.
            if show:
                sys.stderr.write("\r\033[K")
            raise CliError(
                f"engine {name} failed to start on config {config_id}: {e.failed_reason}\n"
                f"the daemon rolls it back to its last known-good config, where it has one "
                f"(`llmconsole history {name} --actions`)\nlog: {e.log_path}"
            )
        if config_id is not None and e.config_id != config_id:
            if show:
                sys.stderr.write("\r\033[K")
            raise CliError(
                f"engine {name} did not come up on config {config_id}; the daemon rolled it "
                f"back to {e.config_id} (`llmconsole history {name}` shows why)\n"
                f"log: {e.log_path}"
            )
        if state == "ready":
            if show:
                sys.stderr.write("\r\033[K")
            return e
        if state in ("failed", "stopped", "invalid"):
            if show:
                sys.stderr.write("\r\033[K")
            raise CliError(f"engine {name} failed to start: {e.last_error or state}\nlog: {e.log_path}")
        elapsed = time.monotonic() - began
        if elapsed > timeout_s:
            raise CliError(
                f"engine {name} is still {state} after {timeout_s:.0f} s "
                f"(it keeps starting; watch it with `llmconsole status`)"
            )
        if show:
            sys.stderr.write(f"\r{name}: {state} ... {elapsed:.0f} s")
            sys.stderr.flush()
        elif not quiet and state != last_state:
            print(f"{name}: {state}", file=sys.stderr)
        last_state = state
        time.sleep(0.5)


def _print_ready(e: EngineInfo) -> None:
    facts = ""
    if e.kv_cache_tokens is not None:
        facts = (
            f", KV cache {e.kv_cache_tokens:,} tokens, max concurrency "
            f"{e.max_concurrency or 0:.2f}x at {na(e.max_concurrency_len)} tokens"
        )
    kv_bytes = e.spec.get("kv_cache_memory_bytes")
    if e.mode and kv_bytes:  # a CPU engine's mode: its share of the budget, as an explicit size
        facts += f", memory mode {e.mode}: KV {kv_bytes:,} bytes"
    print(f"{e.name} ready at {e.url} (pid {na(e.pid)}, config {e.config_id}{facts})")


def cmd_engine(ns: argparse.Namespace) -> int:
    host = current_host()
    if ns.engine_cmd in ("start", "restart"):
        try:
            check_name(ns.name)
            overrides = spec_overrides(ns, local=host.is_local)
            api_key = read_api_key(ns)
        except (ValueError, RuntimeError) as e:
            raise CliError(str(e), EXIT_USAGE) from None
        full_spec = None
        if "model" in overrides:
            # Validate here first: a bad flag is refused in milliseconds, before any daemon work.
            # A model on another host is that host's to check (its daemon does, on start).
            checked = overrides if host.is_local else {**overrides, "model": "model-on-" + host.name}
            try:
                spec = EngineSpec(**checked, **({"api_key": api_key} if api_key else {}))
                if host.is_local:  # another host's runtime is its daemon's to judge
                    enforce_kernel(spec)
                    enforce_runnable(spec)
            except ValidationError as e:
                raise CliError("invalid engine spec:\n  " + "\n  ".join(validation_messages(e)), EXIT_USAGE) from None
            except (KernelUnavailable, SpecUnrunnable) as e:
                raise CliError(str(e), EXIT_USAGE) from None
            full_spec = overrides
        client, _ = started_daemon_client() if ns.engine_cmd == "start" else (daemon_client(), False)
        with client:
            try:
                existing = client.engine_info(ns.name)
                if ns.engine_cmd == "start":
                    if existing is None and full_spec is None:
                        raise CliError(f"engine {ns.name} is new: give it --model DIR", EXIT_USAGE)
                    if existing is None:
                        accepted = client.start_engine(ns.name, spec=full_spec, api_key=api_key, force=ns.force)
                    else:  # a known engine: the flags given change its last spec
                        accepted = client.start_engine(ns.name, overrides=overrides, api_key=api_key, force=ns.force)
                else:
                    accepted = client.restart_engine(ns.name, overrides=overrides, force=ns.force, api_key=api_key)
            except DaemonError as e:
                # 409: refused in the engine's state (another config asked of a running engine,
                # a stopping one): nothing was changed, and the message says what would do it.
                raise CliError(str(e), EXIT_USAGE if e.status in (400, 404, 409) else EXIT_FAILED) from None
            if ns.no_wait:
                launched = client.engine_info(ns.name)
                if launched is None:
                    raise CliError(f"engine {ns.name} disappeared while starting")
                print(
                    f"{ns.name}: {launched.state} (config {launched.config_id}, port {na(launched.port)}, "
                    f"log {launched.log_path})"
                )
                return 0
            _print_ready(_wait_ready(client, ns.name, ns.timeout, ns.quiet, accepted.get("config_id")))
            return 0
    with daemon_client() as client:
        try:
            if ns.engine_cmd == "stop":
                if client.engine_info(ns.name) is None:
                    raise CliError(f"no engine named {ns.name!r}", EXIT_USAGE)
                confirm(f"Stop engine {ns.name}? Requests in flight get {ns.drain_timeout} s to finish.", ns.yes)
                stopped = client.stop_engine(ns.name, ns.drain_timeout)
                print(f"{ns.name}: {stopped['state']}")
                return 0
            if ns.engine_cmd == "rm":
                confirm(f"Forget engine {ns.name} (its spec and log stay on disk)?", ns.yes)
                client.remove_engine(ns.name)
                print(f"{ns.name}: removed")
                return 0
            if ns.engine_cmd == "logs":
                return _follow_logs(client, ns)
        except DaemonError as e:
            raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else EXIT_FAILED) from None
    raise CliError(f"unknown engine command {ns.engine_cmd}", EXIT_USAGE)


def _follow_logs(client: DaemonClient, ns: argparse.Namespace) -> int:
    from llmconsole.console.logtext import from_line_start

    chunk = client.logs(ns.name, max_bytes=ns.bytes)
    sys.stdout.write(from_line_start(chunk["text"], cut=chunk["size"] > ns.bytes))
    sys.stdout.flush()
    offset = chunk["offset"]
    while ns.follow:
        time.sleep(0.5)
        chunk = client.logs(ns.name, offset=offset, max_bytes=1024 * 1024)
        if chunk["size"] < offset:  # the file was truncated or replaced
            offset = 0
            continue
        sys.stdout.write(chunk["text"])
        sys.stdout.flush()
        offset = chunk["offset"]
    return 0


# --- models ---------------------------------------------------------------------------------


def cmd_model(ns: argparse.Namespace) -> int:
    from llmconsole.random_model import build_model

    try:
        out = build_model(ns.size, Path(ns.out), seed=ns.seed)
    except ImportError as e:
        raise CliError(f"building a model needs transformers, tokenizers and torch ({e})") from None
    print(f"{ns.size} model at {out}")
    return 0


# --- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmconsole", description="Launch, supervise and tune local vLLM engines.")
    p.add_argument("--version", action="version", version=f"llmconsole {__version__}")
    hosts = p.add_argument_group("hosts (before the command: `llmconsole --host gpu1 status`)")
    hosts.add_argument(
        "--host",
        dest="hosts",
        action="append",
        default=[],
        metavar="DEST",
        help="act on this host: a hosts file name, `local`, or an ssh destination (gpu1, "
        "user@gpu1, ssh://user@gpu1:2222), reached with your own ssh; repeatable for "
        "status, export and the console (`llmconsole --host gpu1 --host gpu2` at a terminal)",
    )
    hosts.add_argument(
        "--hosts-file",
        metavar="PATH",
        default=None,
        help="the hosts file (default: hosts.toml in LLMCONSOLE_HOME, else ~/.config/llmconsole)",
    )
    hosts.add_argument(
        "--remote-command",
        metavar="CMD",
        default=None,
        help="how to run llmconsole on a --host DEST that is not in the hosts file (default: llmconsole)",
    )
    hosts.add_argument(
        "--remote-data-dir",
        metavar="DIR",
        default=None,
        help="LLMCONSOLE_HOME on a --host DEST that is not in the hosts file",
    )
    sub = p.add_subparsers(dest="cmd")

    st = sub.add_parser("status", help="engines and their live figures")
    st.add_argument("engine", nargs="?", metavar="NAME", help="only this engine")
    st.add_argument(
        "--all-hosts",
        action="store_true",
        help="every host of the hosts file and this one; unreachable and slow hosts say why",
    )
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--host-timeout",
        type=_positive_s,
        default=HOST_TIMEOUT_S,
        metavar="S",
        help=f"across hosts: how long one host may take to answer before it is reported slow "
        f"(default {HOST_TIMEOUT_S:.0f})",
    )
    st.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=1.0,
        default=None,
        metavar="S",
        help="repeat every S seconds (default 1)",
    )
    st.set_defaults(func=cmd_status)

    d = sub.add_parser("daemon", help="the per-host daemon that owns the engines")
    dsub = d.add_subparsers(dest="daemon_cmd", required=True)
    ds = dsub.add_parser("start", help="start the daemon (detached) if none is running")
    ds.add_argument("--foreground", action="store_true", help="run in this terminal (for service managers)")
    add_set_flag(ds)
    dt = dsub.add_parser("stop", help="stop the daemon; engines keep serving unless --stop-engines")
    dt.add_argument("--stop-engines", action="store_true")
    dt.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    dq = dsub.add_parser("status")
    dq.add_argument("--json", action="store_true")
    dd = dsub.add_parser(
        "dial-stdio",
        help="bridge stdin/stdout to the daemon's control socket (what a console on another host runs over ssh)",
    )
    dd.add_argument("--no-start", action="store_true", help="do not start a daemon if none runs (exit 3)")
    di = dsub.add_parser(
        "install", help="write a systemd user unit that runs the daemon (asks nothing, starts nothing)"
    )
    di.add_argument("--user", action="store_true", required=True, help="a user service (~/.config/systemd/user)")
    di.add_argument("--force", action="store_true", help="replace a unit that differs")
    dsub.add_parser("uninstall", help="remove the systemd user unit")
    d.set_defaults(func=cmd_daemon)

    e = sub.add_parser("engine", help="start, stop, restart engines; read their logs")
    esub = e.add_subparsers(dest="engine_cmd", required=True)
    for verb, help_text in (
        ("start", "start an engine and wait until it is ready"),
        ("restart", "restart an engine, optionally with changed flags"),
    ):
        es = esub.add_parser(verb, help=help_text)
        es.add_argument("name")
        add_spec_flags(es)
        es.add_argument("--no-wait", action="store_true", help="return once launched")
        es.add_argument("--timeout", type=float, default=900.0, metavar="S", help="how long to wait for ready")
        es.add_argument("--quiet", "-q", action="store_true")
        es.add_argument(
            "--force", action="store_true", help="start even if the planner says the config cannot fit (vLLM decides)"
        )
    ep = esub.add_parser("stop", help="stop an engine (asks first)")
    ep.add_argument("name")
    ep.add_argument("--drain-timeout", type=float, default=30.0, metavar="S")
    ep.add_argument("--yes", "-y", action="store_true")
    er = esub.add_parser("rm", help="forget a stopped engine")
    er.add_argument("name")
    er.add_argument("--yes", "-y", action="store_true")
    el = esub.add_parser("logs", help="print an engine's log")
    el.add_argument("name")
    el.add_argument("-f", "--follow", action="store_true")
    el.add_argument("-c", "--bytes", type=int, default=16 * 1024, help="how much of the end to show first")
    e.set_defaults(func=cmd_engine)

    m = sub.add_parser("model", help="local models")
    msub = m.add_subparsers(dest="model_cmd", required=True)
    mb = msub.add_parser("build", help="build a Llama-architecture model with random weights, offline")
    mb.add_argument("--size", choices=["tiny", "small"], required=True)
    mb.add_argument("--out", required=True, metavar="DIR")
    mb.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=cmd_model)

    # Each module of llmconsole.console.commands adds its own subcommands (sweep, plan, ...), so
    # a new command is a new file rather than another edit of this one.
    for mod in _command_modules():
        mod.register(sub)
    return p


def _command_modules() -> list[ModuleType]:
    import importlib
    import pkgutil

    from llmconsole.console import commands

    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    return [importlib.import_module(f"llmconsole.console.commands.{n}") for n in names]


def _join_extra_args(argv: list[str]) -> list[str]:
    """`--extra-arg --tokenizer-mode=auto` as `--extra-arg=--tokenizer-mode=auto`: argparse
    would take a value that starts with `-` for an option of its own and refuse it."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--":
            out += [arg, *it]
            break
        if arg == "--extra-arg":
            value = next(it, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


# Commands that act on several hosts at once; every other command acts on one.
_MULTI_HOST = {"status", "export", "console"}
# Commands that run where the host's files, devices and engines' ports are: on another host they
# run there, through ssh, with this terminal (the control API does not carry what they need).
_RUN_ON_HOST = {"load", "sweep", "tune", "plan", "kernels", "model", "history", "config"}
# Where an engine is named, and so may be named ENGINE@HOST.
_ENGINE_ARG = {
    "engine": "name",
    "rollback": "name",
    "mode": "engine",
    "window": "engine",
    "load": "engine",
    "history": "engine",
    "sweep": "engine",
    "tune": "engine",
    "runs": "engine",
}
_GLOBAL_WITH_VALUE = ("--host", "--hosts-file", "--remote-command", "--remote-data-dir")


def _command_tokens(argv: list[str]) -> list[str]:
    """The command line from the command on: what runs on the other host."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _GLOBAL_WITH_VALUE:
            i += 2
        elif tok.startswith("-"):
            i += 1
        else:
            return argv[i:]
    return []


def _select_hosts(ns: argparse.Namespace) -> tuple[list[Host], dict[str, str]]:
    """The hosts given (--host), with ENGINE@HOST folded in: (hosts, {ENGINE@HOST: ENGINE})."""
    catalog = HostCatalog(
        Path(ns.hosts_file).expanduser() if ns.hosts_file else None,
        command=ns.remote_command,
        data_dir=ns.remote_data_dir,
    )
    ns.catalog = catalog
    targets = [catalog.lookup(h) for h in ns.hosts]
    renamed: dict[str, str] = {}
    attr = _ENGINE_ARG.get(ns.cmd or "")
    value = getattr(ns, attr, None) if attr else None
    if attr and isinstance(value, str) and "@" in value:
        name, at_host = split_engine(value)
        host = catalog.lookup(at_host or "")
        if targets and [t.name for t in targets] != [host.name]:
            raise CliError(
                f"{value} names host {host.name}, but --host names {', '.join(t.name for t in targets)}; give one",
                EXIT_USAGE,
            )
        targets = [host]
        setattr(ns, attr, name)
        renamed[value] = name
    ns.targets = targets
    return targets, renamed


def _run_there(host: Host, argv: list[str], renamed: dict[str, str]) -> int:
    """Run this command line on `host`, through ssh, with this terminal."""
    from llmconsole.console.ssh import run_remote

    tokens = []
    for tok in _command_tokens(argv):
        for full, bare in renamed.items():
            if tok == full:
                tok = bare
            elif tok.endswith("=" + full):
                tok = tok[: -len(full)] + bare
        tokens.append(tok)
    assert host.destination is not None
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    code = run_remote(str(host.destination), host.remote_command(*tokens), host=host.name, tty=tty)
    if code == 255:
        raise CliError(f"host {host.name}: ssh failed (its reason is above)", EXIT_UNREACHABLE)
    return code


def _reader_went_away() -> int:
    """`status --json | head`: the reader took what it wanted and closed the pipe. Say nothing,
    and point stdout at /dev/null so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + 13  # as a process that SIGPIPE ended, which is what a shell expects of a pipe


def _dispatch(ns: argparse.Namespace, argv: list[str]) -> int:
    targets, renamed = _select_hosts(ns)
    if ns.cmd is None:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):  # a script or a pipe: the status, as before
            if len(targets) == 1:
                use_host(targets[0])
            return cmd_status(_status_ns(ns))
        from llmconsole.console.tui.run import run_console, run_fleet_console

        if any(not t.is_local for t in targets):  # a person at a terminal: one console over them all
            return run_fleet_console(targets)
        return run_console()
    if len(targets) > 1 and ns.cmd not in _MULTI_HOST:
        raise CliError(f"`{ns.cmd}` acts on one host; give one --host (status and export take several)", EXIT_USAGE)
    host = targets[0] if targets else LOCAL_HOST
    use_host(host)
    remote_only_here = ns.cmd == "daemon" and ns.daemon_cmd in ("install", "uninstall")
    if not host.is_local and (ns.cmd in _RUN_ON_HOST or remote_only_here):
        return _run_there(host, argv, renamed)
    if not host.is_local and ns.cmd == "daemon" and ns.daemon_cmd == "dial-stdio":
        raise CliError("dial-stdio bridges this host's daemon; it takes no --host", EXIT_USAGE)
    return int(ns.func(ns) or 0)


def _status_ns(ns: argparse.Namespace) -> argparse.Namespace:
    ns.cmd, ns.json, ns.watch, ns.all_hosts = "status", False, None, False
    ns.host_timeout = HOST_TIMEOUT_S
    return ns


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _join_extra_args(list(sys.argv[1:] if argv is None else argv))
    ns = parser.parse_args(args)
    try:
        code = _dispatch(ns, args)
        sys.stdout.flush()  # inside the try: a reader that went away is seen here, not at exit
        return code
    except BrokenPipeError:
        return _reader_went_away()
    except CliError as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return e.code
    except HostsError as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_USAGE
    except HostUnreachable as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except DaemonNotRunning as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_NO_DAEMON
    except httpx.TimeoutException as e:  # the host (or this daemon) took the connection, then said nothing
        print(f"llmconsole: no answer in time ({e}); whether it acted is not known: check its status", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UnsafeDirectory as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SettingsError as e:  # config.toml or an LLMCONSOLE_ variable, read where it is needed
        print(f"llmconsole: settings: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted; engines keep running", file=sys.stderr)
        return 130
    finally:
        use_host(LOCAL_HOST)


if __name__ == "__main__":
    sys.exit(main())
