"""Sweeps: a grid of configs and loads measured against an SLO, and the points they measured."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import RowMapping, insert, select, update
from sqlmodel import col

from llmconsole.db.database import StorePart, inserted_id, now, one_changed, to_json
from llmconsole.db.records import Sweep, SweepPoint
from llmconsole.db.schema import SWEEP_FIGURES, SweepPointRow, SweepRow

SWEEP_STATUSES = ("pending", "running", "done", "failed", "cancelled")


class Sweeps(StorePart):
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
        with self._write() as conn:
            return inserted_id(
                conn.execute(
                    insert(SweepRow).values(
                        engine=engine,
                        config_id=config_id,
                        created_at=now(at),
                        grid_json=to_json(grid),
                        load_json=to_json(load),
                        slo_json=to_json(slo),
                        status="pending",
                    )
                )
            )

    def set_sweep_status(self, sweep_id: int, status: str, *, at: float | None = None) -> None:
        """Move a sweep along; a finishing status (done/failed/cancelled) stamps finished_at."""
        if status not in SWEEP_STATUSES:
            raise ValueError(f"status must be one of {', '.join(SWEEP_STATUSES)}, not {status!r}")
        values: dict[str, Any] = {"status": status}
        if status in ("done", "failed", "cancelled"):
            values["finished_at"] = now(at)
        with self._write() as conn:
            r = conn.execute(update(SweepRow).where(col(SweepRow.id) == sweep_id).values(**values))
            one_changed(r, "sweep", sweep_id)

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
        """One measured point of a sweep; `figures` are SweepPoint's numeric fields."""
        unknown = set(figures) - set(SWEEP_FIGURES)
        if unknown:
            raise TypeError(f"unknown sweep point figures: {', '.join(sorted(unknown))}")
        with self._write() as conn:
            return inserted_id(
                conn.execute(
                    insert(SweepPointRow).values(
                        sweep_id=sweep_id,
                        at=now(at),
                        params_json=to_json(params),
                        repeat=repeat,
                        config_id=config_id,
                        status=status,
                        flags_json=json.dumps(list(flags)),
                        **figures,
                    )
                )
            )

    def sweep(self, sweep_id: int) -> Sweep | None:
        with self._read() as conn:
            r = conn.execute(select(SweepRow).where(col(SweepRow.id) == sweep_id)).first()
        return Sweep(**r._mapping) if r else None

    def sweeps(self, engine: str | None = None, *, since: float | None = None) -> list[Sweep]:
        q = select(SweepRow).order_by(col(SweepRow.created_at), col(SweepRow.id))
        if engine is not None:
            q = q.where(col(SweepRow.engine) == engine)
        if since is not None:
            q = q.where(col(SweepRow.finished_at).is_(None) | (col(SweepRow.finished_at) >= since))
        with self._read() as conn:
            return [Sweep(**r._mapping) for r in conn.execute(q)]

    def sweep_points(self, sweep_id: int) -> list[SweepPoint]:
        q = select(SweepPointRow).where(col(SweepPointRow.sweep_id) == sweep_id).order_by(col(SweepPointRow.id))
        with self._read() as conn:
            return [_sweep_point(r._mapping) for r in conn.execute(q)]


def _sweep_point(m: RowMapping) -> SweepPoint:
    d = dict(m)
    d["flags"] = tuple(json.loads(d.pop("flags_json")))
    return SweepPoint(**d)
