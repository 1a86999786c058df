"""What engine/ needs of the store: to record configs, actions and sweeps, and to read runs.

engine/ never imports llmconsole.db (the daemon and the clients hand a store in), so this
Protocol is the whole of what it may ask of one. llmconsole.db.Store satisfies it
structurally, and a test double needs only these methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol


class RunRecord(Protocol):
    """One engine process as the store remembers it; the part engine/ reads."""

    @property
    def config_id(self) -> str: ...

    @property
    def exit_reason(self) -> str | None: ...


class AuditStore(Protocol):
    """The store's methods engine/ calls; each record is durable once its call returns."""

    def record_config(self, config_id: str, spec_public: Mapping[str, Any], *, at: float | None = None) -> bool:
        """Remember a config (its public dict) under its config_id; True if it is new."""
        ...

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
        """Log an action before carrying it out; returns its id."""
        ...

    def update_action_outcome(self, action_id: int, outcome: str, detail: Mapping[str, Any] | None = None) -> None:
        """Say how an action ended; `detail` keys are merged over those recorded with it."""
        ...

    def runs(
        self, engine: str | None = None, *, since: float | None = None, limit: int | None = None
    ) -> Sequence[RunRecord]:
        """Runs oldest first; `limit` keeps the latest ones."""
        ...

    def create_sweep(
        self,
        engine: str,
        grid: Mapping[str, Any],
        load: Mapping[str, Any],
        slo: Mapping[str, Any],
        *,
        config_id: str | None = None,
        at: float | None = None,
    ) -> int:
        """Open a sweep record (status pending); returns its id."""
        ...

    def set_sweep_status(self, sweep_id: int, status: str, *, at: float | None = None) -> None:
        """pending, running, done, failed or cancelled; a finishing status stamps the end."""
        ...

    def add_sweep_point(
        self,
        sweep_id: int,
        params: Mapping[str, Any],
        *,
        repeat: int = 0,
        status: str = "ok",
        flags: Iterable[str] = (),
        config_id: str | None = None,
        at: float | None = None,
        **figures: float | int | None,
    ) -> int:
        """One measured point; `figures` are the store's numeric sweep-point fields."""
        ...
