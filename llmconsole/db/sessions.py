"""Operator sessions: who attached a console to the daemon, from where, and until when."""

from __future__ import annotations

import getpass
import socket

from sqlalchemy import insert, select, update
from sqlmodel import col

from llmconsole.db.database import StorePart, inserted_id, now, one_changed
from llmconsole.db.records import OperatorSession
from llmconsole.db.schema import SessionRow


class Sessions(StorePart):
    def begin_session(
        self, client: str, *, user: str | None = None, host: str | None = None, at: float | None = None
    ) -> int:
        """An operator attached (`client`: "tui", "cli", ...); the id tags their actions."""
        row = {
            "attached_at": now(at),
            "user": user or getpass.getuser(),
            "host": host or socket.gethostname(),
            "client": client,
        }
        with self._write() as conn:
            return inserted_id(conn.execute(insert(SessionRow).values(**row)))

    def end_session(self, session_id: int, *, at: float | None = None) -> None:
        with self._write() as conn:
            r = conn.execute(update(SessionRow).where(col(SessionRow.id) == session_id).values(detached_at=now(at)))
            one_changed(r, "session", session_id)

    def sessions(self, *, since: float | None = None) -> list[OperatorSession]:
        q = select(SessionRow).order_by(col(SessionRow.attached_at), col(SessionRow.id))
        if since is not None:
            q = q.where(col(SessionRow.detached_at).is_(None) | (col(SessionRow.detached_at) >= since))
        with self._read() as conn:
            return [OperatorSession(**r._mapping) for r in conn.execute(q)]

    def session(self, session_id: int) -> OperatorSession | None:
        with self._read() as conn:
            r = conn.execute(select(SessionRow).where(col(SessionRow.id) == session_id)).first()
        return OperatorSession(**r._mapping) if r else None
