"""The daemon's recorder: engine status snapshots in, store records out.

The supervisors know nothing of the store. They publish an immutable `EngineStatus` at every
change of state and the recorder diffs it against what it last saw of that engine: a new pid is
a new run (its config stored once), reaching ready records the KV facts, leaving the running
states closes the run with the reason. It also judges each run's config, which is what rollback
chooses from:

- known_good: the run became ready. A crash within `stable_after_s` of ready turns it known_bad,
  because a config that serves for a few seconds and dies is no better than one that never comes
  up; a crash long after ready is not held against the config.
- known_bad: the run never became ready, or crashed soon after.
- pending: stopped by the operator before it was ready; nothing was learnt.

Every write here is committed before the daemon reports the change it records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from llmconsole.db.records import MetricSample
from llmconsole.db.schema import PERCENTILE_FIELDS, bound_fields
from llmconsole.db.store import Store
from llmconsole.engine.status import EngineState, EngineStatus

log = logging.getLogger(__name__)

_LIVE = (EngineState.READY, EngineState.UNHEALTHY)
_ENDED = (EngineState.CRASHED, EngineState.FAILED, EngineState.STOPPED)


@dataclass
class _OpenRun:
    run_id: int
    pid: int
    config_id: str
    ready_at: float | None = None


class Recorder:
    def __init__(self, store: Store, stable_after_s: float = 60.0, clock: Callable[[], float] = time.time):
        self.store = store
        self.stable_after_s = stable_after_s
        self._clock = clock
        self._open: dict[str, _OpenRun] = {}

    def run_id(self, engine: str) -> int | None:
        run = self._open.get(engine)
        return run.run_id if run else None

    # --- runs -------------------------------------------------------------------------------

    def observe(self, st: EngineStatus) -> None:
        """Record what changed since the last snapshot of this engine."""
        run = self._open.get(st.name)
        if st.pid is not None and (run is None or run.pid != st.pid):
            if run is not None:  # the old process went without a snapshot saying so
                self._close(st.name, run, None, "replaced by a new process", "pending")
            run = self._begin(st, st.pid)
        if run is None:
            return
        if st.state in _LIVE and run.ready_at is None:
            run.ready_at = st.ready_at_s or self._clock()
            self.store.run_ready(
                run.run_id, kv_cache_tokens=st.kv_cache_tokens, max_concurrency=st.max_concurrency, at=run.ready_at
            )
            self.store.mark_run_outcome(run.run_id, "known_good")
        elif st.state in _ENDED:
            self._close(st.name, run, st.last_exit_code, st.last_error, self._verdict(st, run))

    def _begin(self, st: EngineStatus, pid: int) -> _OpenRun:
        # After a daemon restart an adopted engine is the run already open in the store.
        for r in reversed(self.store.runs(st.name, limit=5)):
            if r.exited_at is None and r.pid == pid and r.config_id == st.config_id:
                run = _OpenRun(r.id, pid, st.config_id, r.ready_at)
                break
        else:
            run_id = self.store.run_started(
                st.name, st.config_id, pid=pid, port=st.port, spec_public=st.spec, at=st.started_at_s
            )
            run = _OpenRun(run_id, pid, st.config_id)
        self._open[st.name] = run
        return run

    def _verdict(self, st: EngineStatus, run: _OpenRun) -> str:
        if st.state == EngineState.STOPPED:
            return "known_good" if run.ready_at is not None else "pending"
        if run.ready_at is None:
            return "known_bad"
        served_s = self._clock() - run.ready_at
        return "known_bad" if served_s < self.stable_after_s else "known_good"

    def _close(self, engine: str, run: _OpenRun, code: int | None, reason: str | None, outcome: str) -> None:
        self.store.run_exited(run.run_id, code, reason)
        self.store.mark_run_outcome(run.run_id, outcome)
        del self._open[engine]

    def close_orphans(self, live: Iterable[EngineStatus]) -> int:
        """Close runs the store still has open but no engine is running any more (the daemon
        died, and the engine with it or while none watched). Call once after adoption."""
        alive = {(s.name, s.pid) for s in live if s.pid is not None}
        closed = 0
        for r in self.store.runs():
            if r.exited_at is None and (r.engine, r.pid) not in alive:
                self.store.run_exited(r.id, None, "ended while no daemon was watching")
                closed += 1
        return closed

    # --- series -----------------------------------------------------------------------------

    def sample(self, statuses: Iterable[EngineStatus], at_s: float | None = None) -> int:
        """One 1 s sample per serving engine; the batch is one transaction."""
        at = round(self._clock() if at_s is None else at_s, 3)
        rows = [_sample(st, at) for st in statuses if st.state in _LIVE and st.metrics is not None]
        return self.store.add_metric_samples(rows)


def _sample(st: EngineStatus, at_s: float) -> MetricSample:
    m = st.metrics
    p = st.process

    def g(name: str) -> float | None:
        value: float | None = getattr(m, name, None)  # the snapshot's gauges are floats or None
        return value

    # Each percentile's histogram bucket, as the window read it: a person is shown the bucket,
    # never the interpolation beside it (engine/metrics/percentile.py).
    bounds: dict[str, Any] = {}  # bound columns only: floats, or None past the last finite bound
    for field, (lower, upper) in (getattr(m, "percentile_bounds", None) or {}).items():
        if field in PERCENTILE_FIELDS and g(field) is not None:
            lower_name, upper_name = bound_fields(field)
            bounds[lower_name], bounds[upper_name] = lower, upper

    return MetricSample(
        engine=st.name,
        at_s=at_s,
        running=g("running"),
        waiting=g("waiting"),
        kv_cache_usage=g("kv_cache_usage"),
        prompt_tok_s=g("prompt_tok_s"),
        generation_tok_s=g("generation_tok_s"),
        p50_ttft_s=g("p50_ttft_s"),
        p99_ttft_s=g("p99_ttft_s"),
        p50_itl_s=g("p50_itl_s"),
        p99_itl_s=g("p99_itl_s"),
        p50_tpot_s=g("p50_tpot_s"),
        p99_tpot_s=g("p99_tpot_s"),
        p50_e2e_s=g("p50_e2e_s"),
        p99_e2e_s=g("p99_e2e_s"),
        gpu_memory_bytes=getattr(p, "gpu_memory_bytes", None),
        host_memory_bytes=getattr(p, "rss_bytes", None),
        **bounds,
    )
