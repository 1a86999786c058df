"""The autopilot: the daemon's own controls turned on together, for one engine or group, to hold
one SLO (its routes: daemon/api/autopilot.py).

Turning it on changes four things, each through the path an operator's change takes and so each
recorded as it is today (a window action, the mode policy's on/off action, a responses action, a
tune_schedule action), plus an `autopilot` action that names them:

  window   the group's PID controller holds the SLO's latency (its signal and target), unfrozen
  mode     the auto memory-mode policy for every engine of the group
  standby  the `standby` response to the SLO-burning alert (a second engine joins the group)
  tune     the scheduled tune, applying only a winner that beats the running config, guarded

Turning it off puts each back as it was found. What each control did since is read back from
the store and the services' own state (engine/autopilot/report.py says why, in words).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from llmconsole.atomic import read_json_object, write_atomic
from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.http import NotFound
from llmconsole.daemon.services.rollback import ActionLog
from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.autopilot.plan import AutopilotPlan, window_settings
from llmconsole.engine.autopilot.report import control_report

if TYPE_CHECKING:
    from llmconsole.daemon.services.mode_service import ModeService
    from llmconsole.daemon.services.response_service import ResponseService
    from llmconsole.daemon.services.tune_service import TuneService

log = logging.getLogger(__name__)


class AutopilotOff(NotFound):
    """The autopilot is not on for that name (404)."""


class AutopilotService:
    def __init__(self, ctx: DaemonContext, modes: ModeService, responses: ResponseService, tune: TuneService):
        self.ctx = ctx
        self.modes, self.responses, self.tune = modes, responses, tune
        self.path = ctx.data_dir / "autopilot.json"
        self.pilots: dict[str, dict[str, Any]] = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        return read_json_object(self.path)

    def _save(self) -> None:
        write_atomic(self.path, json.dumps(self.pilots, indent=1))  # whole, durable, 0600

    def _members(self, name: str) -> tuple[str, list[str]]:
        """The group `name` is (an engine's own, or a named one) and its engines on this host."""
        gateway = self.ctx.need_gateway()
        group = gateway.window_state(name, trace_points=0)  # an unknown name: 404
        engines = [e for e in group["engines"] if "@" not in e and e in self.ctx.fleet.engines]
        if not engines:
            raise ValueError(f"{name} has no engine on this host for the autopilot to drive")
        return str(group["group"]), engines

    async def turn_on(
        self, name: str, plan: AutopilotPlan, *, actor: str, session_id: int | None = None
    ) -> dict[str, Any]:
        """Every control on, for `plan`'s SLO; ValueError (bad input) changes nothing."""
        gateway = self.ctx.need_gateway()
        group, engines = self._members(name)
        if group in self.pilots:
            raise ValueError(f"the autopilot is already on for {group}: turn it off first to change its SLO")
        settings = window_settings(plan)  # ValueError before anything changes
        for e in engines:
            self.tune.check_schedule({"engine": e, **plan.tune_schedule()})
        store = self.ctx.store
        log_ = ActionLog(store)
        window_before = gateway.window_state(group, trace_points=0)
        before: dict[str, Any] = {
            "window": {
                k: window_before[k] for k in ("frozen", "window", "target_ms", "signal", "min_window", "max_window")
            },
            "responses": copy.deepcopy(self.responses.settings),
            "auto": {e: e in self.modes.auto for e in engines},
            "schedule": {e: copy.deepcopy(self.tune.schedule.get(e)) for e in engines},
        }
        pilot = {
            "group": group,
            "engines": engines,
            "slo": plan.slo.as_dict(),
            "plan": plan.to_json(),
            "since_s": time.time(),
            "actor": actor,
            "before": before,
        }
        with log_.change(
            "autopilot", group, actor, session_id=session_id, before={"on": False}, detail={"plan": plan.to_json()}
        ) as done:
            with log_.change(
                "window",
                group,
                actor,
                session_id=session_id,
                before=before["window"],
                detail={"group": group, "asked": settings, "by": "autopilot"},
            ) as w:
                state = gateway.change_window(group, settings=settings, freeze=False)
                await gateway.saved()
                w["to"] = {k: state[k] for k in ("frozen", "window", "target_ms", "signal", "min_window", "max_window")}
            if plan.mode:
                for e in engines:
                    if e not in self.modes.auto:
                        await self.modes.set_mode(e, "auto", actor=actor, session_id=session_id)
            new = autopilot_responses(self.responses.settings, plan)
            if new != self.responses.settings:
                with log_.change(
                    "responses",
                    None,
                    actor,
                    session_id=session_id,
                    before=before["responses"],
                    detail={"by": "autopilot"},
                ) as r:
                    r["to"] = await self.responses.configure(new)
            if plan.tune_interval_s is not None:
                for e in engines:
                    with log_.change(
                        "tune_schedule",
                        e,
                        actor,
                        session_id=session_id,
                        before={"schedule": before["schedule"][e]},
                        detail={"by": "autopilot"},
                    ) as t:
                        self.tune.set_schedule({"engine": e, **plan.tune_schedule()})
                        t["to"] = {"schedule": self.tune.schedule.get(e)}
            self.pilots[group] = pilot
            self._save()
            done["to"] = {"on": True, "engines": engines, "slo": pilot["slo"]}
        return self.status(group)

    async def turn_off(self, name: str, *, actor: str, session_id: int | None = None) -> dict[str, Any]:
        """Every control back as the autopilot found it."""
        group = self._group_of(name)
        pilot = self.pilots[group]
        before = pilot["before"]
        gateway = self.ctx.need_gateway()
        log_ = ActionLog(self.ctx.store)
        report = self.status(group)
        with log_.change("autopilot", group, actor, session_id=session_id, before={"on": True}) as done:
            w = before["window"]
            settings = {k: w[k] for k in ("target_ms", "signal", "min_window", "max_window")}
            with log_.change(
                "window", group, actor, session_id=session_id, before={}, detail={"group": group, "by": "autopilot off"}
            ) as wd:
                if w["frozen"]:
                    gateway.change_window(group, settings=settings, window=int(w["window"]))
                else:
                    gateway.change_window(group, settings=settings, freeze=False)
                await gateway.saved()
                wd["to"] = {k: w[k] for k in ("frozen", "target_ms", "signal")}
            for e in pilot["engines"]:
                if e in self.ctx.fleet.engines and not before["auto"].get(e) and e in self.modes.auto:
                    await self.modes.stop_auto(e, actor=actor, session_id=session_id)
            restored = restored_responses(self.responses.settings, before["responses"])
            if restored != self.responses.settings:
                with log_.change(
                    "responses", None, actor, session_id=session_id, before=copy.deepcopy(self.responses.settings)
                ) as r:
                    r["to"] = await self.responses.configure(restored)
            for e in pilot["engines"]:
                if e not in self.ctx.fleet.engines:
                    continue
                old = before["schedule"].get(e)
                with log_.change(
                    "tune_schedule", e, actor, session_id=session_id, before={"schedule": self.tune.schedule.get(e)}
                ) as t:
                    self.tune.set_schedule({"engine": e, **old} if old else {"engine": e, "off": True})
                    t["to"] = {"schedule": self.tune.schedule.get(e)}
            del self.pilots[group]
            self._save()
            done["to"] = {"on": False}
        return {**report, "on": False}

    def _group_of(self, name: str) -> str:
        if name in self.pilots:
            return name
        for group, pilot in self.pilots.items():
            if name in pilot["engines"]:
                return group
        raise AutopilotOff(f"the autopilot is not on for {name}")

    def status(self, name: str | None = None) -> dict[str, Any]:
        """Each pilot's controls: what each is set to, what it did since the autopilot went on, and why."""
        groups = [self._group_of(name)] if name is not None else sorted(self.pilots)
        store = self.ctx.store
        pilots = []
        for group in groups:
            pilot = self.pilots[group]
            actions = store.actions(since=pilot["since_s"]) if store is not None else []
            gateway = self.ctx.need_gateway()
            window = gateway.window_state(group, trace_points=600)
            tune = self.tune.state()
            pilots.append(
                control_report(
                    pilot,
                    window=window,
                    modes={e: self.modes.state(e) for e in pilot["engines"] if e in self.ctx.fleet.engines},
                    alerts=self.responses.alert_states(),
                    responses=self.responses.settings,
                    tune=tune,
                    actions=actions,
                    now_s=time.time(),
                )
            )
        return {"on": bool(pilots), "pilots": pilots}


def autopilot_responses(settings: dict[str, Any], plan: AutopilotPlan) -> dict[str, Any]:
    """The response settings while the autopilot is on: the standby answers an SLO burn (when
    the plan asks), and no rule halves the window. That response sets the window by hand, which
    freezes the PID controller the autopilot runs on the same SLO: the first alert would stop
    the window control for as long as the autopilot stayed on."""
    out = copy.deepcopy(settings)
    for rule, actions in list(out["responses"].items()):
        kept = [a for a in actions if a != "window"]
        if kept:
            out["responses"][rule] = kept
        else:
            del out["responses"][rule]
    if plan.standby:
        actions = out["responses"].setdefault(ar.SLO_BURNING, [])
        if "standby" not in actions:
            actions.append("standby")
        if plan.standby_for_s is not None:
            out["for_s"][ar.SLO_BURNING] = plan.standby_for_s
    return out


def restored_responses(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The response settings after the autopilot: its standby gone and the window responses it
    took out back, as they were before it (other changes made since are kept)."""
    out = copy.deepcopy(now)
    for rule in set(now["responses"]) | set(before["responses"]):
        old = before["responses"].get(rule, [])
        actions = [a for a in now["responses"].get(rule, []) if a != "standby" or rule != ar.SLO_BURNING or a in old]
        if "window" in old and "window" not in actions:
            actions.insert(min(old.index("window"), len(actions)), "window")
        if actions:
            out["responses"][rule] = actions
        else:
            out["responses"].pop(rule, None)
    if ar.SLO_BURNING in before["for_s"]:
        out["for_s"][ar.SLO_BURNING] = before["for_s"][ar.SLO_BURNING]
    else:
        out["for_s"].pop(ar.SLO_BURNING, None)
    return out
