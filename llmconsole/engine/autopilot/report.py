"""What each of the autopilot's controls did, and why, on one time axis: pure (the daemon's
state and its audit log in, a report out) so that it is tested on recorded states.

Each event names its control (window, mode, standby, tune), when, what changed and the reason
the control gave: the latency the window measured against its target, the memory pressure the
mode policy saw, the alert the standby answered, the tune's proposal or the guard's breach.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from llmconsole.engine.alerts import rules as ar

MAX_EVENTS = 200


class ActionLike(Protocol):
    """What the report reads of a recorded action (db/records.py Action)."""

    @property
    def id(self) -> int: ...
    @property
    def at(self) -> float: ...
    @property
    def engine(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def automatic(self) -> bool: ...
    @property
    def detail(self) -> dict[str, Any]: ...


def _event(at_s: float, control: str, what: str, why: str, engine: str | None = None) -> dict[str, Any]:
    return {"at_s": at_s, "control": control, "engine": engine, "what": what, "why": why}


# The controller's actions that move the window (engine/gateway/pid.py); the others hold it.
MOVES = ("step", "clamped", "capped", "floored")


def window_events(trace: Iterable[Mapping[str, Any]], since_s: float, signal: str) -> list[dict[str, Any]]:
    """Every move of the window since `since_s`, with the latency (`signal`) that moved it."""
    out = []
    prev: int | None = None
    for step in trace:
        w = step.get("window")
        if step.get("at_s", 0.0) < since_s or w is None:
            prev = w if w is not None else prev
            continue
        if prev is not None and w != prev and step.get("action") in MOVES:
            measured, target = step.get("measured_ms"), step.get("target_ms")
            why = (
                f"p99 {signal} {measured:.0f} ms against the {target:.0f} ms target"
                if measured is not None and target is not None
                else str(step.get("action"))
            )
            out.append(_event(float(step["at_s"]), "window", f"window {prev} -> {w}", why))
        prev = w
    return out


def _action_events(actions: Sequence[ActionLike], engines: set[str], since_s: float) -> list[dict[str, Any]]:
    out = []
    for a in actions:
        d = a.detail
        if a.at < since_s or (a.engine is not None and a.engine not in engines):
            continue
        if a.kind == "mode" and a.automatic:
            why = d.get("reason") or "the memory-mode policy"
            out.append(_event(a.at, "mode", f"mode -> {d.get('mode')} ({a.outcome})", why, a.engine))
        elif a.kind.startswith("response:"):
            what = f"{a.kind.removeprefix('response:')} ({a.outcome})"
            why = f"alert {d.get('trigger')}" + (f"; {d['error']}" if d.get("error") else "")
            out.append(_event(a.at, "standby", what, why, a.engine))
        elif a.kind == "tune" and a.automatic:
            why = f"a scheduled tune's winner ({d.get('overrides')})"
            out.append(_event(a.at, "tune", f"tuned config applied ({a.outcome})", why, a.engine))
        elif a.kind == "rollback" and a.automatic:
            out.append(_event(a.at, "tune", f"rolled back ({a.outcome})", str(d.get("reason") or ""), a.engine))
    return out


def _tune_events(tune: Mapping[str, Any], engines: set[str], since_s: float) -> list[dict[str, Any]]:
    out = []
    for run in tune.get("runs", []):
        if run.get("engine") not in engines or run.get("at_s", 0.0) < since_s:
            continue
        if run.get("status") in ("skipped", "failed", "postponed"):
            out.append(
                _event(run["at_s"], "tune", f"scheduled tune {run['status']}", str(run.get("error")), run["engine"])
            )
            continue
        proposal = run.get("proposal")
        what = (
            f"scheduled tune: {run.get('trials')} trials, proposal {proposal}"
            if proposal
            else "scheduled tune: no proposal"
        )
        why = (
            f"load {run.get('load')}, {run.get('proposal_req_s') or 0:.2f} req/s within the SLO"
            if proposal
            else "; ".join(run.get("why_no_proposal") or []) or "no trial met the SLO"
        )
        out.append(_event(run["at_s"], "tune", what, why, run["engine"]))
    return out


def control_report(
    pilot: Mapping[str, Any],
    *,
    window: Mapping[str, Any],
    modes: Mapping[str, Mapping[str, Any]],
    alerts: Sequence[Mapping[str, Any]],
    responses: Mapping[str, Any],
    tune: Mapping[str, Any],
    actions: Sequence[ActionLike],
    now_s: float,
) -> dict[str, Any]:
    since = float(pilot["since_s"])
    engines = set(pilot["engines"])
    plan = pilot.get("plan", {})
    events = window_events(window.get("trace", []), since, str(window.get("signal"))) + _action_events(
        actions, engines, since
    )
    events += _tune_events(tune, engines, since)
    events.sort(key=lambda e: e["at_s"])
    burning = [a for a in alerts if a.get("rule") == ar.SLO_BURNING and a.get("engine") in engines]
    standby_on = "standby" in responses.get("responses", {}).get(ar.SLO_BURNING, [])
    watches = {e: w for e, w in tune.get("watches", {}).items() if e in engines}
    controls: dict[str, dict[str, Any]] = {
        "window": {
            "on": not window.get("frozen", True),
            "setting": f"p99 {window.get('signal')} {window.get('target_ms'):g} ms, "
            f"window {window.get('min_window')}..{window.get('max_window')}",
            "now": f"window {window.get('window')}" + (" (frozen)" if window.get("frozen") else ""),
        },
        "mode": {
            "on": bool(plan.get("mode")) and all(m.get("auto") for m in modes.values()),
            "setting": "auto memory mode" if plan.get("mode") else "left as it is",
            "now": ", ".join(f"{e}: {m.get('mode') or 'custom'}" for e, m in sorted(modes.items())),
        },
        "standby": {
            "on": bool(plan.get("standby")) and standby_on,
            "setting": f"standby when {ar.SLO_BURNING} fires" if plan.get("standby") else "off",
            "now": ", ".join(f"{a['rule']} {a['state']} for {a['for_s']} s" for a in burning) or "SLO not burning",
        },
        "tune": {
            "on": all(e in tune.get("schedule", {}) for e in engines) and plan.get("tune_interval_s") is not None,
            "setting": f"every {plan.get('tune_interval_s') or 0:.0f} s, applied under the guard"
            if plan.get("tune_interval_s") is not None
            else "off",
            "now": ", ".join(
                f"{e}: {w.get('state')}" + (f" ({w['reason']})" if w.get("reason") else "")
                for e, w in sorted(watches.items())
            )
            or "no tuned config under watch",
        },
    }
    for name, control in controls.items():
        control["did"] = sum(1 for e in events if e["control"] == name)
    return {
        "group": pilot["group"],
        "engines": sorted(engines),
        "slo": dict(pilot["slo"]),
        "since_s": since,
        "for_s": round(now_s - since, 1),
        "controls": controls,
        "timeline": events[-MAX_EVENTS:],
    }
