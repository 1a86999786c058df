"""Alert episodes: fired at one time, resolved (or still firing) at another."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert, select, update
from sqlmodel import col

from llmconsole.db.database import StorePart, inserted_id, now, one_changed, to_json
from llmconsole.db.records import Alert
from llmconsole.db.schema import AlertRow


class Alerts(StorePart):
    def alert_fired(
        self,
        rule: str,
        severity: str,
        *,
        engine: str | None = None,
        detail: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        with self._write() as conn:
            return inserted_id(
                conn.execute(
                    insert(AlertRow).values(
                        at=now(at),
                        engine=engine,
                        rule=rule,
                        severity=severity,
                        state="firing",
                        detail_json=to_json(detail),
                    )
                )
            )

    def alert_resolved(self, alert_id: int, *, at: float | None = None) -> None:
        with self._write() as conn:
            r = conn.execute(
                update(AlertRow).where(col(AlertRow.id) == alert_id).values(state="resolved", resolved_at=now(at))
            )
            one_changed(r, "alert", alert_id)

    def alerts(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        engine: str | None = None,
        firing_only: bool = False,
    ) -> list[Alert]:
        """Alerts oldest first; `since` keeps those that fired or were still firing after it."""
        q = select(AlertRow).order_by(col(AlertRow.at), col(AlertRow.id))
        if since is not None:
            q = q.where(
                (col(AlertRow.at) >= since) | col(AlertRow.resolved_at).is_(None) | (col(AlertRow.resolved_at) >= since)
            )
        if until is not None:
            q = q.where(col(AlertRow.at) <= until)
        if engine is not None:
            q = q.where(col(AlertRow.engine) == engine)
        if firing_only:
            q = q.where(col(AlertRow.state) == "firing")
        with self._read() as conn:
            return [Alert(**r._mapping) for r in conn.execute(q)]
