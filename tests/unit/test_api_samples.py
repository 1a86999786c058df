"""The daemon's history route for the console's charts, GET /v1/engines/{name}/samples, over a
real store (the fleet and the gateway are stand-ins: what is under test is the route's reading
and binning), and the starting engine's progress that GET /v1/status carries."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from llmconsole.daemon.api import make_app
from llmconsole.daemon.api.samples import binned
from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.services.startup import StartupProgress
from llmconsole.db import MetricSample, Store, WindowSample
from llmconsole.engine.fleet import UnknownEngine
from llmconsole.engine.run_log import RunLog
from llmconsole.engine.status import EngineState, EngineStatus
from tests.support.paths import FIXTURES

FIX = FIXTURES / "startup"


class _Fleet:
    def get(self, name):
        if name != "demo":
            raise UnknownEngine(name)
        return object()


class _Gateway:
    def group_of(self, name):
        controller = SimpleNamespace(settings=SimpleNamespace(signal="ttft"))
        return SimpleNamespace(name="demo", controller=controller) if name == "demo" else None


def _get(store: Store | None, path: str):
    async def go():
        app = make_app(DaemonContext(fleet=_Fleet(), store=store, gateway=_Gateway()))
        async with TestClient(TestServer(app)) as client:
            resp = await client.get(path)
            return resp.status, await resp.json()

    return asyncio.run(go())


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "db.sqlite")
    yield s
    s.close()


def test_samples_come_back_as_columns_oldest_first(store):
    now = time.time()
    store.add_metric_samples(
        [
            MetricSample("demo", now - 30 + i, running=i, kv_cache_usage=i / 100, p99_ttft_s=None if i % 2 else 0.2)
            for i in range(30)
        ]
    )
    store.add_metric_samples([MetricSample("other", now - 5, running=99)])
    store.add_window_trace(
        [WindowSample("demo", now - 20 + i, target=800.0, measured=700.0 + i, window=8 + i % 3) for i in range(20)]
    )
    status, body = _get(store, "/v1/engines/demo/samples?since_s=60")
    assert status == 200 and body["engine"] == "demo" and body["bin_s"] == 0.0
    m = body["metrics"]
    assert m["running"] == list(range(30)) and m["at_s"] == sorted(m["at_s"])
    assert m["p99_ttft_s"][:3] == [0.2, None, 0.2]  # a missing figure stays missing, not zero
    w = body["window"]
    assert (w["group"], w["signal"], len(w["at_s"])) == ("demo", "ttft", 20)
    assert w["window"][:3] == [8, 9, 10] and w["target_ms"][0] == 800.0 and w["measured_ms"][-1] == 719.0


def test_a_long_span_is_averaged_into_at_most_points_bins(store):
    now = time.time()
    store.add_metric_samples([MetricSample("demo", now - 3000 + i, running=float(i % 10)) for i in range(3000)])
    status, body = _get(store, "/v1/engines/demo/samples?since_s=3600&points=120")
    assert status == 200 and body["bin_s"] == 30.0
    assert 100 <= len(body["metrics"]["at_s"]) <= 121
    assert body["metrics"]["running"][5] == pytest.approx(4.5)  # 30 one-second samples of 0..9, averaged


def test_a_p99_comes_with_its_histogram_bucket_and_a_bin_keeps_its_worst(store):
    """vLLM's end-to-end buckets (0.3, 0.5, 0.8, ... s): a bin keeps its worst p99 with the bucket
    that one fell in, as compaction keeps a minute's; a bin holding a sample stored before buckets
    were kept has no bucket to show."""
    now = time.time()
    start = now - 3600
    rows = [
        MetricSample("demo", start + i, p99_e2e_s=0.297, p99_e2e_lower_s=0.0, p99_e2e_upper_s=0.3)
        for i in range(60)
        if i != 7
    ]
    rows.append(MetricSample("demo", start + 7, p99_e2e_s=0.62, p99_e2e_lower_s=0.5, p99_e2e_upper_s=0.8))
    rows.append(MetricSample("demo", start + 61, p99_e2e_s=9000.0, p99_e2e_lower_s=7680.0, p99_e2e_upper_s=None))
    rows.append(MetricSample("demo", start + 95, p99_e2e_s=0.297))  # from before buckets were kept
    store.add_metric_samples(rows)
    status, body = _get(store, "/v1/engines/demo/samples?since_s=3600&points=120")
    assert status == 200 and body["bin_s"] == 30.0
    m = body["metrics"]
    # Bin 0 (the first 30 s) holds the 0.62 s p99 in 500-800 ms: its worst, not a mean of 0.31.
    assert (m["p99_e2e_s"][0], m["p99_e2e_lower_s"][0], m["p99_e2e_upper_s"][0]) == (0.62, 0.5, 0.8)
    assert (m["p99_e2e_s"][1], m["p99_e2e_lower_s"][1], m["p99_e2e_upper_s"][1]) == (0.297, 0.0, 0.3)
    assert (m["p99_e2e_s"][2], m["p99_e2e_lower_s"][2], m["p99_e2e_upper_s"][2]) == (9000.0, 7680.0, None)
    assert (m["p99_e2e_s"][3], m["p99_e2e_lower_s"][3], m["p99_e2e_upper_s"][3]) == (0.297, None, None)
    assert m["p99_ttft_lower_s"][0] is None and m["p99_ttft_s"][0] is None

    status, body = _get(store, "/v1/engines/demo/samples?since_s=3600&points=3600")  # unbinned
    m = body["metrics"]
    top = dict(zip(m["at_s"], m["p99_e2e_upper_s"], strict=True))
    assert body["bin_s"] == 0.0 and (top[start + 6], top[start + 7], top[start + 95]) == (0.3, 0.8, None)


def test_bad_queries_unknown_engines_and_no_store_say_so(store):
    assert _get(store, "/v1/engines/demo/samples?since_s=x")[0] == 400
    assert _get(store, "/v1/engines/demo/samples?since_s=7200")[0] == 400
    assert _get(store, "/v1/engines/nope/samples")[0] == 404
    assert _get(None, "/v1/engines/demo/samples")[0] == 503


def test_binning_keeps_gaps():
    at, cols = binned([0.0, 1.0, 2.0, 10.0], {"v": [1.0, None, 3.0, None]}, 0.0, 5.0)
    assert at == [1.0, 10.0] and cols == {"v": [2.0, None]}


def _following(log, pid: int) -> RunLog:
    run_log = RunLog(log)
    run_log.run_began(0)
    run_log.follow_pid(pid)
    run_log.follow()
    return run_log


def test_a_starting_engine_reports_its_phase_elapsed_time_and_last_start(store, tmp_path):
    log = tmp_path / "engine.log"
    text = (FIX / "ready_cpu.log").read_text()
    log.write_text(text[: text.index("Loading weights took")])  # the previous run's lines are pid 2580
    run = store.run_started("demo", "cfg1", pid=2580, port=1, spec_public={}, at=1000.0)
    store.run_ready(run, kv_cache_tokens=1, max_concurrency=1.0, at=1042.0)
    progress = StartupProgress(store)
    st = EngineStatus(
        name="demo",
        state=EngineState.STARTING,
        config_id="cfg1",
        model="m",
        served_model_name="m",
        device="cpu",
        pid=2580,
        started_at_s=2000.0,
        log_path=str(log),
        start_phase=_following(log, 2580).start_phase,
    )
    got = progress.of(st, now_s=2012.5)
    assert got == {"phase": "loading weights", "step": 3, "steps": 9, "elapsed_s": 12.5, "expected_s": 42.0}
    other = replace(st, pid=777, start_phase=_following(log, 777).start_phase)
    assert progress.of(other, now_s=2013.0)["phase"] == "launching (Python imports)"
    assert progress.of(replace(st, start_phase=None), now_s=2013.0)["phase"] == "launching (Python imports)"
    assert progress.of(replace(st, state=EngineState.READY), now_s=2013.0) is None
    assert StartupProgress(None).of(st, now_s=2001.0)["expected_s"] is None
    assert "start_phase" not in st.to_json()  # the API's "startup" says it
