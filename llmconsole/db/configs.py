"""Configs and the engine runs that judge them: what rollback chooses from.

A config is stored once, under its config_id, however often it runs. Each run of an engine
process points at its config and carries the verdict on it (pending, known_good, known_bad).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, RowMapping, insert, select, update
from sqlmodel import col

from llmconsole.db.database import StorePart, inserted_id, now, one_changed
from llmconsole.db.records import ConfigHistory, ConfigVersion, EngineRun
from llmconsole.db.schema import ConfigVersionRow, EngineRunRow
from llmconsole.db.scrub import scrub_spec

RUN_OUTCOMES = ("pending", "known_good", "known_bad")


def insert_config(conn: Connection, config_id: str, spec_public: Mapping[str, Any], at: float) -> bool:
    """Store a config in the transaction of `conn` unless it is there already; True if it is new.

    The spec is kept verbatim (a rollback relaunches exactly it), secrets aside: see scrub_spec.
    """
    if not config_id:
        raise ValueError("config_id must not be empty")
    r = conn.exec_driver_sql(
        "INSERT OR IGNORE INTO config_versions (config_id, spec_json, first_seen_at) VALUES (?, ?, ?)",
        (config_id, json.dumps(scrub_spec(spec_public), sort_keys=True, default=str), at),
    )
    return r.rowcount == 1


class Configs(StorePart):
    # --- configs --------------------------------------------------------------------------

    def record_config(self, config_id: str, spec_public: Mapping[str, Any], *, at: float | None = None) -> bool:
        """Remember a config (EngineSpec.public_dict()) under its config_id; True if it is new."""
        with self._write() as conn:
            return insert_config(conn, config_id, spec_public, now(at))

    def set_config_label(self, config_id: str, label: str | None) -> None:
        """Name a config for people ("long context", "safe"); None clears the name."""
        with self._write() as conn:
            r = conn.execute(
                update(ConfigVersionRow).where(col(ConfigVersionRow.config_id) == config_id).values(label=label)
            )
            one_changed(r, "config", config_id)

    def config(self, config_id: str) -> ConfigVersion | None:
        with self._read() as conn:
            r = conn.execute(select(ConfigVersionRow).where(col(ConfigVersionRow.config_id) == config_id)).first()
        return ConfigVersion(**r._mapping) if r else None

    def config_versions(self, engine: str) -> list[ConfigHistory]:
        """Every config `engine` has run, the most recently used first, with its runs' outcomes."""
        q = (
            select(
                EngineRunRow,
                col(ConfigVersionRow.spec_json),
                col(ConfigVersionRow.first_seen_at),
                col(ConfigVersionRow.label),
            )
            .join(ConfigVersionRow, col(ConfigVersionRow.config_id) == col(EngineRunRow.config_id))
            .where(col(EngineRunRow.engine) == engine)
            .order_by(col(EngineRunRow.started_at), col(EngineRunRow.id))
        )
        with self._read() as conn:
            rows = [r._mapping for r in conn.execute(q)]
        by_config: dict[str, list[RowMapping]] = {}
        for r in rows:
            by_config.setdefault(r["config_id"], []).append(r)
        history = []
        for config_id, runs in by_config.items():
            first = runs[0]
            history.append(
                ConfigHistory(
                    config_id=config_id,
                    spec_json=first["spec_json"],
                    first_seen_at=first["first_seen_at"],
                    label=first["label"],
                    run_ids=tuple(r["id"] for r in runs),
                    outcomes=tuple(r["outcome"] for r in runs),
                    first_used_at=first["started_at"],
                    last_used_at=max(r["exited_at"] or r["ready_at"] or r["started_at"] for r in runs),
                    in_use=any(r["exited_at"] is None for r in runs),
                )
            )
        history.sort(key=lambda h: (h.last_used_at, h.run_ids[-1]), reverse=True)
        return history

    def last_known_good(self, engine: str, exclude_config_id: str | None = None) -> ConfigHistory | None:
        """The config to roll back to: the one whose latest verdict is known_good, most recent first.

        A config that was good once and has been judged bad since is not a candidate.
        """
        good_at: dict[str, float] = {}
        for run in self.runs(engine):
            if run.outcome == "known_good":
                good_at[run.config_id] = max(run.started_at, good_at.get(run.config_id, run.started_at))
        candidates = [
            h for h in self.config_versions(engine) if h.config_id != exclude_config_id and h.verdict == "known_good"
        ]
        return max(candidates, key=lambda h: good_at.get(h.config_id, h.first_used_at), default=None)

    # --- runs -----------------------------------------------------------------------------

    def run_started(
        self,
        engine: str,
        config_id: str,
        *,
        pid: int | None = None,
        port: int | None = None,
        session_id: int | None = None,
        spec_public: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        """An engine process was launched; pass `spec_public` to record its config in the same commit."""
        started_at = now(at)
        with self._write() as conn:
            if spec_public is not None:
                insert_config(conn, config_id, spec_public, started_at)
            elif (
                conn.execute(
                    select(col(ConfigVersionRow.config_id)).where(col(ConfigVersionRow.config_id) == config_id)
                ).first()
                is None
            ):
                raise KeyError(f"config {config_id!r} is not in the store: record_config() it first")
            return inserted_id(
                conn.execute(
                    insert(EngineRunRow).values(
                        engine=engine,
                        config_id=config_id,
                        pid=pid,
                        port=port,
                        session_id=session_id,
                        started_at=started_at,
                        outcome="pending",
                    )
                )
            )

    def run_ready(
        self,
        run_id: int,
        *,
        kv_cache_tokens: int | None = None,
        max_concurrency: float | None = None,
        at: float | None = None,
    ) -> None:
        with self._write() as conn:
            r = conn.execute(
                update(EngineRunRow)
                .where(col(EngineRunRow.id) == run_id)
                .values(ready_at=now(at), kv_cache_tokens=kv_cache_tokens, max_concurrency=max_concurrency)
            )
            one_changed(r, "engine run", run_id)

    def run_exited(
        self, run_id: int, exit_code: int | None, reason: str | None = None, *, at: float | None = None
    ) -> None:
        with self._write() as conn:
            r = conn.execute(
                update(EngineRunRow)
                .where(col(EngineRunRow.id) == run_id)
                .values(exited_at=now(at), exit_code=exit_code, exit_reason=reason)
            )
            one_changed(r, "engine run", run_id)

    def mark_run_outcome(self, run_id: int, outcome: str) -> None:
        """Judge a run's config: known_good once it served, known_bad when it could not."""
        if outcome not in RUN_OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(RUN_OUTCOMES)}, not {outcome!r}")
        with self._write() as conn:
            r = conn.execute(update(EngineRunRow).where(col(EngineRunRow.id) == run_id).values(outcome=outcome))
            one_changed(r, "engine run", run_id)

    def run(self, run_id: int) -> EngineRun | None:
        with self._read() as conn:
            r = conn.execute(select(EngineRunRow).where(col(EngineRunRow.id) == run_id)).first()
        return EngineRun(**r._mapping) if r else None

    def runs(
        self, engine: str | None = None, *, since: float | None = None, limit: int | None = None
    ) -> list[EngineRun]:
        """Runs oldest first; `limit` keeps the latest ones. `since` keeps runs still alive at it."""
        q = select(EngineRunRow).order_by(col(EngineRunRow.started_at).desc(), col(EngineRunRow.id).desc())
        if engine is not None:
            q = q.where(col(EngineRunRow.engine) == engine)
        if since is not None:
            q = q.where(col(EngineRunRow.exited_at).is_(None) | (col(EngineRunRow.exited_at) >= since))
        if limit is not None:
            q = q.limit(limit)
        with self._read() as conn:
            return [EngineRun(**r._mapping) for r in conn.execute(q)][::-1]
