"""Decide, without writing a byte, whether a database file is ours and how old it is.

A file that is not ours (another program's SQLite database, or not SQLite at all) or that is
damaged must come out of this exactly as it went in: the operator may need it, and a
write would make a corrupt file harder to recover. So the look is read-only: `immutable=1`
when no journal sits beside the file (SQLite then creates no -wal/-shm either), `mode=ro` when
one does, because only then do committed pages live outside the main file.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from llmconsole.db.migrations import APPLICATION_ID, SCHEMA_VERSION

_SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreError(Exception):
    """The database cannot be used; the message says which file, what is wrong, what to do."""


@dataclass(frozen=True)
class FileState:
    exists: bool
    schema_version: int  # 0 for a new or empty file


def start_fresh_hint(path: Path) -> str:
    return (
        f"To start with a fresh database, move the file aside (mv '{path}' '{path}.old') "
        "or set LLMCONSOLE_HOME to another directory."
    )


def _refuse(path: Path, what: str) -> StoreError:
    return StoreError(f"cannot use the llmconsole database {path}: {what}. {start_fresh_hint(path)}")


def _read_only_uri(path: Path) -> str:
    has_journal = any(Path(f"{path}{s}").exists() for s in ("-wal", "-journal"))
    mode = "mode=ro" if has_journal else "immutable=1"
    return f"file:{quote(str(path))}?{mode}"


def inspect(path: Path) -> FileState:
    """The state of the file at `path`; raises StoreError for anything we must not touch."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return FileState(exists=False, schema_version=0)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "it is not a regular file")
    if st.st_size == 0:
        return FileState(exists=True, schema_version=0)  # nothing in it to lose
    with open(path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise _refuse(path, "it is not a SQLite database (the file is corrupt or belongs to something else)")

    try:
        conn = sqlite3.connect(_read_only_uri(path), uri=True, isolation_level=None)
    except sqlite3.Error as e:
        raise _refuse(path, f"SQLite cannot open it ({e})") from e
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        check = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
    except sqlite3.Error as e:
        raise _refuse(path, f"it is damaged ({e})") from e
    finally:
        conn.close()

    if check != ["ok"]:
        found = "; ".join(line for c in check for line in c.splitlines() if not line.startswith("***"))
        raise _refuse(path, f"it is damaged (SQLite's check says: {found})")
    if app_id != APPLICATION_ID:
        user_tables = sorted(t for t in tables if not t.startswith("sqlite_"))
        if app_id != 0:
            raise _refuse(
                path,
                f"it belongs to another application (application_id {app_id:#010x}, ours is {APPLICATION_ID:#010x})",
            )
        if user_tables:
            shown = ", ".join(user_tables[:5]) + (", ..." if len(user_tables) > 5 else "")
            raise _refuse(path, f"it is a SQLite database of another application (tables: {shown})")
        return FileState(exists=True, schema_version=0)  # an empty SQLite file
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"cannot use the llmconsole database {path}: it was written by a newer llmconsole "
            f"(schema version {version}; this llmconsole knows versions up to {SCHEMA_VERSION}). "
            f"Upgrade llmconsole to read it. {start_fresh_hint(path)}"
        )
    if version < 1:
        raise _refuse(path, "it carries our mark but no schema version")
    return FileState(exists=True, schema_version=version)


def create_private(path: Path) -> None:
    """Create an empty file readable by its owner only, before SQLite opens it.

    SQLite creates its -wal and -shm files with the permissions of the database file, so a
    0600 database keeps its journals 0600 too (the process umask can only take bits away).
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return  # another process got there first; inspect() looks at what it made
    os.close(fd)
