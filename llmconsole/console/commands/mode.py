"""`llmconsole mode` and `llmconsole alerts`: memory modes, alerts and automated responses.

llmconsole mode demo                          the engine's mode, budget and KV size
llmconsole mode demo balanced                 a guarded switch: restart, ready, smoke request,
                                              or back to the previous config (and why)
llmconsole mode demo auto                     let the memory policy pick (60% / 80% thresholds)
llmconsole alerts                             active alerts, recent ones, and their responses
llmconsole alerts --enable LlmconsoleKvCacheHigh=standby,window [--for-s LlmconsoleKvCacheHigh=30]
llmconsole alerts --undo 42                   undo automated response 42
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client, na
from llmconsole.wire.alerts import AlertsAnswer

_MODES = ("performance", "balanced", "aggressive", "auto")


def format_mode(state: dict[str, Any]) -> str:
    mode = state["mode"] or "none (memory settings set by hand)"
    lines = [
        f"{state['engine']}: mode {mode}{' (auto)' if state['auto'] else ''}",
        f"  gpu_memory_utilization {na(state['gpu_memory_utilization'])}, "
        f"kv_cache_memory_bytes {na(state['kv_cache_memory_bytes'], '{:,}')}, "
        f"KV cache {na(state['kv_cache_tokens'], '{:,}')} tokens",
    ]
    if state.get("budget_bytes"):
        lines.append(f"  CPU memory budget {state['budget_bytes']:,} bytes (LLMCONSOLE_CPU_KV_BUDGET_BYTES)")
    applied = state.get("applied")
    if applied:
        lines.append(
            f"  switched {applied['from_config_id']} -> {applied['to_config_id']} in {applied['took_s']:.1f} s"
        )
    return "\n".join(lines)


def cmd_mode(ns: argparse.Namespace) -> int:
    from llmconsole.console.client import DaemonError

    with daemon_client() as client:
        try:
            if ns.mode is None:
                state = client.mode(ns.engine)
            else:  # a switch restarts the engine and waits for it: minutes on a CPU host
                state = client.set_mode(ns.engine, ns.mode, force=ns.force, budget_bytes=ns.budget_bytes)
        except DaemonError as e:  # its text carries the details (the numbers, the restored config)
            raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1) from None
    print(json.dumps(state, indent=1) if ns.json else format_mode(state))
    return 0


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def format_alerts(data: AlertsAnswer) -> str:
    lines = ["active:" if data.active else "active: none"]
    lines += [f"  {a.rule} on {a.engine}: {a.state} for {a.for_s or 0:.0f} s" for a in data.active]
    lines.append("recent alerts:" if data.alerts else "recent alerts: none")
    lines += [
        f"  #{a.id} {_when(a.at)} {a.rule} on {a.engine} ({a.severity}) {a.state}"
        f"{'' if a.resolved_at is None else ' at ' + _when(a.resolved_at)}"
        for a in data.alerts
    ]
    lines.append("responses:" if data.responses else "responses: none")
    for r in data.responses:
        d = r.detail or {}
        extra = (
            f" undone by #{d['undone_by']}" if d.get("undone_by") else (f" ({d['error']})" if d.get("error") else "")
        )
        lines.append(
            f"  #{r.id} {_when(r.at)} {(r.kind or '').removeprefix('response:')} on {r.engine} "
            f"for {d.get('trigger')}: {r.outcome}{extra}"
        )
    enabled = data.settings.get("responses") or {}
    lines.append("enabled: " + (", ".join(f"{k}={'+'.join(v)}" for k, v in enabled.items()) or "none (all off)"))
    return "\n".join(lines)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise CliError(f"{what} {item!r}: write RULE=VALUE", EXIT_USAGE)
        out[key] = value
    return out


def cmd_alerts(ns: argparse.Namespace) -> int:
    from llmconsole.console.client import DaemonError

    with daemon_client() as client:
        try:
            if ns.undo is not None:
                print(json.dumps(client.undo_response(ns.undo), indent=1))
                return 0
            if ns.enable or ns.for_s or ns.disable_all:
                settings = client.response_config()
                if ns.disable_all:
                    settings["responses"] = {}
                for rule, actions in _pairs(ns.enable, "--enable").items():
                    settings["responses"][rule] = [a for a in actions.split(",") if a]
                for rule, seconds in _pairs(ns.for_s, "--for-s").items():
                    try:
                        settings["for_s"][rule] = float(seconds)
                    except ValueError:
                        raise CliError(f"--for-s {rule}={seconds}: give seconds", EXIT_USAGE) from None
                client.response_config(settings)
            data = AlertsAnswer.model_validate(client.alerts())
        except DaemonError as e:
            raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1) from None
    print(json.dumps(data.to_wire(), indent=1) if ns.json else format_alerts(data))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser("mode", help="an engine's memory mode: performance, balanced, aggressive or auto")
    m.add_argument("engine")
    m.add_argument("mode", nargs="?", choices=_MODES)
    m.add_argument("--force", action="store_true", help="skip the fit check (the engine still falls back if it fails)")
    m.add_argument("--budget-bytes", type=int, help="CPU engines: the memory budget the mode is a fraction of")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_mode)

    a = sub.add_parser("alerts", help="alerts the daemon evaluates, and the automated responses to them")
    a.add_argument(
        "--enable",
        action="append",
        default=[],
        metavar="RULE=ACTION[,ACTION]",
        help="responses to a rule: window, mode, kv_dtype, standby",
    )
    a.add_argument(
        "--for-s",
        action="append",
        default=[],
        metavar="RULE=SECONDS",
        help="how long a rule's condition must hold before it fires",
    )
    a.add_argument("--disable-all", action="store_true", help="turn every response off")
    a.add_argument("--undo", type=int, metavar="ACTION_ID", help="undo one automated response")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_alerts)
