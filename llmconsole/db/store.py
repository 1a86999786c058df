"""The store: everything the daemon remembers, in one SQLite file.

Threads: one `Store` is shared by the daemon's asyncio thread and its recorder thread. Every
call checks a connection out of SQLAlchemy's pool for itself (a connection is never used by
two threads at once), and one lock per Store serializes the writes of this process, so a
writer waits on the lock rather than on SQLite's busy handler. WAL lets readers run while a
write is in progress. Other processes (the CLI exporting while the daemon records) meet the
busy timeout instead.

Durability: the connection runs WAL with synchronous=NORMAL. In WAL mode NORMAL cannot corrupt
the file and loses nothing committed when a process dies (the WAL is already in the OS); only
power loss can drop the last commits. That is right for samples, which arrive every second
and would otherwise pay an fsync each. Records a person acts on (sessions, configs, runs,
actions, alerts, sweeps) commit with synchronous=FULL, so once a call returns they survive
power loss too, which is what lets the daemon report an effect only after its record is safe.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sqlite3
import threading
import time
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from sqlalchemy import Connection, create_engine, event, insert, select, update
from sqlalchemy.pool import QueuePool

from llmconsole.db import compaction, guard, migrations
from llmconsole.db.compaction import Retention
from llmconsole.db.guard import StoreError
from llmconsole.db.records import (
    Action, Alert, CompactionResult, ConfigHistory, ConfigVersion, EngineRun, MetricSample,
    OperatorSession, Sweep, SweepPoint, WindowSample,
)
from llmconsole.db.schema import (
    METRIC_FIELDS, SWEEP_FIGURES, WINDOW_FIELDS, ActionRow, AlertRow, ConfigVersionRow,
    EngineRunRow, MetricSampleRow, SessionRow, SweepPointRow, SweepRow, WindowTraceRow,
)
from llmconsole.db.scrub import scrub

RUN_OUTCOMES = ("pending", "known_good", "known_bad")
SWEEP_STATUSES = ("pending", "running", "done", "failed", "cancelled")

_SAMPLE_COLUMNS = ("engine", "at_s", "resolution_s", *METRIC_FIELDS)
_WINDOW_COLUMNS = ("group_name", "at_s", *WINDOW_FIELDS)
_sample_values = attrgetter(*_SAMPLE_COLUMNS)
_window_values = attrgetter(*_WINDOW_COLUMNS)


def _json(value: Any) -> str:
    return json.dumps(scrub(value if value is not None else {}), sort_keys=True, default=str)


def _now(at: float | None) -> float:
    return time.time() if at is None else float(at)


class Store:
    """The daemon's memory. Open with `Store.open(path)`; close with `close()` or `with`."""

    def __init__(self, path: Path, retention: Retention, busy_timeout_s: float, upgraded_from: int | None):
        self.path = path
        self.retention = retention
        self.schema_version = migrations.SCHEMA_VERSION
        self.upgraded_from = upgraded_from  # the file's version before this open upgraded it
        self._write_lock = threading.Lock()
        # Connections are made by hand so that no character of the path is read as URL syntax.
        self._engine = create_engine(
            "sqlite://",
            creator=lambda: sqlite3.connect(path, check_same_thread=False, timeout=busy_timeout_s),
            poolclass=QueuePool, pool_size=4, max_overflow=8,
        )
        busy_ms = int(busy_timeout_s * 1000)

        @event.listens_for(self._engine, "connect")
        def _on_connect(dbapi_conn, _record):
            # pysqlite's own transaction handling begins lazily and skips PRAGMAs; we say BEGIN
            # ourselves (below) so every call is exactly one transaction.
            dbapi_conn.isolation_level = None
            for pragma in (f"busy_timeout = {busy_ms}", "synchronous = NORMAL", "foreign_keys = ON"):
                dbapi_conn.execute(f"PRAGMA {pragma}")

        @event.listens_for(self._engine, "begin")
        def _on_begin(conn):
            # A write takes the lock up front: a deferred transaction that reads and then writes
            # can fail with SQLITE_BUSY without waiting if another process wrote in between.
            write = conn.get_execution_options().get("llmconsole_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path | None = None,
        *,
        retention: Retention = Retention(),
        busy_timeout_s: float = 5.0,
    ) -> "Store":
        """Open (creating or upgrading in place) the database at `path`, by default Paths.database.

        Raises StoreError, having written nothing, when the file is not ours, is damaged, or
        comes from a newer llmconsole.
        """
        if path is None:
            from llmconsole.paths import resolve

            path = resolve().database
        path = Path(path).expanduser().absolute()
        state = guard.inspect(path)
        if not state.exists:
            guard.create_private(path)
            guard.inspect(path)  # another process may have made the file between our two looks
        elif state.schema_version > 0 and os.stat(path).st_mode & 0o077:
            os.chmod(path, 0o600)  # ours, but made looser by hand or by an old copy

        raw = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_s)
        try:
            mode = raw.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"cannot use the llmconsole database {path}: SQLite would not "
                                 f"switch it to WAL mode (it stays in {mode!r} mode)")
            before, after = migrations.upgrade(raw)
        except migrations.NewerSchemaError as e:
            raise StoreError(
                f"cannot use the llmconsole database {path}: it was written by a newer llmconsole "
                f"(schema version {e.version}; this one knows up to {migrations.SCHEMA_VERSION}). "
                f"{guard.start_fresh_hint(path)}"
            ) from e
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot use the llmconsole database {path}: {e}. "
                             f"{guard.start_fresh_hint(path)}") from e
        finally:
            raw.close()
        upgraded_from = before if 0 < before < after else None
        return cls(path, retention, busy_timeout_s, upgraded_from)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- transactions ---------------------------------------------------------------------

    @contextmanager
    def _write(self, durable: bool = True) -> Iterator[Connection]:
        with self._write_lock, self._engine.connect() as conn:
            raw = conn.connection.driver_connection
            if durable:
                raw.execute("PRAGMA synchronous = FULL")  # set between transactions, as SQLite asks
            try:
                with conn.execution_options(llmconsole_write=True).begin():
                    yield conn
            finally:
                if durable:
                    raw.execute("PRAGMA synchronous = NORMAL")

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._engine.connect() as conn:
            yield conn

    @staticmethod
    def _one_changed(result, what: str, key: Any) -> None:
        if result.rowcount != 1:
            raise KeyError(f"no {what} {key!r} in the store")

    # --- sessions -------------------------------------------------------------------------

    def begin_session(self, client: str, *, user: str | None = None, host: str | None = None,
                      at: float | None = None) -> int:
        """An operator attached (`client`: "tui", "cli", ...); the id tags their actions."""
        row = {"attached_at": _now(at), "user": user or getpass.getuser(),
               "host": host or socket.gethostname(), "client": client}
        with self._write() as conn:
            return conn.execute(insert(SessionRow).values(**row)).inserted_primary_key[0]

    def end_session(self, session_id: int, *, at: float | None = None) -> None:
        with self._write() as conn:
            r = conn.execute(update(SessionRow).where(SessionRow.id == session_id)
                             .values(detached_at=_now(at)))
            self._one_changed(r, "session", session_id)

    def sessions(self, *, since: float | None = None) -> list[OperatorSession]:
        q = select(SessionRow).order_by(SessionRow.attached_at, SessionRow.id)
        if since is not None:
            q = q.where((SessionRow.detached_at.is_(None)) | (SessionRow.detached_at >= since))
        with self._read() as conn:
            return [OperatorSession(**r._mapping) for r in conn.execute(q)]

    def session(self, session_id: int) -> OperatorSession | None:
        with self._read() as conn:
            r = conn.execute(select(SessionRow).where(SessionRow.id == session_id)).first()
        return OperatorSession(**r._mapping) if r else None

    # --- configs --------------------------------------------------------------------------

    def record_config(self, config_id: str, spec_public: Mapping[str, Any], *,
                      at: float | None = None) -> bool:
        """Remember a config (EngineSpec.public_dict()) under its config_id; True if it is new."""
        with self._write() as conn:
            return self._record_config(conn, config_id, spec_public, _now(at))

    @staticmethod
    def _record_config(conn: Connection, config_id: str, spec_public: Mapping[str, Any], at: float) -> bool:
        if not config_id:
            raise ValueError("config_id must not be empty")
        r = conn.exec_driver_sql(
            "INSERT OR IGNORE INTO config_versions (config_id, spec_json, first_seen_at) VALUES (?, ?, ?)",
            (config_id, _json(dict(spec_public)), at),
        )
        return r.rowcount == 1

    def set_config_label(self, config_id: str, label: str | None) -> None:
        """Name a config for people ("long context", "safe"); None clears the name."""
        with self._write() as conn:
            r = conn.execute(update(ConfigVersionRow).where(ConfigVersionRow.config_id == config_id)
                             .values(label=label))
            self._one_changed(r, "config", config_id)

    def config(self, config_id: str) -> ConfigVersion | None:
        with self._read() as conn:
            r = conn.execute(select(ConfigVersionRow).where(ConfigVersionRow.config_id == config_id)).first()
        return ConfigVersion(**r._mapping) if r else None

    def config_versions(self, engine: str) -> list[ConfigHistory]:
        """Every config `engine` has run, the most recently used first, with its runs' outcomes."""
        q = (select(EngineRunRow, ConfigVersionRow.spec_json, ConfigVersionRow.first_seen_at,
                    ConfigVersionRow.label)
             .join(ConfigVersionRow, ConfigVersionRow.config_id == EngineRunRow.config_id)
             .where(EngineRunRow.engine == engine)
             .order_by(EngineRunRow.started_at, EngineRunRow.id))
        with self._read() as conn:
            rows = [r._mapping for r in conn.execute(q)]
        by_config: dict[str, list[Mapping[str, Any]]] = {}
        for r in rows:
            by_config.setdefault(r["config_id"], []).append(r)
        history = []
        for config_id, runs in by_config.items():
            first = runs[0]
            history.append(ConfigHistory(
                config_id=config_id,
                spec_json=first["spec_json"],
                first_seen_at=first["first_seen_at"],
                label=first["label"],
                run_ids=tuple(r["id"] for r in runs),
                outcomes=tuple(r["outcome"] for r in runs),
                first_used_at=first["started_at"],
                last_used_at=max(r["exited_at"] or r["ready_at"] or r["started_at"] for r in runs),
                in_use=any(r["exited_at"] is None for r in runs),
            ))
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
        candidates = [h for h in self.config_versions(engine)
                      if h.config_id != exclude_config_id and h.verdict == "known_good"]
        return max(candidates, key=lambda h: good_at.get(h.config_id, h.first_used_at), default=None)

    # --- runs -----------------------------------------------------------------------------

    def run_started(self, engine: str, config_id: str, *, pid: int | None = None,
                    port: int | None = None, session_id: int | None = None,
                    spec_public: Mapping[str, Any] | None = None, at: float | None = None) -> int:
        """An engine process was launched; pass `spec_public` to record its config in the same commit."""
        at = _now(at)
        with self._write() as conn:
            if spec_public is not None:
                self._record_config(conn, config_id, spec_public, at)
            elif conn.execute(select(ConfigVersionRow.config_id)
                              .where(ConfigVersionRow.config_id == config_id)).first() is None:
                raise KeyError(f"config {config_id!r} is not in the store: record_config() it first")
            return conn.execute(insert(EngineRunRow).values(
                engine=engine, config_id=config_id, pid=pid, port=port, session_id=session_id,
                started_at=at, outcome="pending",
            )).inserted_primary_key[0]

    def run_ready(self, run_id: int, *, kv_cache_tokens: int | None = None,
                  max_concurrency: float | None = None, at: float | None = None) -> None:
        with self._write() as conn:
            r = conn.execute(update(EngineRunRow).where(EngineRunRow.id == run_id).values(
                ready_at=_now(at), kv_cache_tokens=kv_cache_tokens, max_concurrency=max_concurrency))
            self._one_changed(r, "engine run", run_id)

    def run_exited(self, run_id: int, exit_code: int | None, reason: str | None = None, *,
                   at: float | None = None) -> None:
        with self._write() as conn:
            r = conn.execute(update(EngineRunRow).where(EngineRunRow.id == run_id).values(
                exited_at=_now(at), exit_code=exit_code, exit_reason=reason))
            self._one_changed(r, "engine run", run_id)

    def mark_run_outcome(self, run_id: int, outcome: str) -> None:
        """Judge a run's config: known_good once it served, known_bad when it could not."""
        if outcome not in RUN_OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(RUN_OUTCOMES)}, not {outcome!r}")
        with self._write() as conn:
            r = conn.execute(update(EngineRunRow).where(EngineRunRow.id == run_id).values(outcome=outcome))
            self._one_changed(r, "engine run", run_id)

    def run(self, run_id: int) -> EngineRun | None:
        with self._read() as conn:
            r = conn.execute(select(EngineRunRow).where(EngineRunRow.id == run_id)).first()
        return EngineRun(**r._mapping) if r else None

    def runs(self, engine: str | None = None, *, since: float | None = None,
             limit: int | None = None) -> list[EngineRun]:
        """Runs oldest first; `limit` keeps the latest ones. `since` keeps runs still alive at it."""
        q = select(EngineRunRow).order_by(EngineRunRow.started_at.desc(), EngineRunRow.id.desc())
        if engine is not None:
            q = q.where(EngineRunRow.engine == engine)
        if since is not None:
            q = q.where((EngineRunRow.exited_at.is_(None)) | (EngineRunRow.exited_at >= since))
        if limit is not None:
            q = q.limit(limit)
        with self._read() as conn:
            return [EngineRun(**r._mapping) for r in conn.execute(q)][::-1]

    # --- actions --------------------------------------------------------------------------

    def record_action(self, kind: str, *, engine: str | None = None, actor: str | None = None,
                      session_id: int | None = None, from_config_id: str | None = None,
                      to_config_id: str | None = None, outcome: str = "pending",
                      automatic: bool = False, detail: Mapping[str, Any] | None = None,
                      at: float | None = None) -> int:
        """Log an action before carrying it out; its id is returned once the record is durable."""
        if actor is None:
            actor = "automatic" if automatic else getpass.getuser()
        with self._write() as conn:
            return conn.execute(insert(ActionRow).values(
                at=_now(at), actor=actor, session_id=session_id, engine=engine, kind=kind,
                from_config_id=from_config_id, to_config_id=to_config_id, outcome=outcome,
                automatic=automatic, detail_json=_json(detail),
            )).inserted_primary_key[0]

    def update_action_outcome(self, action_id: int, outcome: str,
                              detail: Mapping[str, Any] | None = None) -> None:
        """Say how an action ended; `detail` keys are merged over those recorded with it."""
        with self._write() as conn:
            old = conn.execute(select(ActionRow.detail_json).where(ActionRow.id == action_id)).scalar()
            if old is None:
                raise KeyError(f"no action {action_id!r} in the store")
            merged = {**json.loads(old), **(detail or {})}
            conn.execute(update(ActionRow).where(ActionRow.id == action_id)
                         .values(outcome=outcome, detail_json=_json(merged)))

    def action(self, action_id: int) -> Action | None:
        with self._read() as conn:
            r = conn.execute(select(ActionRow).where(ActionRow.id == action_id)).first()
        return Action(**r._mapping) if r else None

    def actions(self, *, since: float | None = None, until: float | None = None,
                session_id: int | None = None, engine: str | None = None) -> list[Action]:
        """The audit log, oldest first."""
        q = select(ActionRow).order_by(ActionRow.at, ActionRow.id)
        if since is not None:
            q = q.where(ActionRow.at >= since)
        if until is not None:
            q = q.where(ActionRow.at <= until)
        if session_id is not None:
            q = q.where(ActionRow.session_id == session_id)
        if engine is not None:
            q = q.where(ActionRow.engine == engine)
        with self._read() as conn:
            return [Action(**r._mapping) for r in conn.execute(q)]

    # --- alerts ---------------------------------------------------------------------------

    def alert_fired(self, rule: str, severity: str, *, engine: str | None = None,
                    detail: Mapping[str, Any] | None = None, at: float | None = None) -> int:
        with self._write() as conn:
            return conn.execute(insert(AlertRow).values(
                at=_now(at), engine=engine, rule=rule, severity=severity, state="firing",
                detail_json=_json(detail),
            )).inserted_primary_key[0]

    def alert_resolved(self, alert_id: int, *, at: float | None = None) -> None:
        with self._write() as conn:
            r = conn.execute(update(AlertRow).where(AlertRow.id == alert_id)
                             .values(state="resolved", resolved_at=_now(at)))
            self._one_changed(r, "alert", alert_id)

    def alerts(self, *, since: float | None = None, until: float | None = None,
               engine: str | None = None, firing_only: bool = False) -> list[Alert]:
        """Alerts oldest first; `since` keeps those that fired or were still firing after it."""
        q = select(AlertRow).order_by(AlertRow.at, AlertRow.id)
        if since is not None:
            q = q.where((AlertRow.at >= since) | (AlertRow.resolved_at.is_(None))
                        | (AlertRow.resolved_at >= since))
        if until is not None:
            q = q.where(AlertRow.at <= until)
        if engine is not None:
            q = q.where(AlertRow.engine == engine)
        if firing_only:
            q = q.where(AlertRow.state == "firing")
        with self._read() as conn:
            return [Alert(**r._mapping) for r in conn.execute(q)]

    # --- series ---------------------------------------------------------------------------

    def add_metric_samples(self, rows: Iterable[MetricSample | Mapping[str, Any]]) -> int:
        """Insert a batch of samples in one transaction; a repeated (engine, at_s) replaces."""
        values = [_row_values(r, MetricSample, _sample_values, _SAMPLE_COLUMNS) for r in rows]
        if not values:
            return 0
        names = ", ".join(_SAMPLE_COLUMNS)
        marks = ", ".join("?" * len(_SAMPLE_COLUMNS))
        with self._write(durable=False) as conn:
            conn.connection.driver_connection.executemany(
                f"INSERT OR REPLACE INTO metric_samples ({names}) VALUES ({marks})", values)
        return len(values)

    def metric_samples(self, engine: str | None = None, *, since_s: float | None = None,
                       until_s: float | None = None) -> list[MetricSample]:
        q = select(MetricSampleRow).order_by(MetricSampleRow.engine, MetricSampleRow.at_s)
        if engine is not None:
            q = q.where(MetricSampleRow.engine == engine)
        if since_s is not None:
            q = q.where(MetricSampleRow.at_s >= since_s)
        if until_s is not None:
            q = q.where(MetricSampleRow.at_s <= until_s)
        with self._read() as conn:
            return [MetricSample(**r._mapping) for r in conn.execute(q)]

    def add_window_trace(self, rows: Iterable[WindowSample | Mapping[str, Any]]) -> int:
        values = [_row_values(r, WindowSample, _window_values, _WINDOW_COLUMNS) for r in rows]
        if not values:
            return 0
        names = ", ".join(f'"{c}"' for c in _WINDOW_COLUMNS)
        marks = ", ".join("?" * len(_WINDOW_COLUMNS))
        with self._write(durable=False) as conn:
            conn.connection.driver_connection.executemany(
                f"INSERT OR REPLACE INTO window_trace ({names}) VALUES ({marks})", values)
        return len(values)

    def window_trace(self, group_name: str | None = None, *, since_s: float | None = None,
                     until_s: float | None = None) -> list[WindowSample]:
        q = select(WindowTraceRow).order_by(WindowTraceRow.group_name, WindowTraceRow.at_s)
        if group_name is not None:
            q = q.where(WindowTraceRow.group_name == group_name)
        if since_s is not None:
            q = q.where(WindowTraceRow.at_s >= since_s)
        if until_s is not None:
            q = q.where(WindowTraceRow.at_s <= until_s)
        with self._read() as conn:
            return [WindowSample(**r._mapping) for r in conn.execute(q)]

    def compact(self, now_s: float | None = None) -> CompactionResult:
        """Apply the retention settings; run it every few minutes from the recorder."""
        with self._write(durable=False) as conn:
            return compaction.compact(conn.connection.driver_connection, self.retention, _now(now_s))

    # --- sweeps ---------------------------------------------------------------------------

    def create_sweep(self, engine: str, grid: Mapping[str, Any], load: Mapping[str, Any],
                     slo: Mapping[str, Any], *, config_id: str | None = None,
                     at: float | None = None) -> int:
        with self._write() as conn:
            return conn.execute(insert(SweepRow).values(
                engine=engine, config_id=config_id, created_at=_now(at), grid_json=_json(grid),
                load_json=_json(load), slo_json=_json(slo), status="pending",
            )).inserted_primary_key[0]

    def set_sweep_status(self, sweep_id: int, status: str, *, at: float | None = None) -> None:
        """Move a sweep along; a finishing status (done/failed/cancelled) stamps finished_at."""
        if status not in SWEEP_STATUSES:
            raise ValueError(f"status must be one of {', '.join(SWEEP_STATUSES)}, not {status!r}")
        values: dict[str, Any] = {"status": status}
        if status in ("done", "failed", "cancelled"):
            values["finished_at"] = _now(at)
        with self._write() as conn:
            r = conn.execute(update(SweepRow).where(SweepRow.id == sweep_id).values(**values))
            self._one_changed(r, "sweep", sweep_id)

    def add_sweep_point(self, sweep_id: int, params: Mapping[str, Any], *, repeat: int = 0,
                        status: str = "ok", flags: Iterable[str] = (), config_id: str | None = None,
                        at: float | None = None, **figures: float | int | None) -> int:
        """One measured point of a sweep; `figures` are SweepPoint's numeric fields."""
        unknown = set(figures) - set(SWEEP_FIGURES)
        if unknown:
            raise TypeError(f"unknown sweep point figures: {', '.join(sorted(unknown))}")
        with self._write() as conn:
            return conn.execute(insert(SweepPointRow).values(
                sweep_id=sweep_id, at=_now(at), params_json=_json(params), repeat=repeat,
                config_id=config_id, status=status, flags_json=json.dumps(list(flags)), **figures,
            )).inserted_primary_key[0]

    def sweep(self, sweep_id: int) -> Sweep | None:
        with self._read() as conn:
            r = conn.execute(select(SweepRow).where(SweepRow.id == sweep_id)).first()
        return Sweep(**r._mapping) if r else None

    def sweeps(self, engine: str | None = None, *, since: float | None = None) -> list[Sweep]:
        q = select(SweepRow).order_by(SweepRow.created_at, SweepRow.id)
        if engine is not None:
            q = q.where(SweepRow.engine == engine)
        if since is not None:
            q = q.where((SweepRow.finished_at.is_(None)) | (SweepRow.finished_at >= since))
        with self._read() as conn:
            return [Sweep(**r._mapping) for r in conn.execute(q)]

    def sweep_points(self, sweep_id: int) -> list[SweepPoint]:
        q = select(SweepPointRow).where(SweepPointRow.sweep_id == sweep_id).order_by(SweepPointRow.id)
        with self._read() as conn:
            return [_sweep_point(r._mapping) for r in conn.execute(q)]

    # --- upkeep ---------------------------------------------------------------------------

    def integrity_check(self) -> str:
        """SQLite's full check: 'ok', or what it found."""
        with self._read() as conn:
            return "; ".join(r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check"))


def _row_values(row, record_cls, getter, columns) -> tuple:
    if isinstance(row, record_cls):
        return getter(row)
    unknown = set(row) - set(columns)
    if unknown:
        raise TypeError(f"unknown {record_cls.__name__} fields: {', '.join(sorted(unknown))}")
    values = tuple(row.get(c) for c in columns)
    if record_cls is MetricSample and values[2] is None:
        values = (*values[:2], 1.0, *values[3:])  # resolution_s defaults as in the record
    return values


def _sweep_point(m: Mapping[str, Any]) -> SweepPoint:
    d = dict(m)
    d["flags"] = tuple(json.loads(d.pop("flags_json")))
    return SweepPoint(**d)
