"""`llmconsole autopilot`: the daemon's controls turned on together to hold one SLO.

llmconsole autopilot on demo --slo p99_e2e_ms=2000    the PID window on the SLO's latency, the
                                                      auto memory mode, the standby response and
                                                      the scheduled tune with its guard
llmconsole autopilot status [demo] [--json]           what each control did since, and why
llmconsole autopilot off demo                         each control back as it was found
"""

from __future__ import annotations

import argparse
import json
import time

from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client
from llmconsole.engine.autopilot.plan import AutopilotPlan
from llmconsole.engine.metrics.latency import Slo
from llmconsole.wire.autopilot import AutopilotAnswer, AutopilotPilot


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("autopilot", help="hold one SLO with the window, memory modes, standby and tuning together")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="{on,off,status}")
    on = verbs.add_parser("on", help="turn every control on for ENGINE or GROUP, with one SLO")
    on.add_argument("name", metavar="ENGINE|GROUP")
    on.add_argument(
        "--slo", action="append", required=True, metavar="KEY=MS", help="e.g. p99_e2e_ms=2000 or ttft_ms=500"
    )
    on.add_argument("--no-mode", dest="mode", action="store_false", help="leave the memory mode as it is")
    on.add_argument("--no-standby", dest="standby", action="store_false", help="no standby engine on an SLO burn")
    on.add_argument("--standby-after", type=float, default=None, metavar="S", help="the SLO burns S seconds first")
    on.add_argument(
        "--tune-every", type=float, default=4 * 3600.0, metavar="S", help="scheduled tune interval (0: no tune)"
    )
    on.add_argument("--tune-trials", type=int, default=4, metavar="N", help="trials per scheduled tune")
    on.add_argument(
        "--tune-quiet",
        type=float,
        default=600.0,
        metavar="S",
        help="a due tune waits until the last S seconds' arrivals are at most half the busiest S seconds'",
    )
    on.add_argument("--window", default=None, metavar="MIN-MAX", help="bounds of the window the PID may set")
    on.add_argument("--json", action="store_true")
    off = verbs.add_parser("off", help="put every control back as the autopilot found it")
    off.add_argument("name", metavar="ENGINE|GROUP")
    off.add_argument("--json", action="store_true")
    st = verbs.add_parser("status", help="what each control did, and why")
    st.add_argument("name", nargs="?", metavar="ENGINE|GROUP")
    st.add_argument("--events", type=int, default=20, metavar="N", help="the newest N events (default 20)")
    st.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_autopilot)


def plan_from_flags(ns: argparse.Namespace) -> AutopilotPlan:
    """The plan the flags ask for; a CliError (usage) names what is wrong, nothing sent."""
    try:
        bounds = None
        if ns.window is not None:
            lo, sep, hi = ns.window.partition("-")
            if not sep:
                raise ValueError(f"--window {ns.window!r} is not MIN-MAX")
            bounds = (int(lo), int(hi))
        return AutopilotPlan(
            Slo.parse(ns.slo),
            mode=ns.mode,
            standby=ns.standby,
            standby_for_s=ns.standby_after,
            tune_interval_s=ns.tune_every or None,
            tune_budget_trials=ns.tune_trials,
            tune_quiet_window_s=ns.tune_quiet,
            window_bounds=bounds,
        )
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def cmd_autopilot(ns: argparse.Namespace) -> int:
    from llmconsole.console.client import DaemonError

    plan = plan_from_flags(ns) if ns.verb == "on" else None
    with daemon_client() as client:
        try:
            if plan is not None:
                raw = client.autopilot_on(ns.name, plan.to_json())
            elif ns.verb == "off":
                raw = client.autopilot_off(ns.name)
            else:
                raw = client.autopilot(ns.name)
        except DaemonError as e:
            raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1) from None
    answer = AutopilotAnswer.model_validate(raw)
    if ns.json:
        print(json.dumps(answer.to_wire(), indent=1))
        return 0
    if not answer.pilots:
        print("the autopilot is off everywhere")
        return 0
    for pilot in answer.pilots:
        print(format_pilot(pilot, answer.on, getattr(ns, "events", 20)))
    return 0


def _clock(at_s: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at_s)) if at_s is not None else "--:--:--"


def format_pilot(p: AutopilotPilot, on: bool, events: int = 20) -> str:
    slo = ", ".join(f"{k}={v:g}" for k, v in p.slo.items())
    head = f"autopilot {'on' if on else 'off'} for {p.group} ({', '.join(p.engines)}), SLO {slo}"
    if on and p.for_s is not None:
        head += f", since {_clock(p.since_s)} ({p.for_s:.0f} s)"
    lines = [head]
    for name, c in p.controls.items():
        lines.append(f"  {name:<8} {'on ' if c.on else 'off'} {c.setting}; now {c.now}; {c.did} changes")
    shown = p.timeline[-events:] if events > 0 else []
    if shown:
        lines.append("  time      control  what  (why)")
        lines += [
            f"  {_clock(e.at_s)}  {e.control or '?':<8} {e.what}" + (f"  ({e.why})" if e.why else "") for e in shown
        ]
    return "\n".join(lines)
