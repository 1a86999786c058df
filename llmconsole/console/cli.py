"""The `llmconsole` command line. Users and scripts rely on it: keep it stable.

Exit codes: 0 done; 1 the operation failed (an engine did not start, ...); 2 bad input (nothing
was changed); 3 no daemon is running (for commands that do not start one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from llmconsole import __version__
from llmconsole.console.cli_common import (  # noqa: F401  (re-exported for scripts)
    EXIT_FAILED,
    EXIT_NO_DAEMON,
    EXIT_USAGE,
    CliError,
    confirm,
    daemon_client,
    na,
)
from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning, ensure_daemon
from llmconsole.console.spec_flags import add_spec_flags, read_api_key, spec_overrides
from llmconsole.engine.fleet import check_name
from llmconsole.engine.spec import EngineSpec, validation_messages
from llmconsole.paths import resolve

# --- status ---------------------------------------------------------------------------------

_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("NAME", lambda e: e["name"]),
    ("STATE", lambda e: e["state"] + (" (crash loop)" if e.get("crash_looping") else "")),
    ("PID", lambda e: na(e["pid"])),
    ("PORT", lambda e: na(e["port"])),
    ("CONFIG", lambda e: e["config_id"]),
    ("RESTARTS", lambda e: str(e["restarts"])),
    ("KV", lambda e: na(None if e["kv_cache_usage"] is None else 100 * e["kv_cache_usage"], "{:.0f}%")),
    ("RUN", lambda e: na(e["num_requests_running"], "{:.0f}")),
    ("WAIT", lambda e: na(e["num_requests_waiting"], "{:.0f}")),
    ("GEN TOK/S", lambda e: na(e["generation_tok_s"], "{:.1f}")),
    ("P99 TTFT", lambda e: na(None if e["p99_ttft_s"] is None else 1000 * e["p99_ttft_s"], "{:.0f} ms")),
]


def format_status(status: dict[str, Any]) -> str:
    engines = status["engines"]
    if not engines:
        return "no engines (start one with `llmconsole engine start NAME --model DIR`)"
    rows = [[h for h, _ in _COLUMNS]] + [[f(e) for _, f in _COLUMNS] for e in engines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for e in engines:
        if e.get("last_error") and e["state"] in ("failed", "crashed", "unhealthy"):
            lines.append(f"{e['name']}: {e['last_error']}")
    return "\n".join(lines)


def cmd_status(ns: argparse.Namespace) -> int:
    with daemon_client() as c:
        while True:
            st = c.status()
            if ns.json:
                print(json.dumps(st, indent=2))
            else:
                print(format_status(st))
            if not ns.watch:
                return 0
            time.sleep(ns.watch)
            print()


# --- daemon ---------------------------------------------------------------------------------

def cmd_daemon(ns: argparse.Namespace) -> int:
    paths = resolve()
    if ns.daemon_cmd == "start":
        if ns.foreground:
            from llmconsole.daemon.main import main as daemon_main
            return daemon_main()
        client, started = ensure_daemon(paths)
        running = client.daemon_info()
        print(f"daemon {'started' if started else 'already running'}: pid {running['pid']}, socket {running['socket']}")
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
        info["running"] = True
        if ns.json:
            print(json.dumps(info, indent=2))
        else:
            print(f"daemon pid {info['pid']} (v{info['version']}), up {info['uptime_s']:.0f} s, "
                  f"{info['engines']} engine(s), socket {info['socket']}")
        return 0
    # stop
    client = DaemonClient(paths)
    info = client.ping()
    if info is None:
        print(f"no daemon running for {paths.data_dir}")
        return 0
    if ns.stop_engines:
        confirm(f"Stop the daemon AND every engine it supervises ({info['engines']})?", ns.yes)
    client.stop_daemon(stop_engines=ns.stop_engines)
    deadline = time.monotonic() + (120 if ns.stop_engines else 30)
    while time.monotonic() < deadline and client.ping() is not None:
        time.sleep(0.2)
    if client.ping() is not None:
        raise CliError("the daemon did not stop in time; see its log")
    print("daemon stopped" + ("; engines stopped" if ns.stop_engines else "; engines keep serving"))
    return 0


# --- engines --------------------------------------------------------------------------------

def _wait_ready(client: DaemonClient, name: str, timeout_s: float, quiet: bool,
                config_id: str | None = None) -> dict[str, Any]:
    """Wait until `name` is ready on `config_id`. A config that fails may be rolled back by the
    daemon to the last known-good one: that is a failure of the config asked for, said as such."""
    began = time.monotonic()
    show = sys.stderr.isatty() and not quiet
    last_state = None
    while True:
        e = client.engine(name)
        if e is None:
            raise CliError(f"engine {name} disappeared while starting")
        state = e["state"]
        if config_id is not None and e["config_id"] != config_id:
            if show:
                sys.stderr.write("\r\033[K")
            raise CliError(f"engine {name} did not come up on config {config_id}; the daemon rolled it "
                           f"back to {e['config_id']} (`llmconsole history {name}` shows why)\n"
                           f"log: {e.get('log_path')}")
        if state == "ready":
            if show:
                sys.stderr.write("\r\033[K")
            return e
        if state in ("failed", "stopped"):
            if show:
                sys.stderr.write("\r\033[K")
            raise CliError(f"engine {name} failed to start: {e.get('last_error') or state}\n"
                           f"log: {e.get('log_path')}")
        elapsed = time.monotonic() - began
        if elapsed > timeout_s:
            raise CliError(f"engine {name} is still {state} after {timeout_s:.0f} s "
                           f"(it keeps starting; watch it with `llmconsole status`)")
        if show:
            sys.stderr.write(f"\r{name}: {state} ... {elapsed:.0f} s")
            sys.stderr.flush()
        elif not quiet and state != last_state:
            print(f"{name}: {state}", file=sys.stderr)
        last_state = state
        time.sleep(0.5)


def _print_ready(e: dict[str, Any]) -> None:
    facts = ""
    if e.get("kv_cache_tokens") is not None:
        facts = (f", KV cache {e['kv_cache_tokens']:,} tokens, max concurrency "
                 f"{e['max_concurrency']:.2f}x at {e['max_concurrency_len']} tokens")
    print(f"{e['name']} ready at {e['url']} (pid {e['pid']}, config {e['config_id']}{facts})")


def cmd_engine(ns: argparse.Namespace) -> int:
    paths = resolve()
    if ns.engine_cmd in ("start", "restart"):
        try:
            check_name(ns.name)
            overrides = spec_overrides(ns)
            api_key = read_api_key(ns)
        except (ValueError, RuntimeError) as e:
            raise CliError(str(e), EXIT_USAGE) from None
        full_spec = None
        if "model" in overrides:
            # Validate here first: a bad flag is refused in milliseconds, before any daemon work.
            try:
                EngineSpec(**overrides, **({"api_key": api_key} if api_key else {}))
            except ValidationError as e:
                raise CliError("invalid engine spec:\n  " + "\n  ".join(validation_messages(e)), EXIT_USAGE) from None
            full_spec = overrides
        client, _ = ensure_daemon(paths) if ns.engine_cmd == "start" else (daemon_client(), False)
        with client:
            try:
                existing = client.engine(ns.name)
                if ns.engine_cmd == "start":
                    if existing is None and full_spec is None:
                        raise CliError(f"engine {ns.name} is new: give it --model DIR", EXIT_USAGE)
                    if existing is None:
                        accepted = client.start_engine(ns.name, spec=full_spec, api_key=api_key, force=ns.force)
                    else:  # a known engine: the flags given change its last spec
                        accepted = client.start_engine(ns.name, overrides=overrides, api_key=api_key, force=ns.force)
                else:
                    accepted = client.restart_engine(ns.name, overrides=overrides, force=ns.force)
            except DaemonError as e:
                raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else EXIT_FAILED) from None
            if ns.no_wait:
                launched = client.engine(ns.name)
                if launched is None:
                    raise CliError(f"engine {ns.name} disappeared while starting")
                print(f"{ns.name}: {launched['state']} (config {launched['config_id']}, port {launched['port']}, "
                      f"log {launched['log_path']})")
                return 0
            _print_ready(_wait_ready(client, ns.name, ns.timeout, ns.quiet, accepted.get("config_id")))
            return 0
    with daemon_client() as client:
        try:
            if ns.engine_cmd == "stop":
                if client.engine(ns.name) is None:
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
    chunk = client.logs(ns.name, max_bytes=ns.bytes)
    sys.stdout.write(chunk["text"])
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
    sub = p.add_subparsers(dest="cmd")

    st = sub.add_parser("status", help="engines and their live figures")
    st.add_argument("--json", action="store_true")
    st.add_argument("--watch", type=float, nargs="?", const=1.0, default=None, metavar="S",
                    help="repeat every S seconds (default 1)")
    st.set_defaults(func=cmd_status)

    d = sub.add_parser("daemon", help="the per-host daemon that owns the engines")
    dsub = d.add_subparsers(dest="daemon_cmd", required=True)
    ds = dsub.add_parser("start", help="start the daemon (detached) if none is running")
    ds.add_argument("--foreground", action="store_true", help="run in this terminal (for service managers)")
    dt = dsub.add_parser("stop", help="stop the daemon; engines keep serving unless --stop-engines")
    dt.add_argument("--stop-engines", action="store_true")
    dt.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    dq = dsub.add_parser("status")
    dq.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_daemon)

    e = sub.add_parser("engine", help="start, stop, restart engines; read their logs")
    esub = e.add_subparsers(dest="engine_cmd", required=True)
    for verb, help_text in (("start", "start an engine and wait until it is ready"),
                            ("restart", "restart an engine, optionally with changed flags")):
        es = esub.add_parser(verb, help=help_text)
        es.add_argument("name")
        add_spec_flags(es)
        es.add_argument("--no-wait", action="store_true", help="return once launched")
        es.add_argument("--timeout", type=float, default=900.0, metavar="S", help="how long to wait for ready")
        es.add_argument("--quiet", "-q", action="store_true")
        es.add_argument("--force", action="store_true",
                        help="start even if the planner says the config cannot fit (vLLM decides)")
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


def _reader_went_away() -> int:
    """`status --json | head`: the reader took what it wanted and closed the pipe. Say nothing,
    and point stdout at /dev/null so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + 13  # as a process that SIGPIPE ended, which is what a shell expects of a pipe


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.cmd is None:
        if sys.stdin.isatty() and sys.stdout.isatty():  # a person at a terminal: the console
            from llmconsole.console.tui.run import run_console
            return run_console()
        ns = parser.parse_args(["status"])  # a script or a pipe: the status table, as before
    try:
        code: int = ns.func(ns) or 0
        sys.stdout.flush()  # inside the try: a reader that went away is seen here, not at exit
        return code
    except BrokenPipeError:
        return _reader_went_away()
    except CliError as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return e.code
    except DaemonNotRunning as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_NO_DAEMON
    except KeyboardInterrupt:
        print("interrupted; engines keep running", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
