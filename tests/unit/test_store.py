"""The store's records: configs once, runs and verdicts, rollback choice, audit log, series, sweeps."""

from __future__ import annotations

import dataclasses
import getpass
import os
import sqlite3
import stat
import threading

import pytest

from llmconsole.db import MetricSample, Store, WindowSample
from llmconsole.db.records import SweepPoint
from llmconsole.db.schema import METRIC_FIELDS, SWEEP_FIGURES, WINDOW_FIELDS
from llmconsole.engine.spec import EngineSpec


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "data" / "llmconsole.db")
    yield s
    s.close()


def _spec(**kw) -> EngineSpec:
    return EngineSpec(model="org/tiny", **kw)


def _config(store: Store, spec: EngineSpec) -> str:
    store.record_config(spec.config_id, spec.public_dict())
    return spec.config_id


def test_same_config_is_stored_once(store):
    spec = _spec(max_num_seqs=8, api_key="sk-live-do-not-store")
    assert store.record_config(spec.config_id, spec.public_dict(), at=100.0) is True
    assert store.record_config(spec.config_id, spec.public_dict(), at=200.0) is False
    with sqlite3.connect(store.path) as raw:
        rows = raw.execute("SELECT config_id, spec_json, first_seen_at FROM config_versions").fetchall()
    assert len(rows) == 1
    assert rows[0][0] == spec.config_id and rows[0][2] == 100.0
    assert "sk-live-do-not-store" not in rows[0][1]
    got = store.config(spec.config_id)
    assert got.spec["max_num_seqs"] == 8 and got.spec["api_key_set"] is True
    assert "api_key" not in got.spec


def test_secret_looking_values_in_a_config_are_scrubbed(store):
    spec = _spec(env={"HF_TOKEN": "hf_abcdefsecret", "OMP_NUM_THREADS": "4"}, max_num_batched_tokens=64)
    _config(store, spec)
    saved = store.config(spec.config_id).spec
    assert saved["env"] == {"HF_TOKEN": "<redacted>", "OMP_NUM_THREADS": "4"}
    assert saved["max_num_batched_tokens"] == 64  # a count of tokens is no secret


def test_records_are_immutable(store):
    cid = _config(store, _spec())
    with pytest.raises(dataclasses.FrozenInstanceError):
        store.config(cid).label = "x"
    detail = store.action(store.record_action("start", detail={"a": [1]})).detail
    detail["a"].append(2)
    assert store.actions()[0].detail == {"a": [1]}


def test_runs_and_outcomes(store):
    cid = _config(store, _spec())
    sid = store.begin_session("tui", user="ops", host="box1", at=10.0)
    rid = store.run_started("chat", cid, pid=4242, port=8100, session_id=sid, at=11.0)
    store.run_ready(rid, kv_cache_tokens=12_288, max_concurrency=6.0, at=15.5)
    store.mark_run_outcome(rid, "known_good")
    store.run_exited(rid, -9, "killed by the operator", at=20.0)
    run = store.run(rid)
    assert (run.engine, run.config_id, run.pid, run.port, run.session_id) == ("chat", cid, 4242, 8100, sid)
    assert (run.started_at, run.ready_at, run.exited_at) == (11.0, 15.5, 20.0)
    assert (run.kv_cache_tokens, run.max_concurrency) == (12_288, 6.0)
    assert (run.exit_code, run.exit_reason, run.outcome) == (-9, "killed by the operator", "known_good")

    with pytest.raises(ValueError):
        store.mark_run_outcome(rid, "great")
    with pytest.raises(KeyError):
        store.run_ready(9999)
    with pytest.raises(KeyError, match="never-recorded"):
        store.run_started("chat", "never-recorded")  # the config must be known first

    rid2 = store.run_started("chat", "ffffffffffff", spec_public={"model": "x"}, at=30.0)
    assert store.run(rid2).outcome == "pending" and store.config("ffffffffffff") is not None
    assert [r.id for r in store.runs("chat")] == [rid, rid2]
    assert [r.id for r in store.runs("chat", limit=1)] == [rid2]
    assert store.runs("other") == []

    store.end_session(sid, at=40.0)
    s = store.session(sid)
    assert (s.user, s.host, s.client, s.attached_at, s.detached_at) == ("ops", "box1", "tui", 10.0, 40.0)


def _run(store, engine, cid, at, outcome):
    rid = store.run_started(engine, cid, spec_public={"id": cid}, at=at)
    store.run_exited(rid, 0, "stopped", at=at + 5)
    if outcome != "pending":
        store.mark_run_outcome(rid, outcome)
    return rid


def test_config_versions_history(store):
    _run(store, "chat", "aaaa", 100, "known_good")
    _run(store, "chat", "bbbb", 200, "known_bad")
    _run(store, "chat", "aaaa", 300, "pending")
    _run(store, "batch", "cccc", 250, "known_good")
    hist = store.config_versions("chat")
    assert [h.config_id for h in hist] == ["aaaa", "bbbb"]  # most recently used first
    a, b = hist
    assert a.outcomes == ("known_good", "pending") and a.verdict == "known_good"
    assert (a.first_used_at, a.last_used_at, a.in_use) == (100, 305, False)
    assert b.outcomes == ("known_bad",) and b.verdict == "known_bad"
    assert a.spec == {"id": "aaaa"}


def test_last_known_good_picks_the_right_version(store):
    assert store.last_known_good("chat") is None
    _run(store, "chat", "old-good", 100, "known_good")
    _run(store, "chat", "newer-good", 200, "known_good")
    _run(store, "chat", "went-bad", 300, "known_good")
    _run(store, "chat", "went-bad", 400, "known_bad")  # good once, bad since: not a candidate
    _run(store, "chat", "untested", 500, "pending")
    _run(store, "other", "other-good", 600, "known_good")  # another engine's history

    assert store.last_known_good("chat").config_id == "newer-good"
    assert store.last_known_good("chat", exclude_config_id="newer-good").config_id == "old-good"
    # A config retried and confirmed later outranks one confirmed in between.
    _run(store, "chat", "old-good", 700, "known_good")
    assert store.last_known_good("chat").config_id == "old-good"
    assert store.last_known_good("nobody") is None


def test_actions_log(store):
    c1, c2 = _config(store, _spec(max_num_seqs=4)), _config(store, _spec(max_num_seqs=8))
    s1 = store.begin_session("tui", user="ana", host="h", at=1.0)
    s2 = store.begin_session("cli", user="bo", host="h", at=2.0)
    a1 = store.record_action("start", engine="chat", session_id=s1, to_config_id=c1, at=10.0)
    a2 = store.record_action(
        "restart",
        engine="chat",
        session_id=s2,
        actor="bo",
        from_config_id=c1,
        to_config_id=c2,
        detail={"reason": "more seqs"},
        at=20.0,
    )
    a3 = store.record_action(
        "rollback",
        engine="chat",
        automatic=True,
        from_config_id=c2,
        to_config_id=c1,
        detail={"api_key": "sk-oops"},
        at=30.0,
    )
    store.update_action_outcome(a2, "failed", {"exit_code": 1})
    assert [a.id for a in store.actions()] == [a1, a2, a3]
    assert [a.id for a in store.actions(since=15.0)] == [a2, a3]
    assert [a.id for a in store.actions(session_id=s1)] == [a1]
    got = store.action(a2)
    assert (got.outcome, got.actor, got.detail) == ("failed", "bo", {"reason": "more seqs", "exit_code": 1})
    assert store.action(a1).actor == getpass.getuser()
    auto = store.action(a3)
    assert auto.automatic is True and auto.actor == "automatic" and auto.detail == {"api_key": "<redacted>"}
    assert store.action(a1).outcome == "pending"
    with pytest.raises(KeyError):
        store.update_action_outcome(12345, "ok")


def test_alerts(store):
    a = store.alert_fired("kv_cache_full", "warning", engine="chat", detail={"usage": 0.99}, at=50.0)
    b = store.alert_fired("engine_down", "critical", engine="batch", at=60.0)
    store.alert_resolved(a, at=70.0)
    assert [x.id for x in store.alerts(firing_only=True)] == [b]
    first = store.alerts(engine="chat")[0]
    assert (first.state, first.resolved_at, first.detail) == ("resolved", 70.0, {"usage": 0.99})
    assert [x.id for x in store.alerts(since=65.0)] == [a, b]  # a was still firing after 65
    assert [x.id for x in store.alerts(since=75.0)] == [b]


def test_metric_samples_round_trip(store):
    rows = [
        MetricSample("chat", 1000.0 + i, running=i, kv_cache_usage=i / 10, p99_ttft_s=0.25, gpu_memory_bytes=2**33 + i)
        for i in range(5)
    ]
    assert store.add_metric_samples(rows) == 5
    assert store.add_metric_samples([{"engine": "chat", "at_s": 1002.0, "waiting": 7}]) == 1  # replaces
    got = store.metric_samples("chat")
    assert [r.at_s for r in got] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert got[0] == rows[0]
    assert got[2].waiting == 7 and got[2].running is None and got[2].resolution_s == 1.0
    assert got[4].gpu_memory_bytes == 2**33 + 4
    assert [r.at_s for r in store.metric_samples("chat", since_s=1001.0, until_s=1003.0)] == [1001.0, 1002.0, 1003.0]
    with pytest.raises(TypeError):
        store.add_metric_samples([{"engine": "chat", "at_s": 1.0, "kv_usage": 0.5}])
    assert store.add_metric_samples([]) == 0


def test_window_trace_round_trip(store):
    rows = [
        WindowSample(
            "group-a",
            float(t),
            target=0.5,
            measured=0.4 + t / 100,
            error=0.1 - t / 100,
            p=1.0,
            i=0.1 * t,
            d=0.0,
            window=8 + t,
        )
        for t in range(3)
    ]
    assert store.add_window_trace(rows) == 3
    assert store.window_trace("group-a") == rows
    assert store.window_trace("group-b") == []


def test_sweeps_and_points(store):
    sw = store.create_sweep(
        "chat", grid={"max_num_seqs": [4, 8]}, load={"rate_req_s": 2}, slo={"p99_ttft_s": 1.0}, at=5.0
    )
    store.set_sweep_status(sw, "running")
    p1 = store.add_sweep_point(
        sw, {"max_num_seqs": 4}, repeat=0, throughput_req_s=3.5, p99_ttft_s=0.8, preemptions=0, memory_bytes=10**9
    )
    p2 = store.add_sweep_point(
        sw,
        {"max_num_seqs": 8},
        repeat=1,
        status="slo_missed",
        flags=["preempted", "slo_missed"],
        p99_ttft_s=1.4,
        preemptions=3,
    )
    store.set_sweep_status(sw, "done", at=99.0)
    s = store.sweep(sw)
    assert (s.status, s.finished_at, s.grid, s.slo) == ("done", 99.0, {"max_num_seqs": [4, 8]}, {"p99_ttft_s": 1.0})
    pts = store.sweep_points(sw)
    assert [p.id for p in pts] == [p1, p2]
    assert (pts[0].throughput_req_s, pts[0].memory_bytes, pts[0].params) == (3.5, 10**9, {"max_num_seqs": 4})
    assert (pts[1].status, pts[1].flags, pts[1].repeat) == ("slo_missed", ("preempted", "slo_missed"), 1)
    with pytest.raises(TypeError):
        store.add_sweep_point(sw, {}, throughput=1.0)
    with pytest.raises(ValueError):
        store.set_sweep_status(sw, "exploded")
    assert [x.id for x in store.sweeps("chat")] == [sw]


def test_file_is_private_and_in_wal_mode(tmp_path):
    path = tmp_path / "home" / "llmconsole.db"
    with Store.open(path) as store:
        store.add_metric_samples([MetricSample("e", 1.0, running=1)])
        store.record_action("start")
        # Keep a reader open so the -wal and -shm files exist while we look at them.
        with sqlite3.connect(path) as raw:
            raw.execute("SELECT count(*) FROM actions").fetchone()
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            for suffix in ("", "-wal", "-shm"):
                mode = stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
                assert mode == 0o600, (suffix, oct(mode))
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_looser_file_of_ours_is_made_private(tmp_path):
    path = tmp_path / "llmconsole.db"
    Store.open(path).close()
    os.chmod(path, 0o644)
    Store.open(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_writes_use_the_intended_sync_levels(store):
    seen = []
    with store._write() as conn:
        seen.append(conn.exec_driver_sql("PRAGMA synchronous").scalar())
    with store._write(durable=False) as conn:
        seen.append(conn.exec_driver_sql("PRAGMA synchronous").scalar())
    with store._read() as conn:
        seen.append(conn.exec_driver_sql("PRAGMA synchronous").scalar())
    assert seen == [2, 1, 1]  # FULL for records people act on, NORMAL for series


def test_a_failed_write_leaves_nothing_behind(store):
    with pytest.raises(ZeroDivisionError):
        with store._write() as conn:
            conn.exec_driver_sql("INSERT INTO sessions (attached_at, user, host, client) VALUES (1, 'u', 'h', 'tui')")
            raise ZeroDivisionError  # anything that escapes the transaction
    assert store.sessions() == []


def test_concurrent_threads(store):
    errors = []

    def samples(engine):
        try:
            for b in range(20):
                store.add_metric_samples([MetricSample(engine, b * 100.0 + i, running=i) for i in range(100)])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def actions():
        try:
            for i in range(50):
                store.record_action("mode", engine="chat", detail={"i": i})
                store.actions(engine="chat")
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=samples, args=(f"e{k}",)) for k in range(3)]
    threads += [threading.Thread(target=actions) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.metric_samples()) == 3 * 20 * 100
    assert sorted(a.detail["i"] for a in store.actions()) == sorted(list(range(50)) * 2)


def test_records_and_tables_share_their_column_lists():
    from llmconsole.db.records import MetricSample as M
    from llmconsole.db.records import WindowSample as W

    assert tuple(f.name for f in dataclasses.fields(M))[3:] == METRIC_FIELDS
    assert tuple(f.name for f in dataclasses.fields(W))[2:] == WINDOW_FIELDS
    assert set(SWEEP_FIGURES) <= {f.name for f in dataclasses.fields(SweepPoint)}


def test_a_path_with_url_characters(tmp_path):
    path = tmp_path / "odd dir?x=1%20#" / "llmconsole.db"
    with Store.open(path) as store:
        store.record_action("start")
    with Store.open(path) as store:  # the read-only look at an existing file quotes the path too
        assert [a.kind for a in store.actions()] == ["start"]
    assert [p.name for p in path.parent.iterdir()] == ["llmconsole.db"]
