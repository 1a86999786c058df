"""`llmconsole history` and `export` read the store through the daemon, its one owner: the routes
GET /v1/history and POST /v1/export over a real store, and the CLI against a real daemon, whose
output is what the store's own versions and actions say. With no daemon both say how to start
one, and start none."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmconsole.console.cli_common import CliError
from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.console.commands.history import _refused
from llmconsole.daemon.api import make_app
from llmconsole.daemon.context import DaemonContext
from llmconsole.db import Store
from llmconsole.db.versions import versions
from llmconsole.paths import resolve
from llmconsole.wire.history import ExportAnswer, ExportRequest, HistoryAnswer, HistoryQuery

SECRET = "sk-history-api-test-51d2"
OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another uid needs root")


def _seed(store: Store) -> tuple[str, str]:
    """Two configs of engine e1 (the second derived from the first), one of e2, and their actions."""
    a, b = "cfg-a", "cfg-b"
    spec_a = {"model": "/m", "max_num_seqs": 8, "api_key_set": True}
    spec_b = {**spec_a, "max_num_seqs": 4}
    r1 = store.run_started("e1", a, spec_public=spec_a, pid=10, port=8000, at=100.0)
    store.run_ready(r1, at=101.0)
    store.run_exited(r1, 0, "restarted", at=200.0)
    r2 = store.run_started("e1", b, spec_public=spec_b, pid=11, port=8000, at=201.0)
    store.run_ready(r2, at=202.0)
    store.run_started("e2", "cfg-c", spec_public=spec_a, pid=12, port=8001, at=150.0)
    store.record_action("start", engine="e1", actor="ops", to_config_id=a, outcome="applied")
    store.record_action(
        "restart", engine="e1", actor="ops", from_config_id=a, to_config_id=b, outcome="failed", detail={"error": "x"}
    )
    return a, b


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "data" / "llmconsole.db")
    yield s
    s.close()


def _daemon_paths(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    paths = resolve({"LLMCONSOLE_HOME": str(home)})
    paths.ensure()
    return paths


def _call(store: Store | None, paths, method: str, path: str, body: dict | None = None, engines=()):
    fleet = SimpleNamespace(engines={name: object() for name in engines}, paths=paths)

    async def go():
        app = make_app(DaemonContext(fleet=fleet, store=store))  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(method, path, json=body)
            return resp.status, await resp.json()

    return asyncio.run(go())


# --- the routes --------------------------------------------------------------------------------


def test_the_history_route_lists_each_engine_s_versions_with_diffs_and_its_actions(store, tmp_path):
    a, b = _seed(store)
    status, body = _call(store, _daemon_paths(tmp_path), "GET", "/v1/history?actions=true")
    assert status == 200, body
    answer = HistoryAnswer.model_validate(body)
    assert list(answer.engines) == ["e1", "e2"]
    assert body["engines"]["e1"] == [v.to_json() for v in versions(store, "e1")]
    newest = answer.engines["e1"][0]
    assert newest.config_id == b and newest.derived_from == a and newest.in_use
    assert [(d.field, d.before, d.after) for d in newest.diff_from_parent] == [("max_num_seqs", 8, 4)]
    assert answer.actions is not None
    assert [(x.kind, x.outcome, x.detail) for x in answer.actions["e1"]] == [
        ("start", "applied", {}),
        ("restart", "failed", {"error": "x"}),
    ]
    assert answer.actions["e2"] == []


def test_the_history_route_filters_one_engine_and_leaves_actions_out_unless_asked(store, tmp_path):
    _seed(store)
    status, body = _call(store, _daemon_paths(tmp_path), "GET", "/v1/history?engine=e2")
    assert status == 200 and list(body["engines"]) == ["e2"] and body["actions"] is None


def test_an_engine_that_never_ran_is_404_unless_the_daemon_knows_it(store, tmp_path):
    _seed(store)
    paths = _daemon_paths(tmp_path)
    status, body = _call(store, paths, "GET", "/v1/history?engine=NOPE")
    assert status == 404 and body["error"] == "no engine named 'NOPE' has run (engines with a history: e1, e2)"
    status, body = _call(store, paths, "GET", "/v1/history?engine=fresh", engines=["fresh"])
    assert status == 200 and body["engines"] == {"fresh": []}


def test_a_bad_history_query_is_400(store, tmp_path):
    paths = _daemon_paths(tmp_path)
    status, body = _call(store, paths, "GET", "/v1/history?actions=maybe")
    assert status == 400 and body["details"][0].startswith("actions:")
    status, body = _call(store, paths, "GET", "/v1/history?engin=e1")
    assert status == 400 and body["details"][0].startswith("engin:")


def test_the_export_route_writes_the_bundle_into_the_named_folder_at_0600(store, tmp_path):
    _seed(store)
    paths = _daemon_paths(tmp_path)
    out = tmp_path / "bundle"
    status, body = _call(store, paths, "POST", "/v1/export", {"out_dir": str(out)})
    assert status == 200, body
    answer = ExportAnswer.model_validate(body)
    assert answer.out_dir == str(out) and "report.md" in answer.files and ("engine_runs", 3) in answer.counts
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for rel in answer.files:
        assert stat.S_IMODE((out / rel).stat().st_mode) == 0o600, rel
    runs = [json.loads(line) for line in (out / "engine_runs.jsonl").read_text().splitlines()]
    assert sorted(r["config_id"] for r in runs) == ["cfg-a", "cfg-b", "cfg-c"]


def test_the_export_keeps_the_daemon_s_secrets_out(store, tmp_path):
    _seed(store)
    paths = _daemon_paths(tmp_path)
    paths.state_file.write_text(json.dumps({"engines": {"e1": {"spec": {"api_key": SECRET}}}}))
    store.record_action("start", engine="e1", actor="ops", outcome="failed", detail={"error": f"said {SECRET}"})
    out = tmp_path / "bundle"
    status, body = _call(store, paths, "POST", "/v1/export", {"out_dir": str(out)})
    assert status == 200, body
    assert not [p for p in out.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"out_dir": "relative/bundle"}, "not an absolute path"),
        ({"out_dir": "/x", "engine": "e1"}, "engine: Extra inputs are not permitted"),
        ({"out_dir": "/x", "session_id": "one"}, "session_id:"),
    ],
)
def test_a_bad_export_request_is_400_and_writes_nothing(store, tmp_path, body, why):
    status, answer = _call(store, _daemon_paths(tmp_path), "POST", "/v1/export", body)
    assert status == 400 and answer["error"] == "invalid export request"
    assert any(why in d for d in answer["details"]), answer
    assert not Path("/x").exists()


def test_a_folder_that_is_not_empty_or_a_missing_session_is_400_and_nothing_is_written(store, tmp_path):
    _seed(store)
    paths = _daemon_paths(tmp_path)
    out = tmp_path / "full"
    out.mkdir(mode=0o700)
    (out / "mine.txt").write_text("keep\n")
    status, body = _call(store, paths, "POST", "/v1/export", {"out_dir": str(out)})
    assert status == 400 and "is not empty" in body["error"]
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    status, body = _call(store, paths, "POST", "/v1/export", {"out_dir": str(tmp_path / "new"), "session_id": 999})
    assert status == 400 and "no session 999" in body["error"]


@needs_root
def test_the_export_route_refuses_a_folder_of_another_user(store, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir(mode=0o700)
    os.chown(out, OTHER_UID, -1)
    status, body = _call(store, _daemon_paths(tmp_path), "POST", "/v1/export", {"out_dir": str(out)})
    assert status == 400 and f"belongs to uid {OTHER_UID}" in body["error"]
    assert list(out.iterdir()) == []


def test_a_daemon_without_a_store_says_so(tmp_path):
    status, body = _call(None, _daemon_paths(tmp_path), "GET", "/v1/history")
    assert status == 503 and "no history database" in body["error"]


# --- the CLI -----------------------------------------------------------------------------------


def test_history_and_export_with_no_daemon_say_how_to_start_one_and_start_none(cli, tmp_path):
    with Store.open(cli.home / "llmconsole.db") as s:
        _seed(s)
    for args in (["history"], ["history", "e1", "--json"], ["export", "--out", str(tmp_path / "bundle")]):
        r = cli(*args, check=False)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        assert "no llmconsole daemon is running" in r.stderr and "llmconsole daemon start" in r.stderr
        assert f"`llmconsole {args[0]}` reads the history through it" in r.stderr
    assert not (tmp_path / "bundle").exists()
    assert not resolve(cli.env).socket.exists()  # nothing started one


def test_the_cli_prints_what_the_store_holds_through_the_daemon(cli, tmp_path):
    with Store.open(cli.home / "llmconsole.db") as s:
        a, b = _seed(s)
    cli("daemon", "start")  # it closes the runs no engine of its own carries on: read what it holds
    with Store.open(cli.home / "llmconsole.db") as s:
        expected = {name: [v.to_json() for v in versions(s, name)] for name in ("e1", "e2")}
        acts = [(x.kind, x.from_config_id, x.to_config_id, x.outcome) for x in s.actions(engine="e1")]
    shown = json.loads(cli("history", "--json").stdout)
    assert shown == {"engines": expected}
    shown = json.loads(cli("history", "e1", "--json", "--actions").stdout)
    assert shown["engines"] == {"e1": expected["e1"]}
    assert [(x["kind"], x["from_config_id"], x["to_config_id"], x["outcome"]) for x in shown["actions"]["e1"]] == acts
    text = cli("history", "e1").stdout
    assert f"{b}  {expected['e1'][0]['verdict']}" in text and f"from {a}:" in text and "max_num_seqs: 8 -> 4" in text
    text = cli("history", "e1", "--actions").stdout
    assert "e1 actions:" in text and f"{a} -> {b}" in text and "error: x" in text
    r = cli("history", "NOPE", check=False)
    assert r.returncode == 2 and "no engine named 'NOPE' has run (engines with a history: e1, e2)" in r.stderr
    out = tmp_path / "bundle"
    printed = cli("export", "--out", str(out)).stdout
    assert printed.startswith(f"exported to {out}: ") and "  report.md" in printed
    assert (out / "report.md").exists() and stat.S_IMODE((out / "report.md").stat().st_mode) == 0o600


def test_the_cli_refuses_a_folder_that_is_not_empty_before_asking_the_daemon(cli, tmp_path):
    out = tmp_path / "full"
    out.mkdir(mode=0o700)
    (out / "mine.txt").write_text("keep\n")
    r = cli("export", "--out", str(out), check=False)  # no daemon runs: the folder is refused first
    assert r.returncode == 2 and "is not empty" in r.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_a_daemon_older_than_the_cli_is_named_as_such(tmp_path):
    """A daemon left running across an upgrade has no history route: its HTTP server's own 404
    becomes "restart it", not a bare "404: Not Found" nor an unknown engine."""
    sock = tmp_path / "old.sock"

    def ask(call) -> CliError:
        client = DaemonClient(transport=httpx.HTTPTransport(uds=str(sock)), where="an old daemon")
        try:
            call(client)
        except DaemonError as e:
            return _refused(e, "the route")
        finally:
            client.close()
        raise AssertionError("the old daemon answered")

    async def go():
        old = web.Application()  # none of the history routes
        runner = web.AppRunner(old)
        await runner.setup()
        await web.UnixSite(runner, str(sock)).start()
        try:
            return (
                await asyncio.to_thread(ask, lambda c: c.history_listing(HistoryQuery())),
                await asyncio.to_thread(ask, lambda c: c.export_bundle(ExportRequest(out_dir=str(tmp_path / "b")))),
            )
        finally:
            await runner.cleanup()

    for refused in asyncio.run(go()):
        assert refused.code == 1 and "has no the route: it is older than this llmconsole" in str(refused)
    unknown = _refused(DaemonError(404, "no engine named 'NOPE' has run"), "the route")
    assert unknown.code == 2 and str(unknown) == "no engine named 'NOPE' has run"
