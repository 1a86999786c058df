"""Automated responses: the daemon watches its own alert rules and, where enabled, acts.

Every response is off unless enabled per rule (`responses.json` in the data directory, or the
control API), because each one changes a serving engine:

  window    halve the group's admission window at the gateway (and freeze the controller there)
  mode      switch to the next tighter memory mode (a guarded apply)
  kv_dtype  flip the KV cache dtype, auto <-> fp8, where the platform can (a guarded apply);
            refused, with the reason, on CPUs without AVX-512
  standby   start `<engine>-standby` on the same model and add it to the engine's gateway group

Alerts are recorded as they fire and resolve; each response is an action naming its trigger (the
rule and the alert's id) and what undoing it takes. `undo(action_id)` puts the window back,
rolls the engine back to the config it ran before (the history rollback), or stops the standby.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from llmconsole.atomic import FileWriter
from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.services.rollback import rollback
from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.alerts.response_settings import (
    ACTIONS,
    GroupGate,
    ResponseRefused,
    kv_dtype_spec,
    kv_dtype_support,
    validate_settings,
)
from llmconsole.engine.modes.guarded_apply import ApplyFailed, ApplyRefused, guarded_apply
from llmconsole.engine.modes.memory import Mode, cpu_kv_budget_bytes, mode_of, mode_spec
from llmconsole.engine.modes.policy import used_fraction
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.status import EngineState

log = logging.getLogger(__name__)

STANDBY_SUFFIX = "-standby"
_TIGHTER = {Mode.PERFORMANCE: Mode.BALANCED, Mode.BALANCED: Mode.AGGRESSIVE}


class ResponseService:
    def __init__(self, ctx: DaemonContext, *, settings_path: Path | None = None):
        self.ctx = ctx
        self.fleet = ctx.fleet
        self.store = ctx.need_store()
        self.gateway = ctx.gateway
        self.settings_path = settings_path or ctx.data_dir / "responses.json"
        self._writer = FileWriter(self.settings_path)  # off the event loop, in order
        self.settings = self._read_settings()
        self.tracker = ar.AlertTracker()
        self._apply_for_s()
        self.members: dict[str, str] = {}  # standby engine -> the group it serves in
        self._alert_ids: dict[tuple[str, str], int] = {}
        self._busy: set[str] = set()  # engines with a response under way
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self.last_facts: dict[str, ar.EngineFacts] = {}
        # Engines the supervisor gave up on as crash-looping since the last evaluation: (config,
        # why). The rollback that follows clears `crash_looping` within milliseconds, long before
        # the next evaluation could see it, so the give-up is kept here until one has.
        self._gave_up: dict[str, tuple[str, str | None]] = {}
        self.fleet.config_failed_listeners.append(self._config_failed)

    # --- settings -------------------------------------------------------------------------

    def _read_settings(self) -> dict[str, Any]:
        try:
            return validate_settings(json.loads(self.settings_path.read_text()))
        except FileNotFoundError:
            return validate_settings({})
        except (OSError, ValueError) as e:
            log.error("response settings in %s ignored (%s): every response stays off", self.settings_path, e)
            return validate_settings({})

    def _apply_for_s(self) -> None:
        rules = dict(ar.DEFAULT_RULES)
        for rule, seconds in self.settings["for_s"].items():
            rules[rule] = ar.Rule(rule, rules[rule].severity, float(seconds), rules[rule].summary)
        self.tracker.rules = rules

    async def configure(self, data: dict[str, Any]) -> dict[str, Any]:
        """Replace the settings (ValueError leaves them as they were) and keep them on disk: durable
        when it returns, written off the event loop."""
        self.settings = validate_settings(data)
        self._apply_for_s()
        await asyncio.wrap_future(self._writer.submit(json.dumps(self.settings, indent=1)))
        return self.settings

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="alert-rules")

    async def close(self) -> None:
        for t in [self._loop_task, *self._tasks]:
            if t is not None:
                t.cancel()
        for t in [self._loop_task, *self._tasks]:
            if t is not None:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass

    async def _loop(self) -> None:
        while True:
            try:
                self.sync_members()
                await self.evaluate_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # evaluation must never stop supervision
                log.exception("alert evaluation failed")
            await asyncio.sleep(self.settings["interval_s"])

    # --- evaluation -----------------------------------------------------------------------

    def _config_failed(self, name: str) -> None:
        """The fleet's word that supervision gave up on `name`'s config (before any rollback)."""
        sup = self.fleet.engines.get(name)
        if sup is not None and sup.crash_looping:
            self._gave_up[name] = (sup.config_id, sup.last_error)

    def facts(self) -> dict[str, ar.EngineFacts]:
        host = self.fleet.probe.sample_host()
        gpu_ratio = used_fraction(host) if any(g.memory_total_bytes for g in host.gpus) else None
        out = {}
        for st in self.fleet.statuses():
            if st.name in self.members:
                continue  # a standby answers alerts of its group; it raises none of its own
            slo = None
            group = self.gateway.group_of(st.name) if self.gateway is not None else None
            if group is not None:
                s = group.controller.settings
                slo = ar.slo_figures(list(group.records), s.target_ms, str(s.signal))
            out[st.name] = ar.EngineFacts(
                st.name,
                kv_cache_usage=getattr(st.metrics, "kv_cache_usage", None),
                max_num_seqs=st.spec.get("max_num_seqs"),
                gpu_memory_used_ratio=gpu_ratio,
                crash_looping=st.crash_looping or st.name in self._gave_up,
                slo=slo,
            )
        return out

    async def evaluate_once(self) -> list[ar.Transition]:
        facts = self.facts()
        gave_up, self._gave_up = self._gave_up, {}
        self.last_facts = facts
        transitions = self.tracker.evaluate({name: ar.conditions(f) for name, f in facts.items()})
        for t in transitions:
            key = (t.rule, t.engine)
            if t.to == "firing":
                rule = self.tracker.rules[t.rule]
                f = facts.get(t.engine)
                detail = {
                    "summary": rule.summary,
                    "kv_cache_usage": getattr(f, "kv_cache_usage", None),
                    "gpu_memory_used_ratio": getattr(f, "gpu_memory_used_ratio", None),
                    "slo_attainment": f.slo.attainment if f and f.slo else None,
                }
                if t.rule == ar.CRASH_LOOPING and t.engine in gave_up:
                    detail["config_id"], detail["reason"] = gave_up[t.engine]
                self._alert_ids[key] = await asyncio.to_thread(
                    self.store.alert_fired, t.rule, rule.severity, engine=t.engine, detail=detail
                )
                log.warning("alert %s firing on %s", t.rule, t.engine)
                actions = self.settings["responses"].get(t.rule, [])
                if actions:
                    self._spawn(self._respond_all(actions, t.engine, t.rule, self._alert_ids[key]))
            else:
                alert_id = self._alert_ids.pop(key, None)
                if alert_id is not None:
                    await asyncio.to_thread(self.store.alert_resolved, alert_id)
                log.info("alert %s resolved on %s", t.rule, t.engine)
        return transitions

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- responses ------------------------------------------------------------------------

    async def _respond_all(self, actions: list[str], engine: str, trigger: str, alert_id: int) -> None:
        """One alert's responses, in the order configured: each sees what the last one did."""
        for action in actions:
            await self.respond(action, engine, trigger=trigger, alert_id=alert_id)

    async def respond(self, action: str, engine: str, *, trigger: str, alert_id: int | None = None) -> dict[str, Any]:
        """Carry out one response; it is recorded whatever happens. Returns the action's record."""
        if action not in ACTIONS:
            raise ResponseRefused(f"unknown response {action!r}: choose from {', '.join(ACTIONS)}")
        detail = {"trigger": trigger, "alert_id": alert_id}
        action_id = self.store.record_action(
            f"response:{action}", engine=engine, actor="llmconsole", automatic=True, detail=detail
        )
        if engine in self._busy:
            self.store.update_action_outcome(action_id, "refused", {"error": f"a response on {engine} is under way"})
            return {"action_id": action_id, "outcome": "refused"}
        self._busy.add(engine)
        try:
            outcome, more = await getattr(self, f"_do_{action}")(engine, trigger)
        except (ResponseRefused, ApplyRefused) as e:
            outcome, more = "refused", {"error": str(e)}
        except ApplyFailed as e:
            outcome, more = "rolled_back", {"error": str(e)}
        except Exception as e:
            log.exception("response %s on %s failed", action, engine)
            outcome, more = "failed", {"error": f"{type(e).__name__}: {e}"}
        finally:
            self._busy.discard(engine)
        self.store.update_action_outcome(action_id, outcome, more)
        log.warning("response %s to %s on %s: %s %s", action, trigger, engine, outcome, more.get("error", ""))
        return {"action_id": action_id, "outcome": outcome, **more}

    def _gate(self) -> GroupGate | None:
        return GroupGate(self.gateway) if self.gateway is not None else None

    async def _apply(self, engine: str, spec: EngineSpec, trigger: str) -> tuple[str, dict[str, Any]]:
        sup = self.fleet.get(engine)
        before = sup.spec
        result = await guarded_apply(
            self.fleet,
            engine,
            spec,
            store=self.store,
            gate=self._gate(),
            actor="llmconsole",
            kind="apply",
            automatic=True,
            detail={"trigger": trigger},
        )
        return "applied", {
            "from_config_id": before.config_id,
            "to_config_id": result.to_config_id,
            "undo": {"rollback_to": before.config_id},
        }

    async def _do_mode(self, engine: str, trigger: str) -> tuple[str, dict[str, Any]]:
        sup = self.fleet.get(engine)
        device = sup.status().device
        device = "cpu" if device == "unknown" else device
        now = mode_of(sup.spec, device)
        nxt = _TIGHTER.get(Mode(now)) if now else Mode.BALANCED
        if nxt is None:
            raise ResponseRefused(f"engine {engine} is already in the tightest mode (aggressive)")
        return await self._apply(
            engine,
            mode_spec(sup.spec, nxt, device, cpu_kv_budget_bytes(self.ctx.settings.settings.cpu_kv_budget_bytes)),
            trigger,
        )

    async def _do_kv_dtype(self, engine: str, trigger: str) -> tuple[str, dict[str, Any]]:
        sup = self.fleet.get(engine)
        ok, why = kv_dtype_support(sup.status().device, said=self.ctx.settings.settings.fp8_kv)
        if not ok:
            raise ResponseRefused(why)
        return await self._apply(engine, kv_dtype_spec(sup.spec), trigger)

    async def _do_window(self, engine: str, trigger: str) -> tuple[str, dict[str, Any]]:
        if self.gateway is None:
            raise ResponseRefused("this daemon runs no gateway")
        group = self.gateway.group(engine)
        before = {"window": group.controller.window, "frozen": group.controller.frozen}
        lowered = max(group.controller.settings.min_window, before["window"] // 2)
        if lowered >= before["window"]:
            raise ResponseRefused(f"the window of {engine} is already at its minimum ({before['window']})")
        self.gateway.change_window(engine, window=lowered)
        return "applied", {
            "window_before": before["window"],
            "window_after": lowered,
            "undo": {"window": before},
            "from": before,
            "to": {"window": lowered, "frozen": True},
        }

    async def _do_standby(self, engine: str, trigger: str) -> tuple[str, dict[str, Any]]:
        if self.gateway is None:
            raise ResponseRefused("this daemon runs no gateway to put a standby behind")
        name = f"{engine}{STANDBY_SUFFIX}"
        if name in self.fleet.engines and self.fleet.get(name).state.running:
            raise ResponseRefused(f"standby {name} is already running")
        primary = self.fleet.get(engine).spec
        fields = primary.config_dict()
        fields["port"] = None
        if primary.api_key is not None:
            fields["api_key"] = primary.api_key.get_secret_value()
        if name in self.fleet.engines:
            await self.fleet.restart(name, EngineSpec(**fields))
        else:
            await self.fleet.start(name, EngineSpec(**fields))
        self.members[name] = engine
        self.sync_members()
        return "applied", {"standby": name, "undo": {"stop_standby": name}}

    def sync_members(self) -> None:
        """Keep each standby an upstream of its primary's group, ready when it is ready. A standby
        is known by its name, so a new daemon puts the standbys it adopts back in their groups."""
        if self.gateway is None:
            return
        for name in self.fleet.engines:
            primary = name.removesuffix(STANDBY_SUFFIX)
            if primary != name and primary in self.fleet.engines:
                self.members.setdefault(name, primary)
        for standby, primary in list(self.members.items()):
            group = self.gateway.group_of(primary)
            sup = self.fleet.engines.get(standby)
            if group is None or sup is None:
                if group is not None:
                    group.remove_upstream(standby)
                self.members.pop(standby, None)
                continue
            st = sup.status()
            key = sup.spec.api_key.get_secret_value() if sup.spec.api_key else None
            group.set_upstream(standby, st.url, st.state == EngineState.READY, key)

    # --- undo -----------------------------------------------------------------------------

    async def undo(self, action_id: int, actor: str = "operator") -> dict[str, Any]:
        action = self.store.action(action_id)
        if action is None or action.engine is None or not action.kind.startswith("response:"):
            raise ResponseRefused(f"no response with action id {action_id}")
        detail = action.detail
        if action.outcome != "applied":
            raise ResponseRefused(f"response {action_id} was {action.outcome}: there is nothing to undo")
        if detail.get("undone_by"):
            raise ResponseRefused(f"response {action_id} was already undone (action {detail['undone_by']})")
        undo = detail.get("undo") or {}
        undo_id = self.store.record_action(
            "undo", engine=action.engine, actor=actor, detail={"undoes": action_id, **undo}
        )
        try:
            result = await self._undo(action.engine, undo)
        except Exception as e:
            self.store.update_action_outcome(undo_id, "failed", {"error": str(e)})
            raise
        self.store.update_action_outcome(undo_id, "applied", result)
        self.store.update_action_outcome(action_id, "applied", {"undone_by": undo_id})
        return {"undo_action_id": undo_id, "undoes": action_id, **result}

    async def _undo(self, engine: str, undo: dict[str, Any]) -> dict[str, Any]:
        if "window" in undo:
            if self.gateway is None:
                raise ResponseRefused("this daemon runs no gateway: the window cannot be put back")
            before = undo["window"]
            ctl = self.gateway.group(engine).controller
            now = {"window": ctl.window, "frozen": ctl.frozen}
            self.gateway.change_window(engine, window=int(before["window"]))
            if not before["frozen"]:
                self.gateway.change_window(engine, freeze=False)
            return {
                "window": before["window"],
                "from": now,
                "to": {"window": before["window"], "frozen": bool(before["frozen"])},
            }
        if "stop_standby" in undo:
            name = undo["stop_standby"]
            if name in self.fleet.engines:
                await self.fleet.stop(name)  # not ready while it stops: the group routes around it
                await self.fleet.remove(name)
            self.members.pop(name, None)
            group = self.gateway.group_of(engine) if self.gateway else None
            if group is not None:
                group.remove_upstream(name)
            return {"stopped": name}
        if "rollback_to" in undo:
            return await rollback(
                self.ctx,
                engine,
                actor="operator",
                to_config_id=undo["rollback_to"],
                reason="undo of an automated response",
            )
        raise ResponseRefused("this response records no way to undo it")

    # --- what status, /metrics and the console read ---------------------------------------

    def alert_states(self) -> list[dict[str, Any]]:
        return [
            {"rule": a.rule, "engine": a.engine, "state": a.state, "for_s": round(time.monotonic() - a.since_s, 1)}
            for a in self.tracker.active.values()
        ]
