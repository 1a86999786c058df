"""Controller steps reach the SQLite store's window_trace table as the daemon writes them."""

from __future__ import annotations

from llmconsole.daemon.services.gateway_service import write_trace
from llmconsole.db import Store
from llmconsole.engine.gateway.pid import LatencySample, PidController, PidSettings


def test_controller_steps_are_written_to_the_window_trace(tmp_path):
    clock = [0.0]
    ctl = PidController(
        PidSettings(target_ms=100.0, min_samples=1), clock=lambda: clock[0], wall=lambda: 1_700_000_000.0 + clock[0]
    )
    steps = []
    for k in range(3):
        ctl.observe(LatencySample(at_s=k + 0.5, ttft_s=0.2))
        clock[0] = k + 1.0
        steps.append(("demo", ctl.step()))
    store = Store.open(tmp_path / "llmconsole.db")
    try:
        assert write_trace(store, steps) == 3
        rows = store.window_trace("demo")
    finally:
        store.close()
    assert [r.window for r in rows] == [float(s.window) for _, s in steps]
    assert rows[0].target == 100.0 and rows[0].measured == 200.0 and rows[0].error == -1.0
    assert rows[-1].window < 8  # twice the target: the window came down
