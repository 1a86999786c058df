"""`llmconsole window NAME`: a group's batch window at the gateway and its controller. NAME is
an engine group (see `llmconsole group`) or an engine, which means the group it is served in.

  llmconsole window demo                          show the window, the controller and recent steps
  llmconsole window demo --target-ms 800 --signal ttft --min 4 --max 32
  llmconsole window demo --freeze | --unfreeze     stop or resume the controller
  llmconsole window demo --set 12                  fix the window by hand (freezes the controller)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client, na
from llmconsole.wire.gateway import WindowState


def _ms(v: float | None) -> str:
    return na(v, "{:.0f} ms")


_SIGNAL_NAMES = {"ttft": "TTFT", "e2e": "end-to-end", "tpot": "TPOT"}


def no_samples_text(signal: str | None, recent_ok: int | None, recent_streamed: int | None) -> str:
    """What to say where the controller's signal has no samples, instead of a value: a TTFT or a
    TPOT exists only for streamed requests, and a client that never streams gives it none."""
    name = _SIGNAL_NAMES.get(signal or "", signal or "signal")
    if signal in ("ttft", "tpot") and recent_ok and not recent_streamed:
        return f"no {name} samples: requests not streamed"
    if not recent_ok:
        return f"no {name} samples: no requests finished lately"
    return f"no {name} samples yet"


def measured_text(state: WindowState) -> str:
    """`p99 ttft 412 ms (target 800 ms)`, or why there is no figure."""
    measured = state.trace[-1].measured_ms if state.trace else None
    if measured is None:
        return no_samples_text(state.signal, state.recent_ok, state.recent_streamed)
    return f"p99 {state.signal} {_ms(measured)} (target {_ms(state.target_ms)})"


def format_window(state: WindowState, steps: int = 10) -> str:
    mode = "frozen" if state.frozen else "controlled"
    name = state.group or state.engine or "?"
    engines = list(state.engines)
    if engines != [name]:
        name = f"group {name} ({', '.join(engines)})"
    lines = [
        f"{name}: window {na(state.window)} ({mode}), in flight {na(state.in_flight)}, "
        f"queued {na(state.queued)}{'' if state.open is not False else ', waiting for a ready engine'}",
        f"  gateway  {state.gateway_url}/v1/...",
        f"  measured {measured_text(state)}",
        f"  target   p99 {state.signal} {_ms(state.target_ms)}, window in "
        f"[{na(state.min_window)}, {na(state.max_window)}], gains kp {na(state.kp)} ki {na(state.ki)} kd {na(state.kd)}",
        f"  totals   admitted {na(state.admitted_total)}, rejected (queue full) {na(state.rejected_full_total)}, "
        f"timed out {na(state.timed_out_total)}",
    ]
    trace = state.trace[-steps:]
    if trace:
        lines.append("  recent steps: measured -> window (action)")
        lines += [
            f"    {_ms(t.measured_ms) if t.measured_ms is not None else 'no samples':>10} -> "
            f"{na(t.window):>3} ({t.action})"
            for t in trace
        ]
    return "\n".join(lines)


def _check_bounds(ns: argparse.Namespace, client: Any) -> None:
    """One bound given: it must not pass the other, standing one; refused in the flags' words."""
    from llmconsole.console.client import DaemonError

    try:
        state = WindowState.model_validate(client.window(ns.engine))
    except DaemonError as e:
        raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1) from None
    if ns.min is not None and state.max_window is not None and ns.min > state.max_window:
        which = f"--min {ns.min} is above the window's max {state.max_window}"
    elif ns.max is not None and state.min_window is not None and ns.max < state.min_window:
        which = f"--max {ns.max} is below the window's min {state.min_window}"
    else:
        return
    raise CliError(f"{which}: min must not exceed max; nothing was changed", EXIT_USAGE)


def cmd_window(ns: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    for arg, key in (("target_ms", "target_ms"), ("signal", "signal"), ("min", "min_window"), ("max", "max_window")):
        if getattr(ns, arg) is not None:
            changes[key] = getattr(ns, arg)
    if ns.freeze or ns.unfreeze:
        changes["freeze"] = bool(ns.freeze)
    if ns.set is not None:
        changes["set"] = ns.set
    from llmconsole.console.client import DaemonError

    if ns.min is not None and ns.max is not None and ns.min > ns.max:
        raise CliError(
            f"--min {ns.min} is above --max {ns.max}: min must not exceed max; nothing was changed", EXIT_USAGE
        )
    with daemon_client() as client:
        if (ns.min is None) != (ns.max is None):
            _check_bounds(ns, client)
        try:
            raw = client.change_window(ns.engine, **changes) if changes else client.window(ns.engine)
        except DaemonError as e:
            raise CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1) from None
    state = WindowState.model_validate(raw)
    if ns.json:
        print(json.dumps(state.to_wire(), indent=1))
    else:
        print(format_window(state))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser("window", help="a group's batch window at the gateway and its PID controller")
    w.add_argument("engine", metavar="NAME", help="an engine group, or an engine (its group)")
    w.add_argument("--target-ms", type=float, help="the latency target of the controller")
    w.add_argument("--signal", choices=("ttft", "e2e", "tpot"), help="p99 TTFT (default), p99 end-to-end or TPOT")
    w.add_argument("--min", type=int, help="smallest window the controller may set (default 4)")
    w.add_argument("--max", type=int, help="largest window the controller may set (default 32)")
    mode = w.add_mutually_exclusive_group()
    mode.add_argument("--freeze", action="store_true", help="stop the controller; the window stays")
    mode.add_argument("--unfreeze", action="store_true", help="resume the controller from the window now")
    mode.add_argument("--set", type=int, metavar="N", help="fix the window at N (freezes the controller)")
    w.add_argument("--json", action="store_true")
    w.set_defaults(func=cmd_window)
