"""Replace a file whole, durably: readers see the old content or the new, never half of it, and
after a crash or power cut the new content is there once the call has returned.

The content goes to a temporary file in the same folder (mkstemp: 0600 from the start, so a
secret is never readable by others even for a moment), is fsynced, gets its final mode, and is
renamed over the target; then the folder is fsynced so the rename itself survives a power cut.
Every state and settings file llmconsole keeps is written through here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path


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
