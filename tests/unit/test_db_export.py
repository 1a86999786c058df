"""Session export: every record of the span, logs clipped to it, charts, a report, and no secrets."""

from __future__ import annotations

import csv
import json
import os
import time
import xml.etree.ElementTree as ET

import pytest

from llmconsole.db import MetricSample, Store, WindowSample
from llmconsole.db import export as export_mod
from llmconsole.db.export import ExportError, export_bundle
from llmconsole.db.logclip import clip_lines
from llmconsole.engine.spec import EngineSpec

KEY = "sk-live-7f3a9c1e55d24b8a"
T0 = 1_767_000_000.0  # the operator attaches
T1 = T0 + 1800.0  # and detaches half an hour later


def _vllm_line(t: float, text: str) -> str:
    return f"(APIServer pid=77) INFO {time.strftime('%m-%d %H:%M:%S', time.localtime(t))} [x.py:1] {text}\n"


@pytest.fixture
def filled(tmp_path):
    store = Store.open(tmp_path / "llmconsole.db")
    small = EngineSpec(model="org/tiny", max_num_seqs=4, api_key=KEY)
    big = EngineSpec(model="org/tiny", max_num_seqs=8, api_key=KEY, env={"HF_TOKEN": "hf_qwerty0987"})
    for spec in (small, big):
        store.record_config(spec.config_id, spec.public_dict(), at=T0 - 5000)
    store.record_action("start", engine="chat", to_config_id=small.config_id, at=T0 - 4000)  # before
    sid = store.begin_session("tui", user="ana", host="gpu-box", at=T0)
    r1 = store.run_started("chat", small.config_id, pid=11, port=8001, at=T0 - 4000)
    store.run_ready(r1, kv_cache_tokens=8192, max_concurrency=4.0, at=T0 - 3990)
    store.mark_run_outcome(r1, "known_good")
    store.run_exited(r1, 0, f"restarted with --api-key {KEY}", at=T0 + 100)
    a = store.record_action(
        "restart",
        engine="chat",
        session_id=sid,
        actor="ana",
        from_config_id=small.config_id,
        to_config_id=big.config_id,
        detail={"note": f"key was {KEY}"},
        at=T0 + 100,
    )
    store.update_action_outcome(a, "ok")
    r2 = store.run_started("chat", big.config_id, pid=12, port=8001, session_id=sid, at=T0 + 101)
    store.run_ready(r2, kv_cache_tokens=8192, max_concurrency=8.0, at=T0 + 130)
    store.record_action(
        "rollback",
        engine="chat",
        automatic=True,
        from_config_id=big.config_id,
        to_config_id=small.config_id,
        at=T0 + 900,
    )
    w = store.record_action(
        "window",
        engine="chat",
        session_id=sid,
        actor="ana",
        at=T0 + 950,
        detail={"from": {"window": 8, "frozen": False, "target_ms": 1000.0}},
    )
    store.update_action_outcome(w, "done", {"to": {"window": 12, "frozen": True, "target_ms": 1000.0}})
    al = store.alert_fired("p99_ttft_high", "warning", engine="chat", detail={"token": KEY}, at=T0 + 600)
    store.alert_resolved(al, at=T0 + 700)
    store.add_metric_samples(
        [
            MetricSample(
                "chat",
                T0 + i * 10,
                generation_tok_s=100.0 + i,
                kv_cache_usage=i / 200,
                p99_ttft_s=0.2,
                p99_e2e_s=None if i % 5 == 0 else 2.0,
            )
            for i in range(-20, 200)
        ]
    )
    store.add_window_trace(
        [WindowSample("chat", T0 + i * 10, target=0.5, measured=0.4, window=4 + i % 3) for i in range(100)]
    )
    sw = store.create_sweep(
        "chat",
        {"max_num_seqs": [4, 8]},
        {"rate_req_s": 2},
        {"p99_ttft_s": 1.0},
        config_id=small.config_id,
        at=T0 + 1000,
    )
    store.add_sweep_point(sw, {"max_num_seqs": 4}, throughput_req_s=2.0, p99_ttft_s=0.5, at=T0 + 1100)
    store.add_sweep_point(
        sw,
        {"max_num_seqs": 8},
        throughput_req_s=3.5,
        p99_ttft_s=1.2,
        status="slo_missed",
        flags=["slo_missed"],
        at=T0 + 1200,
    )
    store.set_sweep_status(sw, "done", at=T0 + 1300)
    store.end_session(sid, at=T1)

    log = tmp_path / "engine-chat.log"
    log.write_text(
        "banner without a stamp\n"
        + _vllm_line(T0 - 3000, "BEFORE the session")
        + _vllm_line(T0 + 200, f"non-default args: {{'api_key': '{KEY}', 'max_num_seqs': 8}}")
        + 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: inside\n'
        + _vllm_line(T0 + 300, "INSIDE the session")
        + _vllm_line(T1 + 600, "AFTER the session")
        + "trailing traceback of the after line\n"
    )
    yield store, sid, small, big, log
    store.close()


def _all_bytes(root):
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            yield os.path.join(dirpath, f), open(os.path.join(dirpath, f), "rb").read()


def test_export_of_a_session(filled, tmp_path):
    store, sid, small, big, log = filled
    out = tmp_path / "bundle"
    result = export_bundle(store, out, session_id=sid, logs={"chat": log}, secrets=[KEY])
    assert (result.span.since_s, result.span.until_s) == (T0, T1)

    # No secret anywhere, in any file: the known key, and the token only the spec's env held.
    for path, data in _all_bytes(out):
        assert KEY.encode() not in data, path
        assert b"hf_qwerty0987" not in data, path

    counts = dict(result.counts)
    actions = [json.loads(line) for line in (out / "actions.jsonl").read_text().splitlines()]
    assert [a["kind"] for a in actions] == ["restart", "rollback", "window"]  # the start before T0 is out of range
    assert actions[0]["detail"] == {"note": "key was <redacted>"} and actions[1]["automatic"] is True
    assert counts["engine_runs"] == 2 and counts["sweep_points"] == 2 and counts["alerts"] == 1
    assert counts["metric_samples"] == 181  # T0 .. T0 + 1800 at 10 s
    assert {c["config_id"] for c in map(json.loads, (out / "config_versions.jsonl").read_text().splitlines())} == {
        small.config_id,
        big.config_id,
    }
    alert = json.loads((out / "alerts.jsonl").read_text())
    assert alert["detail"] == {"token": "<redacted>"}

    rows = list(csv.DictReader(open(out / "metric_samples.csv")))
    assert len(rows) == 181 and rows[0]["at_s"] == str(T0) and rows[0]["p99_e2e_s"] == ""
    assert float(rows[1]["generation_tok_s"]) == 101.0
    points = list(csv.DictReader(open(out / "sweep_points.csv")))
    assert [p["param:max_num_seqs"] for p in points] == ["4", "8"] and points[1]["status"] == "slo_missed"

    clipped = (out / "logs" / "chat.log").read_text()
    assert "INSIDE the session" in clipped and "ValueError: inside" in clipped
    assert "BEFORE" not in clipped and "AFTER" not in clipped and "trailing traceback" not in clipped
    assert "banner without a stamp" not in clipped  # it belongs with the first stamped line, before T0
    assert "'api_key': '<redacted>'" in clipped

    for svg in ("throughput", "p99_latency", "kv_cache_usage", "window"):
        root = ET.parse(out / "plots" / f"{svg}.svg").getroot()
        assert root.tag.endswith("svg")
        assert root.findall(".//{http://www.w3.org/2000/svg}polyline"), svg  # a line was drawn

    md = (out / "report.md").read_text()
    assert "`max_num_seqs`: 4 → 8" in md  # the restart's config diff
    # A window set by hand: who, when, from and to, beside the config changes.
    assert (
        f"| {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(T0 + 950))} | ana | chat | window | done | "
        "`frozen`: false → true; `window`: 8 → 12 |"
    ) in md
    assert f"- Span (UTC): {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(T0))} → " in md
    assert '`env.HF_TOKEN`: null → "<redacted>"' in md and "`env`:" not in md
    assert "p99_ttft_high" in md and "### Sweep" in md and "slo_missed" in md
    assert "![throughput](plots/throughput.svg)" in md
    assert "operators: ana" in md and "gpu-box" in md
    assert set(result.files) >= {"report.md", "actions.jsonl", "metric_samples.csv", "logs/chat.log"}


def test_export_of_everything_and_an_empty_span(filled, tmp_path):
    store, *_ = filled
    full = export_bundle(store, tmp_path / "all")
    assert dict(full.counts)["actions"] == 4 and dict(full.counts)["metric_samples"] == 220
    # From the first record on: the report says when that was (the configs, first seen at T0 - 5000).
    md = (tmp_path / "all" / "report.md").read_text()
    assert f"- Span (UTC): {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(T0 - 5000))} (the first record) → " in md
    assert "the beginning" not in md
    empty = export_bundle(store, tmp_path / "none", since_s=T1 + 10_000, until_s=T1 + 20_000)
    # Only the run that is still serving (and its config) reaches into a span after everything.
    assert {t: n for t, n in empty.counts if n} == {"engine_runs": 1, "config_versions": 1}
    assert "no data" in (tmp_path / "none" / "plots" / "throughput.svg").read_text()
    with pytest.raises(ExportError, match="not empty"):
        export_bundle(store, tmp_path / "all")
    with pytest.raises(ExportError, match="no session 999"):
        export_bundle(store, tmp_path / "missing", session_id=999)


def test_a_secret_that_slips_through_removes_the_file(filled, tmp_path, monkeypatch):
    store, sid, _small, _big, log = filled
    monkeypatch.setattr(export_mod, "scrub_text", lambda text, secrets=(): text)  # a broken scrubber
    out = tmp_path / "leaky"
    with pytest.raises(ExportError, match="logs/chat.log"):
        export_bundle(store, out, session_id=sid, logs={"chat": log}, secrets=[KEY])
    for path, data in _all_bytes(out):
        assert KEY.encode() not in data, path


def test_log_clipping_keeps_unstamped_lines_with_their_stamp():
    t = T0 + 50
    lines = ["head\n", _vllm_line(t, "in"), "tb 1\n", _vllm_line(T1 + 99, "out"), "tb 2\n"]
    assert list(clip_lines(lines, T0, T1)) == ["head\n", lines[1], "tb 1\n"]
    assert list(clip_lines(["2026-01-01T00:00:00Z boot\n"], None, None)) == ["2026-01-01T00:00:00Z boot\n"]
    assert list(clip_lines(["no stamps\n", "at all\n"], T0, T1)) == ["no stamps\n", "at all\n"]
