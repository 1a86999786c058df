"""The audit log: every action an operator or the daemon took, logged before it is carried out."""

from __future__ import annotations

import getpass
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert, select, update
from sqlmodel import col

from llmconsole.db.database import StorePart, inserted_id, now, to_json
from llmconsole.db.records import Action
from llmconsole.db.schema import ActionRow


class Actions(StorePart):
    def record_action(
        self,
        kind: str,
        *,
        engine: str | None = None,
        actor: str | None = None,
        session_id: int | None = None,
        from_config_id: str | None = None,
        to_config_id: str | None = None,
        outcome: str = "pending",
        automatic: bool = False,
        detail: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        """Log an action before carrying it out; its id is returned once the record is durable."""
        if actor is None:
            actor = "automatic" if automatic else getpass.getuser()
        with self._write() as conn:
            return inserted_id(
                conn.execute(
                    insert(ActionRow).values(
                        at=now(at),
                        actor=actor,
                        session_id=session_id,
                        engine=engine,
                        kind=kind,
                        from_config_id=from_config_id,
                        to_config_id=to_config_id,
                        outcome=outcome,
                        automatic=automatic,
                        detail_json=to_json(detail),
                    )
                )
            )

    def update_action_outcome(self, action_id: int, outcome: str, detail: Mapping[str, Any] | None = None) -> None:
        """Say how an action ended; `detail` keys are merged over those recorded with it."""
        with self._write() as conn:
            old = conn.execute(select(col(ActionRow.detail_json)).where(col(ActionRow.id) == action_id)).scalar()
            if old is None:
                raise KeyError(f"no action {action_id!r} in the store")
            merged = {**json.loads(old), **(detail or {})}
            conn.execute(
                update(ActionRow)
                .where(col(ActionRow.id) == action_id)
                .values(outcome=outcome, detail_json=to_json(merged))
            )

    def unfinished_actions(self) -> list[Action]:
        """Actions logged as begun whose outcome was never written (the daemon died meanwhile),
        oldest first."""
        q = select(ActionRow).where(col(ActionRow.outcome) == "pending").order_by(col(ActionRow.id))
        with self._read() as conn:
            return [Action(**r._mapping) for r in conn.execute(q)]

    def action(self, action_id: int) -> Action | None:
        with self._read() as conn:
            r = conn.execute(select(ActionRow).where(col(ActionRow.id) == action_id)).first()
        return Action(**r._mapping) if r else None

    def actions(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        session_id: int | None = None,
        engine: str | None = None,
    ) -> list[Action]:
        """The audit log, oldest first."""
        q = select(ActionRow).order_by(col(ActionRow.at), col(ActionRow.id))
        if since is not None:
            q = q.where(col(ActionRow.at) >= since)
        if until is not None:
            q = q.where(col(ActionRow.at) <= until)
        if session_id is not None:
            q = q.where(col(ActionRow.session_id) == session_id)
        if engine is not None:
            q = q.where(col(ActionRow.engine) == engine)
        with self._read() as conn:
            return [Action(**r._mapping) for r in conn.execute(q)]
