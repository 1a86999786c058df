"""The store: everything the daemon remembers, in one SQLite file.

`Store` is the one door to it. Its methods live with what they keep, each part over the
database they share (database.py, which also says how threads and durability work):

- sessions.py: operator sessions
- configs.py: configs and the engine runs that judge them, and the choice of a rollback target
- actions.py: the audit log
- alerts.py: alert episodes
- series.py: metric samples, batch-window ticks, and their compaction
- sweeps.py: sweeps and their points
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmconsole.db import database, migrations
from llmconsole.db.actions import Actions
from llmconsole.db.alerts import Alerts
from llmconsole.db.compaction import Retention
from llmconsole.db.configs import RUN_OUTCOMES, Configs
from llmconsole.db.series import Series
from llmconsole.db.sessions import Sessions
from llmconsole.db.sweeps import SWEEP_STATUSES, Sweeps

if TYPE_CHECKING:
    from llmconsole.engine.audit import AuditStore

__all__ = ["RUN_OUTCOMES", "SWEEP_STATUSES", "Store"]

_DEFAULT_RETENTION = Retention()  # frozen, so one instance serves every open


class Store(Sessions, Configs, Actions, Alerts, Series, Sweeps):
    """The daemon's memory. Open with `Store.open(path)`; close with `close()` or `with`."""

    def __init__(self, path: Path, retention: Retention, busy_timeout_s: float, upgraded_from: int | None):
        self.path = path
        self.retention = retention
        self.schema_version = migrations.SCHEMA_VERSION
        self.upgraded_from = upgraded_from  # the file's version before this open upgraded it
        self._db = database.Database(path, busy_timeout_s)

    @classmethod
    def open(
        cls,
        path: str | Path | None = None,
        *,
        retention: Retention = _DEFAULT_RETENTION,
        busy_timeout_s: float = 5.0,
    ) -> Store:
        """Open (creating or upgrading in place) the database at `path`, by default Paths.database.

        Raises StoreError, having written nothing, when the file is not ours, is damaged, or
        comes from a newer llmconsole.
        """
        path, upgraded_from = database.prepare(path, busy_timeout_s)
        return cls(path, retention, busy_timeout_s, upgraded_from)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def integrity_check(self) -> str:
        """SQLite's full check: 'ok', or what it found."""
        return self._db.integrity_check()


if TYPE_CHECKING:

    def _is_an_audit_store(store: Store) -> AuditStore:
        return store  # engine/ is handed a Store typed as its Protocol; mypy checks it fits here
