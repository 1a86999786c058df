"""One console over several hosts: each host's answers merged into the one status the console reads.

In the merged status every engine is named ENGINE@HOST (and carries `host`), so each screen, key
and command of the console works as it does over one daemon and says where it acts; the source
(sources/hosts.py) splits the name again and sends the command to that host's daemon with the
engine's own name. `hosts` lists every host in the order given: its daemon's host figures, and
whether its newest poll answered (ssh's reason when it did not). A host that stopped answering
keeps its engines in the list as last seen. The functions here are pure: a recording of merged
frames replays as the live console showed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmconsole.console.hosts import split_engine
from llmconsole.wire import UNVERSIONED


@dataclass
class HostState:
    """What the console knows of one host: its newest status and how its polls fare."""

    name: str
    label: str
    local: bool = False
    status: dict[str, Any] | None = None  # the newest status it answered with
    answered_at: float | None = None  # when that came (the source's monotonic clock)
    reachable: bool = True  # False: ssh could not reach it (error is ssh's reason)
    error: str | None = None  # why the newest poll brought no status
    retry_in_s: float | None = None  # backing off after a failure: the next attempt in so long
    asked_at: float | None = None  # a poll of it is unanswered since then

    def answered(self, status: dict[str, Any], at: float) -> None:
        self.status, self.answered_at = status, at
        self.reachable, self.error, self.retry_in_s, self.asked_at = True, None, None, None

    def failed(self, error: str, *, reachable: bool = True, retry_in_s: float | None = None) -> None:
        self.reachable, self.error, self.retry_in_s, self.asked_at = reachable, error, retry_in_s, None


def engine_key(name: str, host: str) -> str:
    return f"{name}@{host}"


def split_key(key: str) -> tuple[str, str]:
    """ENGINE@HOST -> (ENGINE, HOST); engine names hold no '@', host names may."""
    name, host = split_engine(key)
    if host is None:
        raise ValueError(f"{key!r} names no host (ENGINE@HOST)")
    return name, host


def _section(s: HostState, now: float) -> dict[str, Any]:
    st = s.status or {}
    return {
        "name": s.name,
        "label": s.label,
        "local": s.local,
        "reachable": s.reachable,
        "error": s.error,
        "retry_in_s": None if s.retry_in_s is None else round(s.retry_in_s, 1),
        "age_s": None if s.answered_at is None else round(now - s.answered_at, 1),
        "waiting_s": None if s.asked_at is None else round(now - s.asked_at, 1),
        "seen": s.status is not None,
        "daemon": st.get("daemon"),
        # The wire its daemon spoke: an answer that names none is the untyped one of old daemons.
        "wire_version": st.get("wire_version", UNVERSIONED) if s.status is not None else None,
        "host": st.get("host"),
        "engines": len(st.get("engines") or ()),
    }


def fleet_status(states: list[HostState], now: float) -> dict[str, Any]:
    """The merged status: every host's engines as ENGINE@HOST, and each host's section. Its clock
    (`daemon.time_s`, the charts' "now") is the newest of the hosts that answered this time."""
    engines: list[dict[str, Any]] = []
    times: list[float] = []
    for s in states:
        st = s.status or {}
        t = (st.get("daemon") or {}).get("time_s")
        if s.error is None and s.asked_at is None and isinstance(t, (int, float)):
            times.append(float(t))
        for e in st.get("engines") or ():
            if isinstance(e, dict):
                engines.append({**e, "name": engine_key(str(e.get("name")), s.name), "host": s.name})
    return {
        "daemon": {"time_s": max(times) if times else None},
        "engines": engines,
        "hosts": [_section(s, now) for s in states],
    }


def fleet_alerts(answers: dict[str, dict[str, Any] | str]) -> dict[str, Any]:
    """GET /v1/alerts of every host as one answer: engines as ENGINE@HOST, each response with its
    `host` (an undo goes there), and a note for each host that did not answer (its reason)."""
    active: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    enabled: dict[str, Any] = {}
    notes: list[str] = []
    for host, answer in answers.items():
        if isinstance(answer, str):
            notes.append(f"{host}: {answer}")
            continue
        for a in answer.get("active") or ():
            active.append({**a, "engine": engine_key(str(a.get("engine")), host)})
        for kind, out in (("alerts", alerts), ("responses", responses)):
            for r in answer.get(kind) or ():
                engine = r.get("engine")
                out.append({**r, "host": host, "engine": engine_key(engine, host) if engine else None})
        for rule, actions in ((answer.get("settings") or {}).get("responses") or {}).items():
            enabled[f"{rule}@{host}"] = actions
    for out in (alerts, responses):
        out.sort(key=lambda r: float(r.get("at") or 0.0))
    return {
        "active": active,
        "alerts": alerts,
        "responses": responses,
        "settings": {"responses": enabled},
        "notes": notes,
    }
