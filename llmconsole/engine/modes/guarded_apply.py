"""A guarded apply: move a serving engine to a new config, or leave it on the old one.

Steps: validate the new spec (the planner's fit check, beside the host's other engines), drain the engine (its gateway group
sends it nothing new, serving through the group's other ready engines or, with none, holding
arrivals in its queue, and the engine's requests in flight finish, so the restart cuts none),
restart on the new spec, wait for ready, send a smoke request, then give the engine back to its
group and record the change. If any step after the restart fails, the engine goes back to the
config it ran before, rejoins once that is ready again, and the caller gets ApplyFailed with the reason.
A refusal before the restart (ApplyRefused) changes nothing.

A config that never comes up is also what the fleet's own automatic rollback watches for; when
that rollback has already moved the engine back, the apply waits for it instead of restarting
the engine a second time.

Every apply is an action in the store: written before the restart with both config ids,
finished with applied / refused / rolled_back (and the reason).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from llmconsole.engine.audit import AuditStore
from llmconsole.engine.plan.validate import ConfigDoesNotFit
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.status import EngineState

if TYPE_CHECKING:
    from llmconsole.engine.fleet import Fleet
    from llmconsole.engine.supervisor import EngineSupervisor

log = logging.getLogger(__name__)

_POLL_S = 0.25
_AUTO_ROLLBACK_GRACE_S = 3.0  # how long to let the fleet's own rollback act before acting


class Gate(Protocol):
    """The gateway as an apply needs it: hold one engine out of routing, count what it has in flight."""

    def hold(self, engine: str, held: bool) -> None: ...

    def in_flight(self, engine: str) -> int: ...


class ApplyRefused(ValueError):
    """The apply was refused before anything changed (the config cannot fit, or the engine is
    not serving). `details` holds the numbers where there are any."""

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.details = details or []


class ApplyFailed(RuntimeError):
    """A step after the restart failed; the engine was put back on `restored_config_id`."""

    def __init__(self, reason: str, restored_config_id: str | None, restore_error: str | None = None):
        msg = (
            f"{reason}; rolled back to config {restored_config_id}"
            if restore_error is None
            else f"{reason}; and going back to the previous config failed too: {restore_error}"
        )
        super().__init__(msg)
        self.reason = reason
        self.restored_config_id = restored_config_id
        self.restore_error = restore_error


class _StepFailed(RuntimeError):
    pass


class _MovedAway(_StepFailed):
    """The fleet's own rollback took the engine off the config before the apply saw it fail."""


@dataclass(frozen=True)
class ApplyResult:
    engine: str
    from_config_id: str
    to_config_id: str
    kv_cache_tokens: int | None
    took_s: float
    action_id: int | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _record_begin(
    store: AuditStore | None,
    kind: str,
    name: str,
    actor: str,
    before: EngineSpec,
    after: EngineSpec,
    automatic: bool,
    detail: dict[str, Any] | None,
) -> int | None:
    if store is None:
        return None
    for spec in (before, after):
        store.record_config(spec.config_id, spec.public_dict())
    return store.record_action(
        kind,
        engine=name,
        actor=actor,
        from_config_id=before.config_id,
        to_config_id=after.config_id,
        automatic=automatic,
        detail=detail,
    )


def _record_end(
    store: AuditStore | None, action_id: int | None, outcome: str, detail: dict[str, Any] | None = None
) -> None:
    if store is not None and action_id is not None:
        store.update_action_outcome(action_id, outcome, detail)


async def guarded_apply(
    fleet: Fleet,
    name: str,
    new_spec: EngineSpec,
    *,
    store: AuditStore | None = None,
    gate: Gate | None = None,
    actor: str = "llmconsole",
    kind: str = "apply",
    automatic: bool = False,
    detail: dict[str, Any] | None = None,
    force: bool = False,
    ready_timeout_s: float = 600.0,
    drain_timeout_s: float = 120.0,
) -> ApplyResult:
    """Restart `name` on `new_spec` with a way back. See the module docstring."""
    began = time.monotonic()
    sup = fleet.get(name)
    before = sup.spec
    new_spec = fleet.launch_spec(new_spec)  # what the restart will run, so its config id is known
    if sup.state not in (EngineState.READY, EngineState.UNHEALTHY):
        raise ApplyRefused(f"engine {name} is {sup.state}: a guarded apply needs a serving engine to fall back to")
    if new_spec.config_id == before.config_id:
        return ApplyResult(name, before.config_id, before.config_id, sup.status().kv_cache_tokens, 0.0, None)
    try:
        fleet.enforce_fit(name, new_spec, force)
    except ConfigDoesNotFit as e:
        action_id = _record_begin(store, kind, name, actor, before, new_spec, automatic, detail)
        _record_end(store, action_id, "refused", {"error": str(e)})
        raise ApplyRefused(str(e), e.verdict.details()) from None
    action_id = _record_begin(store, kind, name, actor, before, new_spec, automatic, detail)
    if gate is not None:
        gate.hold(name, True)
    try:
        if gate is not None:
            try:
                await _drain(gate, name, drain_timeout_s)
            except _StepFailed as e:  # nothing was restarted: a refusal, not a rollback
                _record_end(store, action_id, "refused", {"error": str(e)})
                raise ApplyRefused(f"engine {name} was left as it was: {e}") from None
        try:
            await fleet.restart(name, new_spec, force=True)  # checked above
            await _wait_ready(sup, new_spec.config_id, ready_timeout_s)
            await _smoke(sup)
        except (TimeoutError, _StepFailed, OSError, aiohttp.ClientError) as e:
            reason = str(e) or type(e).__name__
            why = _exit_reason(store, name, new_spec.config_id) if isinstance(e, _MovedAway) else None
            if why:
                reason = f"config {new_spec.config_id} did not start: {why}"
            log.warning(
                "apply of %s to %s failed (%s); going back to %s", new_spec.config_id, name, reason, before.config_id
            )
            try:
                restored = await _restore(fleet, sup, name, before, new_spec, ready_timeout_s)
            except Exception as restore_error:
                _record_end(store, action_id, "failed", {"error": reason, "restore_error": str(restore_error)})
                raise ApplyFailed(reason, None, str(restore_error)) from None
            _record_end(store, action_id, "rolled_back", {"error": reason, "restored_config_id": restored})
            raise ApplyFailed(reason, restored) from None
    finally:
        if gate is not None:
            gate.hold(name, False)
    kv = sup.status().kv_cache_tokens
    took = time.monotonic() - began
    _record_end(store, action_id, "applied", {"kv_cache_tokens": kv, "took_s": round(took, 2)})
    return ApplyResult(name, before.config_id, new_spec.config_id, kv, took, action_id)


def _exit_reason(store: AuditStore | None, name: str, config_id: str) -> str | None:
    """Why the last run on `config_id` ended, as the recorder wrote it when the run failed."""
    if store is None:
        return None
    runs = [r for r in store.runs(name, limit=5) if r.config_id == config_id and r.exit_reason]
    return runs[-1].exit_reason if runs else None


async def _drain(gate: Gate, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while gate.in_flight(name) > 0:
        if time.monotonic() > deadline:
            raise _StepFailed(f"{gate.in_flight(name)} requests still in flight after {timeout_s:.0f} s")
        await asyncio.sleep(_POLL_S)


async def _wait_ready(sup: EngineSupervisor, config_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if sup.failed_config is not None and sup.failed_config[0] == config_id:
            # Checked first: the fleet's rollback may already have moved the engine away from it,
            # and the failure reads the same whichever this poll sees.
            raise _StepFailed(f"config {config_id} did not start: {sup.failed_config[1]}")
        if sup.spec.config_id != config_id:
            raise _MovedAway(
                f"engine {sup.name} was moved to config {sup.spec.config_id} meanwhile "
                f"({sup.last_error or 'an automatic rollback'})"
            )
        if sup.state == EngineState.READY:
            return
        if sup.state in (EngineState.FAILED, EngineState.CRASHED, EngineState.STOPPED):
            raise _StepFailed(f"config {config_id} did not start: {sup.last_error or sup.state}")
        if time.monotonic() > deadline:
            raise _StepFailed(f"config {config_id} was not ready within {timeout_s:.0f} s")
        await asyncio.sleep(_POLL_S)


async def _smoke(sup: EngineSupervisor) -> None:
    """One token from the engine itself: ready is /health, this is a request actually served."""
    st = sup.status()
    headers: dict[str, str] = {}
    if sup.spec.api_key is not None:
        headers["Authorization"] = f"Bearer {sup.spec.api_key.get_secret_value()}"
    body = {"model": st.served_model_name, "prompt": "ping", "max_tokens": 1}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with http.post(f"{st.url}/v1/completions", json=body, headers=headers) as r:
            if r.status != 200:
                raise _StepFailed(f"smoke request answered {r.status}: {(await r.text())[:200]}")


async def _restore(
    fleet: Fleet, sup: EngineSupervisor, name: str, before: EngineSpec, failed: EngineSpec, timeout_s: float
) -> str:
    """Put the engine back on `before` (or wait for the fleet's own rollback that already did)."""
    grace_end = time.monotonic() + _AUTO_ROLLBACK_GRACE_S
    while sup.spec.config_id == failed.config_id and sup.state == EngineState.FAILED and time.monotonic() < grace_end:
        await asyncio.sleep(_POLL_S)
    if sup.spec.config_id == failed.config_id:
        await fleet.restart(name, before, force=True)
    target = sup.spec.config_id  # `before`, or what the fleet's rollback chose
    await _wait_ready(sup, target, timeout_s)
    return target
