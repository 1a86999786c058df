"""Memory-mode switches and the auto mode policy: the daemon's side of `llmconsole mode`.

A switch is a guarded apply (engine/modes/guarded_apply.py): the engine's gateway group holds
it, it restarts on the mode's spec, and goes back to its old config if anything after the
restart fails. The auto policy (engine/modes/policy.py) runs every few seconds for the engines
that ask for it; its choice is kept in modes.json, so a daemon restart keeps it. Its thresholds
are the daemon's mode_policy settings (docs/settings.md: config.toml's [mode_policy], or
LLMCONSOLE_MODE_POLICY as a JSON object). A switch it makes is a mode action like an operator's, recorded as automatic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

from llmconsole.atomic import FileWriter
from llmconsole.daemon.context import DaemonContext
from llmconsole.engine.alerts.response_settings import GroupGate
from llmconsole.engine.modes.guarded_apply import ApplyFailed, ApplyRefused, guarded_apply
from llmconsole.engine.modes.memory import AUTO, Mode, ModeError, cpu_kv_budget_bytes, mode_of, mode_spec, parse_mode
from llmconsole.engine.modes.policy import PolicySettings, PolicyState, step, used_fraction
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.engine.supervisor import EngineBusy

log = logging.getLogger(__name__)

AUTO_INTERVAL_S = 5.0


class ModeService:
    """Mode switches (guarded applies) and the auto policy for the engines that ask for it."""

    def __init__(self, ctx: DaemonContext, policy: PolicySettings | None = None):
        self.ctx = ctx
        self.fleet, self.store, self.gateway = ctx.fleet, ctx.store, ctx.gateway
        self.policy = policy or ctx.settings.settings.mode_policy_settings()  # checked at daemon start
        self._file = ctx.data_dir / "modes.json"
        self._writer = FileWriter(self._file)
        self.auto: dict[str, PolicyState] = {}
        self._busy: set[str] = set()
        self._deferred: set[str] = set()  # a switch waits for the gateway's queue (said once)
        self._task: asyncio.Task[None] | None = None
        for name in self._read_auto():  # a daemon restart also waits an interval before switching
            if name in ctx.fleet.engines:
                now = mode_of(ctx.fleet.engines[name].spec, self.device_of(name))
                self.auto[name] = PolicyState(Mode(now) if now else Mode.PERFORMANCE, time.monotonic())

    def _read_auto(self) -> list[str]:
        try:
            return list(json.loads(self._file.read_text()).get("auto", []))
        except (OSError, ValueError, AttributeError):
            return []

    async def _save(self) -> None:
        """Durable when it returns, written off the event loop (the loop relays streams)."""
        await asyncio.wrap_future(self._writer.submit(json.dumps({"auto": sorted(self.auto)})))

    def device_of(self, name: str) -> str:
        device = self.fleet.get(name).status().device
        return "cpu" if device in ("cpu", "unknown") else device

    def annotate(self, st: EngineStatus) -> EngineStatus:
        device = "cpu" if st.device in ("cpu", "unknown") else st.device
        return dataclasses.replace(st, mode=mode_of(st.spec, device), mode_auto=st.name in self.auto)

    def _budget(self) -> int:
        return cpu_kv_budget_bytes(self.ctx.settings.settings.cpu_kv_budget_bytes)

    def state(self, name: str, budget_bytes: int | None = None) -> dict[str, Any]:
        sup = self.fleet.get(name)
        device = self.device_of(name)
        return {
            "engine": name,
            "mode": mode_of(sup.spec, device),
            "auto": name in self.auto,
            "device": device,
            "budget_bytes": (budget_bytes or self._budget()) if device == "cpu" else None,
            "gpu_memory_utilization": sup.spec.gpu_memory_utilization,
            "kv_cache_memory_bytes": sup.spec.kv_cache_memory_bytes,
            "kv_cache_tokens": sup.status().kv_cache_tokens,
        }

    async def set_mode(
        self,
        name: str,
        mode_text: str,
        *,
        actor: str,
        force: bool = False,
        budget_bytes: int | None = None,
        automatic: bool = False,
        session_id: int | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        sup = self.fleet.get(name)
        if mode_text.strip().lower() == AUTO:
            # Enabling the policy counts as a switch: its first restart waits a full interval.
            was = name in self.auto
            self.auto[name] = PolicyState(
                Mode(mode_of(sup.spec, self.device_of(name)) or Mode.PERFORMANCE), time.monotonic()
            )
            await self._save()
            self._record_auto(name, actor, session_id, was, True)
            return {**self.state(name), "applied": None}
        mode = parse_mode(mode_text)
        if not automatic and name in self.auto:
            del self.auto[name]  # an operator's choice ends the policy's
            await self._save()
            self._record_auto(name, actor, session_id, True, False)
        device = self.device_of(name)
        budget = budget_bytes if budget_bytes is not None else self._budget() if device == "cpu" else None
        new = mode_spec(sup.spec, mode, device, budget)
        if name in self._busy:
            raise EngineBusy(f"a mode switch of {name} is under way")
        self._busy.add(name)
        try:
            gate = GroupGate(self.gateway) if self.gateway is not None else None
            result = await guarded_apply(
                self.fleet,
                name,
                new,
                store=self.store,
                gate=gate,
                actor=actor,
                kind="mode",
                automatic=automatic,
                force=force,
                detail={"mode": mode.value, "budget_bytes": budget, **({"reason": reason} if reason else {})},
            )
        finally:
            self._busy.discard(name)
        return {**self.state(name, budget), "applied": result.to_json()}

    async def stop_auto(self, name: str, *, actor: str, session_id: int | None = None) -> None:
        """End the policy for `name` and leave the engine on the mode it runs now (no restart)."""
        if self.auto.pop(name, None) is not None:
            await self._save()
            self._record_auto(name, actor, session_id, True, False)

    def _record_auto(self, name: str, actor: str, session_id: int | None, was: bool, now: bool) -> None:
        """The auto policy turned on or off for an engine: an action of its own in the history."""
        if self.store is None:
            return
        config_id = self.fleet.get(name).spec.config_id
        action_id = self.store.record_action(
            "mode",
            engine=name,
            actor=actor,
            session_id=session_id,
            from_config_id=config_id,
            to_config_id=config_id,
            detail={"mode": AUTO if now else "set by hand", "from": {"auto": was}},
        )
        self.store.update_action_outcome(action_id, "done", {"to": {"auto": now}})

    async def start(self) -> None:
        self._task = asyncio.create_task(self._auto_loop(), name="mode-auto")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _auto_loop(self) -> None:
        while True:
            try:
                await self.auto_step(time.monotonic())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("auto mode step failed")
            await asyncio.sleep(AUTO_INTERVAL_S)

    async def auto_step(self, now_s: float) -> None:
        if not self.auto:
            return
        frac = used_fraction(self.fleet.probe.sample_host())
        if frac is None:
            return
        for name in list(self.auto):
            if name not in self.fleet.engines:
                del self.auto[name]
                continue
            if name in self._busy or self.fleet.get(name).state != EngineState.READY:
                # No switch can start now (a restart, a crash, a switch under way). Stepping anyway
                # would record a switch that never happened: the policy would believe the engine
                # in the new mode and, with the pressure unchanged, never switch it. It looks again
                # on its next pass, once the engine can switch.
                continue
            new_state, decision = step(self.auto[name], frac, now_s, self.policy)
            if decision is not None and decision.to_mode != Mode.AGGRESSIVE:
                queued = self._queued(name)
                if queued:
                    # A switch restarts the engine: short of the aggressive level (memory about to
                    # run out) it waits for the queue at its door to drain rather than take the
                    # engine away at a peak. The state is kept, so the next sample decides again.
                    if name not in self._deferred:
                        self._deferred.add(name)
                        log.warning(
                            "auto mode: %s memory at %.0f%% asks for %s; waiting: %d requests queued at the gateway",
                            name,
                            frac * 100,
                            decision.to_mode,
                            queued,
                        )
                    continue
            self._deferred.discard(name)
            self.auto[name] = new_state
            if decision is None:
                continue
            log.warning(
                "auto mode: %s memory at %.0f%%: %s -> %s", name, frac * 100, decision.from_mode, decision.to_mode
            )
            why = (
                f"host memory {frac:.0%} of total (balanced above {self.policy.balanced_above:.0%}, "
                f"aggressive above {self.policy.aggressive_above:.0%})"
            )
            asyncio.create_task(self._auto_apply(name, decision.to_mode, why))

    def _queued(self, name: str) -> int:
        group = self.gateway.group_of(name) if self.gateway is not None else None
        return group.admission.queued if group is not None else 0

    async def _auto_apply(self, name: str, mode: Mode, reason: str | None = None) -> None:
        try:
            await self.set_mode(name, mode.value, actor="llmconsole", automatic=True, reason=reason)
        except (ApplyFailed, ApplyRefused, EngineBusy, ModeError) as e:
            log.warning("auto mode switch of %s to %s did not happen: %s", name, mode, e)
            # The policy took the switch as made: its state goes back to the mode the engine runs,
            # keeping the switch's time, so it tries again after an interval rather than never.
            state = self.auto.get(name)
            if state is not None and name in self.fleet.engines:
                now = mode_of(self.fleet.get(name).spec, self.device_of(name))
                self.auto[name] = PolicyState(Mode(now) if now else Mode.PERFORMANCE, state.last_switch_s)
