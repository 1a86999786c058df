"""The SQLite file under the store: opening it safely, and the transactions every part runs in.

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

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, create_engine, event
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from llmconsole.db import guard, migrations
from llmconsole.db.guard import StoreError
from llmconsole.db.scrub import scrub


def prepare(path: str | Path | None, busy_timeout_s: float) -> tuple[Path, int | None]:
    """Make the database at `path` (by default Paths.database) ready to open: created private,
    in WAL mode, upgraded to this llmconsole's schema. Returns its absolute path and the schema
    version it was upgraded from (None when it was new or already current).

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
            raise StoreError(
                f"cannot use the llmconsole database {path}: SQLite would not "
                f"switch it to WAL mode (it stays in {mode!r} mode)"
            )
        before, after = migrations.upgrade(raw)
    except migrations.NewerSchemaError as e:
        raise StoreError(
            f"cannot use the llmconsole database {path}: it was written by a newer llmconsole "
            f"(schema version {e.version}; this one knows up to {migrations.SCHEMA_VERSION}). "
            f"{guard.start_fresh_hint(path)}"
        ) from e
    except sqlite3.DatabaseError as e:
        raise StoreError(f"cannot use the llmconsole database {path}: {e}. {guard.start_fresh_hint(path)}") from e
    finally:
        raw.close()
    return path, (before if 0 < before < after else None)


class Database:
    """A pool of connections to one prepared file, and the lock this process's writes take."""

    def __init__(self, path: Path, busy_timeout_s: float):
        self.path = path
        self._write_lock = threading.Lock()
        # Connections are made by hand so that no character of the path is read as URL syntax.
        self._engine = create_engine(
            "sqlite://",
            creator=lambda: sqlite3.connect(path, check_same_thread=False, timeout=busy_timeout_s),
            poolclass=QueuePool,
            pool_size=4,
            max_overflow=8,
        )
        busy_ms = int(busy_timeout_s * 1000)

        @event.listens_for(self._engine, "connect")
        def _on_connect(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
            # pysqlite's own transaction handling begins lazily and skips PRAGMAs; we say BEGIN
            # ourselves (below) so every call is exactly one transaction.
            dbapi_conn.isolation_level = None
            for pragma in (f"busy_timeout = {busy_ms}", "synchronous = NORMAL", "foreign_keys = ON"):
                dbapi_conn.execute(f"PRAGMA {pragma}")

        @event.listens_for(self._engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # A write takes the lock up front: a deferred transaction that reads and then writes
            # can fail with SQLITE_BUSY without waiting if another process wrote in between.
            write = conn.get_execution_options().get("llmconsole_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    @contextmanager
    def write(self, durable: bool = True) -> Iterator[Connection]:
        """One write transaction, committed on leaving; `durable` commits with synchronous=FULL."""
        with self._write_lock, self._engine.connect() as conn:
            raw = driver(conn)
            if durable:
                raw.execute("PRAGMA synchronous = FULL")  # set between transactions, as SQLite asks
            try:
                with conn.execution_options(llmconsole_write=True).begin():
                    yield conn
            finally:
                if durable:
                    raw.execute("PRAGMA synchronous = NORMAL")

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._engine.connect() as conn:
            yield conn

    def integrity_check(self) -> str:
        """SQLite's full check: 'ok', or what it found."""
        with self.read() as conn:
            return "; ".join(r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check"))

    def close(self) -> None:
        self._engine.dispose()


class StorePart:
    """What each part of the store (sessions, configs, ...) builds on: the database they share."""

    _db: Database

    def _write(self, durable: bool = True) -> AbstractContextManager[Connection]:
        return self._db.write(durable)

    def _read(self) -> AbstractContextManager[Connection]:
        return self._db.read()


def driver(conn: Connection) -> sqlite3.Connection:
    """The sqlite3 connection under `conn`, for what SQLAlchemy does not say (PRAGMAs between
    transactions, executemany of plain SQL)."""
    # SQLAlchemy types it as any DBAPI connection; Database's creator makes only sqlite3 ones.
    return cast(sqlite3.Connection, conn.connection.driver_connection)


def inserted_id(result: CursorResult[Any]) -> int:
    """The primary key a one-row INSERT gave its row."""
    key = result.inserted_primary_key
    assert key is not None, "an INSERT of one row always has a primary key"
    return int(key[0])


def one_changed(result: CursorResult[Any], what: str, key: object) -> None:
    if result.rowcount != 1:
        raise KeyError(f"no {what} {key!r} in the store")


def to_json(value: object) -> str:
    """`value` as the JSON a column keeps: secrets scrubbed, keys sorted, None as {}."""
    return json.dumps(scrub(value if value is not None else {}), sort_keys=True, default=str)


def now(at: float | None) -> float:
    return time.time() if at is None else float(at)
