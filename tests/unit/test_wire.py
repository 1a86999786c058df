"""The wire's models: real answers of the current wire (v2) and of the untyped one before it (v1,
recorded from a real daemon and engine: tests/data/wire/README.md) read back through them; a
round trip keeps every field the daemon's objects have; an answer with fields a client does not
know, or without fields it does, still reads; and `status` says which host speaks which wire."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from llmconsole.console import cli
from llmconsole.console.client import DaemonClient
from llmconsole.console.host_status import HostReport
from llmconsole.console.hosts import LOCAL_HOST, Destination, Host
from llmconsole.daemon.api import make_app
from llmconsole.daemon.context import DaemonContext
from llmconsole.engine.host import GpuSample, HostSample, ProcessSample
from llmconsole.engine.metrics.ranks import RankFigures
from llmconsole.engine.metrics.window import WindowedMetrics
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.wire import WIRE_HEADER, WIRE_VERSION, version_note
from llmconsole.wire.alerts import AlertsAnswer
from llmconsole.wire.gateway import GroupsAnswer, WindowState
from llmconsole.wire.runs import RunsAnswer
from llmconsole.wire.status import DaemonInfo, EngineInfo, HostInfo, StatusAnswer
from tests.support.paths import ROOT

WIRE = ROOT / "tests" / "data" / "wire"
VERSIONS = (1, 2)
MODELS = {
    "daemon": DaemonInfo,
    "status": StatusAnswer,
    "window": WindowState,
    "groups": GroupsAnswer,
    "runs": RunsAnswer,
    "alerts": AlertsAnswer,
}


def answer(version: int, name: str) -> dict[str, Any]:
    return json.loads((WIRE / f"v{version}" / f"{name}.json").read_text())


def test_the_wire_version_is_the_one_recorded_as_current():
    assert WIRE_VERSION == 2
    assert answer(2, "status")["wire_version"] == 2 and answer(2, "daemon")["wire_version"] == 2
    assert "wire_version" not in answer(1, "status")  # the untyped wire named none


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_recorded_answer_reads_and_round_trips(version, name):
    raw = answer(version, name)
    model = MODELS[name].model_validate(raw)
    again = MODELS[name].model_validate(model.to_wire())
    assert again == model
    if hasattr(model, "wire_version"):
        assert model.wire_version == version  # an answer naming none is version 1


@pytest.mark.parametrize("version", VERSIONS)
def test_a_recorded_status_keeps_every_figure_of_the_real_engine(version):
    raw = answer(version, "status")
    st = StatusAnswer.model_validate(raw)
    (e,) = st.engines
    (r,) = raw["engines"]
    assert (e.name, e.state, e.config_id, e.port) == ("t1", EngineState.READY, r["config_id"], r["port"])
    assert e.metrics is not None and e.metrics.requests_in_window == r["metrics"]["requests_in_window"] > 0
    assert e.metrics.p99_ttft_s == r["metrics"]["p99_ttft_s"] is not None
    assert e.metrics.percentile_bounds == r["metrics"]["percentile_bounds"]
    assert e.process is not None and e.process.rss_bytes == r["process"]["rss_bytes"] > 0
    assert e.controller is not None and e.controller.window == r["controller"]["window"]
    assert [s.window for s in e.controller.trace] == [t["window"] for t in r["controller"]["trace"]]
    assert st.host.memory_total_bytes == raw["host"]["memory_total_bytes"] > 0
    assert st.daemon.version == raw["daemon"]["version"]


def _dump_keys(d: Any, path: str = "") -> set[str]:
    if isinstance(d, dict):
        return {f"{path}.{k}" for k in d} | {x for k, v in d.items() for x in _dump_keys(v, f"{path}.{k}")}
    return set()


def _real_status() -> EngineStatus:
    metrics = WindowedMetrics(
        taken_at_s=1000.0,
        running=3.0,
        waiting=1.0,
        kv_cache_usage=0.42,
        generation_tok_s=512.5,
        requests_in_window=22.0,
        p99_ttft_s=0.031,
        p50_ttft_s=0.012,
        num_gpu_blocks=48,
        block_size=128,
        percentile_window_s=60.0,
        percentile_bounds={"p99_ttft_s": [0.025, 0.05], "p50_ttft_s": [0.01, 0.025]},
        ranks=(
            RankFigures("0", 0.0, 0.0, 0.0, 16.0, 0.91),
            RankFigures("1", 8.0, 16.0, 0.91, 0.0, 0.0, ("queue", "kv"), 20.0, True, "16 waiting"),
        ),
    )
    return EngineStatus(
        name="t1",
        state=EngineState.READY,
        config_id="66937364bc78",
        model="/models/tiny",
        served_model_name="tiny",
        device="cpu",
        pid=4242,
        port=8001,
        url="http://127.0.0.1:8001",
        restarts=1,
        metrics=metrics,
        process=ProcessSample(pid=4242, rss_bytes=1 << 30, cpu_pct=87.5, num_processes=3),
        spec={"model": "/models/tiny", "max_num_seqs": 8, "kernel": "stock"},
        controller={"group": "t1", "window": 8, "frozen": False, "trace": [{"at_s": 999.0, "window": 8}]},
        kernel="stock",
        kernel_usage={"calls": 3},
    )


def test_a_real_status_round_trips_with_every_field_it_has():
    """What the daemon's objects say all reaches the wire: a field added to EngineStatus and not to
    the model would be dropped here (the models ignore what they do not know)."""
    st = _real_status()
    raw = json.loads(json.dumps(st.to_json()))
    wire = EngineInfo.model_validate(raw).to_wire()
    assert _dump_keys(raw) - _dump_keys(wire) == set()
    for key, value in raw.items():
        if key != "controller":  # the controller's missing fields take their defaults
            assert wire[key] == value, key
    assert wire["metrics"]["ranks"][1] == raw["metrics"]["ranks"][1]  # a list: _dump_keys stops there
    host = HostSample(
        cpu_pct=12.0,
        memory_used_bytes=1 << 33,
        memory_total_bytes=1 << 35,
        gpus=(GpuSample(0, "H100", 1 << 30, 80 << 30, 50.0, 20.0, 300.0, 55.0),),
        nvml_available=True,
        nvml_error=None,
    )
    raw_host = json.loads(json.dumps(dataclasses.asdict(host)))
    assert HostInfo.model_validate(raw_host).to_wire() == raw_host


def test_an_answer_with_fields_this_client_does_not_know_reads_as_without_them():
    raw = answer(2, "status")
    newer = copy.deepcopy(raw)
    newer["cluster"] = {"name": "x"}
    newer["daemon"]["build"] = "abc"
    newer["host"]["numa_nodes"] = 2
    newer["engines"][0]["tenant"] = "team-a"
    newer["engines"][0]["metrics"]["p999_ttft_s"] = 0.9
    newer["engines"][0]["controller"]["trace"][0]["jitter"] = 1
    assert StatusAnswer.model_validate(newer) == StatusAnswer.model_validate(raw)


def test_an_answer_missing_optional_fields_reads_with_them_defaulted():
    raw = answer(2, "status")
    (e,) = raw["engines"]
    older = {"daemon": {"version": "0.0.9"}, "engines": [{"name": e["name"], "state": e["state"]}]}
    st = StatusAnswer.model_validate(older)
    (only,) = st.engines
    assert st.wire_version == 1 and st.host.gpus == [] and st.daemon.warnings == []
    assert only.name == "t1" and only.metrics is None and only.restarts is None and only.spec == {}
    # A state this client does not know (a newer daemon's) is kept as text, not refused.
    assert EngineInfo.model_validate({"name": "x", "state": "hibernating"}).state == "hibernating"


def test_odd_values_take_their_defaults_and_lists_keep_what_fits():
    e = EngineInfo.model_validate(
        {"name": "e", "pid": "x", "metrics": [], "controller": {"trace": [None, {"window": 4}, "?"]}}
    )
    assert e.pid is None and e.metrics is None
    assert e.controller is not None and [s.window for s in e.controller.trace] == [4]


def test_the_daemon_names_its_wire_on_every_answer():
    async def go() -> list[tuple[int, str | None, dict[str, Any]]]:
        app = make_app(DaemonContext(fleet=None, gateway=None, store=None))
        async with TestClient(TestServer(app)) as client:
            out = []
            for path in ("/v1/groups", "/v1/nowhere"):  # no gateway: a 503; no route: a 404
                resp = await client.get(path)
                body = await resp.json() if resp.content_type == "application/json" else {}
                out.append((resp.status, resp.headers.get(WIRE_HEADER), body))
            return out

    for status, header, _ in asyncio.run(go()):
        assert status in (503, 404) and header == str(WIRE_VERSION)


def _client_of(version: int) -> DaemonClient:
    """A client whose daemon answers with the recorded answers of `version` (v1 names no version)."""

    def handle(request: httpx.Request) -> httpx.Response:
        name = request.url.path.removeprefix("/v1/")
        headers = {WIRE_HEADER: str(version)} if version > 1 else {}
        return httpx.Response(200, json=answer(version, name), headers=headers)

    return DaemonClient(transport=httpx.MockTransport(handle), where=f"a v{version} daemon")


@pytest.mark.parametrize("version", VERSIONS)
def test_status_json_and_text_read_either_wire(version, monkeypatch, capsys):
    monkeypatch.setattr(cli, "daemon_client", lambda: _client_of(version))
    assert cli.main(["status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    raw = answer(version, "status")
    assert shown["wire_version"] == version
    for key in ("name", "state", "config_id", "port", "p99_ttft_s", "kv_cache_usage", "num_requests_running"):
        assert shown["engines"][0][key] == raw["engines"][0][key], key
    assert cli.main(["status"]) == 0
    text = capsys.readouterr().out
    header, row = text.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "STATE", "PID"] and row.split()[:2] == ["t1", "ready"]
    note = f"note: the daemon runs llmconsole {raw['daemon']['version']} (wire v1), older than this client's (wire v2)"
    assert (note in text) == (version == 1)


def test_a_client_remembers_the_wire_its_daemon_named():
    for version in VERSIONS:
        c = _client_of(version)
        assert c.wire_version is None
        info = c.daemon_info()
        assert c.wire_version == version == info.wire_version


def test_status_across_hosts_says_which_host_speaks_which_wire():
    old = Host("old", Destination.parse("old"))
    reports = [
        HostReport(LOCAL_HOST, status=StatusAnswer.model_validate(answer(2, "status"))),
        HostReport(old, status=StatusAnswer.model_validate(answer(1, "status"))),
    ]
    text = cli.format_hosts_status(reports)
    local, there = text.split("\n\n")
    assert "wire v" not in local
    assert "note: old runs llmconsole 0.1.0 (wire v1), older than this client's (wire v2)" in there
    assert "t1" in there  # its engines are listed all the same
    assert [r.to_json()["wire_version"] for r in reports] == [2, 1]


def test_the_version_note_names_newer_and_older_and_is_silent_when_equal():
    assert version_note("gpu1", WIRE_VERSION, "0.2.0") is None
    assert "newer than this client's" in (version_note("gpu1", WIRE_VERSION + 1, "0.3.0") or "")
    assert "gpu1 runs an llmconsole (wire v1), older" in (version_note("gpu1", 1, None) or "")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_window_group_alerts_and_runs_commands_draw_either_wire(version):
    from llmconsole.console.commands.group import format_groups
    from llmconsole.console.commands.mode import format_alerts
    from llmconsole.console.commands.runs import runs_table
    from llmconsole.console.commands.window import format_window

    raw = answer(version, "window")
    window = format_window(WindowState.model_validate(raw))
    assert window.startswith(f"t1: window {raw['window']} (controlled), in flight 0, queued 0")
    assert f"admitted {raw['admitted_total']}" in window and "N/A" not in window
    assert f"{raw['trace'][-1]['window']:>3} ({raw['trace'][-1]['action']})" in window
    groups = format_groups(GroupsAnswer.model_validate(answer(version, "groups")).groups).splitlines()
    assert groups[1].split()[:3] == ["t1", "(own)", "t1"]
    assert format_alerts(AlertsAnswer.model_validate(answer(version, "alerts"))).startswith("active: none")
    assert runs_table(RunsAnswer.model_validate(answer(version, "runs")).runs) == [runs_table([])[0]]


def test_alerts_and_runs_with_records_draw_and_a_record_missing_fields_still_does():
    from llmconsole.console.commands.mode import format_alerts
    from llmconsole.console.commands.runs import runs_table

    data = AlertsAnswer.model_validate(
        {
            "active": [{"rule": "kv_pressure", "engine": "t1", "state": "firing", "for_s": 12.4}],
            "alerts": [{"id": 3, "at": 1.7e9, "engine": "t1", "rule": "kv_pressure", "severity": "warning"}],
            "responses": [
                {
                    "id": 9,
                    "at": 1.7e9,
                    "engine": "t1",
                    "kind": "response:window",
                    "outcome": "done",
                    "detail": {"trigger": "kv_pressure", "undone_by": 11},
                },
            ],
            "settings": {"responses": {"kv_pressure": ["window"]}},
        }
    )
    text = format_alerts(data)
    assert "  kv_pressure on t1: firing for 12 s" in text and "window on t1 for kv_pressure: done undone by #11" in text
    assert text.endswith("enabled: kv_pressure=window")
    runs = RunsAnswer.model_validate(
        {
            "runs": [
                {
                    "id": 2,
                    "kind": "sweep",
                    "engine": "t1",
                    "state": "running",
                    "cancel_requested": True,
                    "started_at": 1.7e9,
                    "events": 4,
                    "actor": "ops",
                },
                {"id": 1},
            ]
        }
    ).runs
    table = runs_table(runs)
    assert table[1].split()[:2] == ["1", "?"] and table[2].split()[:4] == ["2", "sweep", "t1", "cancelling"]
