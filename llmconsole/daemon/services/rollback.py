"""Rollback to a stored config version, and the audit log every change goes through.

Every action is committed to the store before it is carried out, and its outcome after, so a
daemon that dies half-way leaves a record that says what it was doing; the next daemon closes
each such record as `interrupted`, with what it found of the engine (close_interrupted). A
rollback drains the engine through the gateway first, as `engine restart` does (drained), so
the restart cuts no request in flight. A config the supervisor
gives up on (a crash loop, or a start that never came up) is rolled back here automatically to
the engine's last known-good config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from llmconsole.daemon.context import DaemonContext
from llmconsole.db import Store
from llmconsole.db.versions import RollbackError, choose_target, spec_from_version
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.supervisor import ChangeEnded, EngineSupervisor, PendingChange

log = logging.getLogger(__name__)


class ActionLog:
    """Writes an action before it happens and its outcome after; a daemon with no store (unit
    tests of the API) logs nothing."""

    def __init__(self, store: Store | None):
        self.store = store

    def begin(
        self,
        kind: str,
        engine: str | None,
        actor: str,
        *,
        session_id: int | None = None,
        from_spec: EngineSpec | None = None,
        to_spec: EngineSpec | None = None,
        automatic: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> int | None:
        if self.store is None:
            return None
        for spec in (from_spec, to_spec):  # an action names configs the store must hold
            if spec is not None:
                self.store.record_config(spec.config_id, spec.public_dict())
        return self.store.record_action(
            kind,
            engine=engine,
            actor=actor,
            session_id=session_id,
            from_config_id=from_spec.config_id if from_spec else None,
            to_config_id=to_spec.config_id if to_spec else None,
            automatic=automatic,
            detail=detail,
        )

    def end(self, action_id: int | None, outcome: str, detail: dict[str, Any] | None = None) -> None:
        if self.store is not None and action_id is not None:
            self.store.update_action_outcome(action_id, outcome, detail)

    @contextlib.contextmanager
    def change(
        self,
        kind: str,
        engine: str | None,
        actor: str,
        *,
        before: dict[str, Any],
        session_id: int | None = None,
        automatic: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """An action that is no config change (a window, a group, a setting): recorded with what
        it changes `from` before the block runs; the block puts what it changed `to` in the dict
        it is given. Bad input (ValueError, LookupError) ends it refused, anything else failed."""
        action_id = self.begin(
            kind, engine, actor, session_id=session_id, automatic=automatic, detail={**(detail or {}), "from": before}
        )
        outcome: dict[str, Any] = {}
        try:
            yield outcome
        except (ValueError, LookupError) as e:
            self.end(action_id, "refused", {"error": str(e)})
            raise
        except Exception as e:
            self.end(action_id, "failed", {"error": f"{type(e).__name__}: {e}"})
            raise
        self.end(action_id, "done", outcome)


@contextlib.asynccontextmanager
async def drained(ctx: DaemonContext, name: str, drain_timeout_s: float | None) -> AsyncIterator[None]:
    """Around a stop, restart or rollback: hold the engine at the gateway until its requests in
    flight finish (within `drain_timeout_s`, default the supervision policy's), then let the
    action run (see GatewayService.held): a planned restart cuts no stream."""
    if ctx.gateway is None or name not in ctx.fleet.engines:
        yield
        return
    timeout = ctx.fleet.policy.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
    async with ctx.gateway.held(name, timeout):
        yield


async def rollback(
    ctx: DaemonContext,
    name: str,
    *,
    actor: str,
    to_config_id: str | None = None,
    automatic: bool = False,
    session_id: int | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Restart `name` on a stored version. Raises RollbackError (nothing changed) when there is
    no such version or it cannot run any more."""
    store = ctx.need_store()
    sup = ctx.fleet.get(name)
    current = sup.spec
    actions = ActionLog(store)
    try:
        target = choose_target(store, name, current.config_id, to_config_id)
        # A version stored before CPU engines were always given a KV size launches with one.
        spec = ctx.fleet.launch_spec(spec_from_version(target, current, ctx.fleet.secret_env(name)))
    except (RollbackError, ValueError) as e:
        action_id = actions.begin(
            "rollback",
            name,
            actor,
            session_id=session_id,
            automatic=automatic,
            from_spec=current,
            detail={"reason": reason},
        )
        actions.end(action_id, "refused", {"error": str(e)})
        raise
    action_id = actions.begin(
        "rollback",
        name,
        actor,
        session_id=session_id,
        automatic=automatic,
        from_spec=current,
        to_spec=spec,
        detail={"reason": reason} if reason else None,
    )
    try:
        async with drained(ctx, name, None):
            # Ended `applied` once the target serves (or failed): see on_change_ended.
            await ctx.fleet.restart(name, spec, action_id=action_id, done_outcome="applied")
    except Exception as e:
        actions.end(action_id, "failed", {"error": str(e)})
        raise
    log.info(
        "rolled %s back from %s to %s (%s)",
        name,
        current.config_id,
        target.config_id,
        "automatic" if automatic else actor,
    )
    return {"engine": name, "from_config_id": current.config_id, "to_config_id": spec.config_id, "action_id": action_id}


INTERRUPTED = "interrupted"


def on_change_ended(store: Store) -> ChangeEnded:
    """The fleet's listener for restarts asked for by an action (a restart, a rollback): the
    action ends when the target config serves, not when its process is launched, so one the
    daemon dies during is left unfinished, and the next daemon closes it as interrupted."""
    actions = ActionLog(store)

    def listener(sup: EngineSupervisor, change: PendingChange, outcome: str, reason: str | None) -> None:
        if change.action_id is None:
            return
        if outcome == "done":
            actions.end(change.action_id, change.done_outcome)
        else:
            actions.end(change.action_id, outcome, {"error": reason})

    return listener


def close_interrupted(store: Store, found: Mapping[str, str]) -> list[str]:
    """At daemon start: end every action a dead daemon left with no outcome as `interrupted`,
    with what this daemon found of its engine (`found`: Fleet.found, e.g. "engine running on
    config X (the target)"). Returns a line per action closed, for the daemon log."""
    lines = []
    for a in store.unfinished_actions():
        what = found.get(a.engine or "", "the daemon stopped before the action ended")
        if a.engine is not None and a.engine not in found:
            what = f"engine {a.engine} is no longer known to the daemon"
        store.update_action_outcome(a.id, INTERRUPTED, {"found": what})
        lines.append(f"action {a.id} ({a.kind} of {a.engine or 'the daemon'}) was interrupted; found: {what}")
    return lines


def on_config_failed(ctx: DaemonContext) -> Callable[[str], None]:
    """The fleet's listener for configs the supervisor gave up on (a crash loop, or a start that
    never came up): roll the engine back to its last known-good config, if it has one."""
    store = ctx.need_store()

    def listener(name: str) -> None:
        async def go() -> None:
            sup = ctx.fleet.get(name)
            reason = sup.last_error
            try:
                choose_target(store, name, sup.spec.config_id)
            except RollbackError as e:  # a new engine's first config: nothing to go back to
                log.warning("engine %s failed on config %s and stays down: %s", name, sup.spec.config_id, e)
                return
            try:
                await rollback(
                    ctx,
                    name,
                    actor="llmconsole",
                    automatic=True,
                    reason=f"config {sup.spec.config_id} failed: {reason}",
                )
            except Exception:
                log.exception("automatic rollback of %s failed", name)

        # The supervisor calls this from its own task, holding its lock: roll back afterwards.
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(go()))

    return listener
