"""Replace a file whole, durably: readers see the old content or the new, never half of it, and
after a crash or power cut the new content is there once the call has returned.

The content goes to a temporary file in the same folder (mkstemp: 0600 from the start, so a
secret is never readable by others even for a moment), is fsynced, gets its final mode, and is
renamed over the target; then the folder is fsynced so the rename itself survives a power cut.
Every state and settings file llmconsole keeps is written through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` (text as UTF-8) as described above. On error the target is as it was
    and no temporary file is left behind."""
    raw = data.encode() if isinstance(data, str) else data
    folder = path.parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
            if mode != 0o600:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_folder(folder)


def fsync_folder(folder: Path) -> None:
    """Make a rename or a new file in `folder` survive a power cut."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def set_aside(path: Path, why: str = "corrupt") -> Path:
    """Rename an unreadable `path` to `<name>.<why>-<UTC time>` beside it, so whoever looks can
    see what it held; returns the new path. Never overwrites an earlier one set aside."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.{why}-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.{why}-{stamp}-{n}")
        n += 1
    os.rename(path, aside)
    fsync_folder(path.parent)
    return aside


class FileWriter:
    """Writes one file through write_atomic in a thread of its own, off the caller's event loop:
    an fsync can take tens of milliseconds on a busy disk, and the loop that waits for it also
    relays every stream's first tokens.

    Writes happen in the order asked for, and contents asked for while a write is under way are
    coalesced: only the latest is written next, and every caller waiting on one of them learns
    when it is durable (its Future: done once a write holding that content, or a later one, has
    been fsynced and renamed into place; an OSError if that write failed). A missing folder is
    created (0700) first.
    """

    def __init__(self, path: Path, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self._lock = threading.Lock()
        self._latest: str | bytes | None = None
        self._waiters: list[Future[None]] = []
        self._scheduled = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"write-{path.name}")

    def submit(self, data: str | bytes) -> Future[None]:
        done: Future[None] = Future()
        with self._lock:
            self._latest = data
            self._waiters.append(done)
            if not self._scheduled:
                self._scheduled = True
                self._pool.submit(self._write_latest)
        return done

    def write(self, data: str | bytes) -> None:
        """Write and wait (outside an event loop, or where blocking is intended): in order with
        everything submitted before."""
        self.submit(data).result()

    def _write_latest(self) -> None:
        with self._lock:
            data, waiters = self._latest, self._waiters
            self._latest, self._waiters, self._scheduled = None, [], False
        if data is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(self.path, data, self.mode)
        except BaseException as e:
            for w in waiters:
                w.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for w in waiters:
            w.set_result(None)

    def close(self) -> None:
        """Finish what was asked for, then stop the thread."""
        self._pool.shutdown(wait=True)


def read_json_object(path: Path) -> dict[str, Any]:
    """A state file written by write_atomic that holds one JSON object; {} when it is missing,
    unreadable or not an object (a state file starts empty rather than stop the daemon)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
