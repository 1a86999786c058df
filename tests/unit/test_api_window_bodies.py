"""The window and group routes' handling of request bodies: a body that is not a JSON object, or
names fields the route does not know, is refused with a 400 that says what was wrong, and the
service is never called. The service here only records calls: what is under test is the routes'
parsing, not the gateway (the real gateway is driven in test_group_engine.py), and that each change
reaching the service is recorded as an action: who, from what to what, and how it ended."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiohttp.test_utils import TestClient, TestServer

from llmconsole.daemon.api import make_app
from llmconsole.daemon.context import DaemonContext
from llmconsole.db import Store


class _RecordingService:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.state = {
            "group": "demo",
            "window": 8,
            "frozen": False,
            "target_ms": 1000.0,
            "signal": "ttft",
            "min_window": 4,
            "max_window": 32,
            "kp": 1.0,
            "ki": 3.0,
            "kd": 0.25,
        }
        self.membership = SimpleNamespace(groups={})

    def window_state(self, name, trace_points=600):
        return {"engine": name, **self.state}

    def change_window(self, name, settings, freeze, window):
        self.calls.append(("window", name, settings, freeze, window))
        if window is not None and window > self.state["max_window"]:
            raise ValueError(f"window {window} is outside [4, 32]")
        self.state.update(settings, **({"window": window, "frozen": True} if window is not None else {}))
        return {"engine": name, **self.state}

    def set_group(self, name, engines, remote=None):
        self.calls.append(("group", name, engines, *([remote] if remote else [])))
        self.membership.groups[name] = tuple(engines)
        return {"group": name, "engines": engines}

    async def check_remotes(self):
        self.calls.append(("check",))

    async def saved(self):
        """The settings on disk: a change is reported done only after this."""

    def group_state(self, name):
        engines = list(self.membership.groups[name])  # members of other hosts with what their checks found
        members = {e: {"remote": True, "health": {"answering": True}} for e in engines if "@" in e}
        return {"group": name, "engines": engines, "members": members}


def _post(method: str, path: str, data: str, store: Store | None = None) -> tuple[int, dict, list]:
    async def go():
        service = _RecordingService()
        # the routes and their error mapping
        app = make_app(DaemonContext(fleet=None, gateway=service, store=store))
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(method, path, data=data, headers={"Content-Type": "application/json"})
            return resp.status, await resp.json(), service.calls

    return asyncio.run(go())


def test_window_body_errors_say_what_was_wrong_and_change_nothing():
    for data, error in (
        ("not json", "request body is not JSON"),
        ("[1]", "request body must be a JSON object"),
        ('{"sett": 3}', "unknown fields: sett"),
        ('{"set": "3"}', "set must be an integer"),
        ('{"freeze": 1}', "freeze must be true or false"),
    ):
        status, body, calls = _post("POST", "/v1/engines/demo/window", data)
        assert (status, body["error"], calls) == (400, error, []), data


def test_a_good_window_body_reaches_the_service():
    status, _, calls = _post("POST", "/v1/engines/demo/window", '{"set": 12}')
    assert status == 200 and calls == [("window", "demo", {}, None, 12)]


def test_group_body_errors_and_a_good_one():
    for data in ("x", "[]", '{"engines": "a"}', '{"engines": [1]}'):
        status, body, calls = _post("PUT", "/v1/groups/fast", data)
        assert status == 400 and body["error"] and calls == [], data
    status, body, calls = _post("PUT", "/v1/groups/fast", '{"engines": ["a", "b"]}')
    assert status == 200 and calls == [("group", "fast", ["a", "b"])]


def test_a_group_body_with_engines_of_other_hosts(tmp_path):
    for data, error in (
        ('{"engines": ["a"], "remote": []}', '"remote" must be an object'),
        ('{"engines": ["a"], "remote": {"b": {"url": "http://h:1"}}}', "'b' is not ENGINE@HOST"),
        ('{"engines": ["a"], "remote": {"b@h": {"url": "http://h", "api_key": "sekrit"}}}', "must be http://HOST:PORT"),
        ('{"engines": ["a"], "nodes": {}}', "unknown fields: nodes"),
    ):
        status, body, calls = _post("PUT", "/v1/groups/fast", data)
        assert status == 400 and error in body["error"] and "sekrit" not in body["error"] and calls == [], data
    good = '{"engines": ["a", "b@h"], "remote": {"b@h": {"url": "http://10.0.0.2:8001", "api_key": "sekrit"}}}'
    with Store.open(tmp_path / "llmconsole.db") as store:
        status, body, calls = _post("PUT", "/v1/groups/fast", good, store)
        (action,) = store.actions()
    assert status == 200 and body["members"]["b@h"]["health"]  # answered after the members were asked for their health
    (_, name, engines, remote), check = calls
    assert (name, engines, check) == ("fast", ["a", "b@h"], ("check",))
    assert (remote["b@h"].url, remote["b@h"].api_key) == ("http://10.0.0.2:8001", "sekrit")
    assert action.detail["to"] == {"engines": ["a", "b@h"], "remote": {"b@h": "http://10.0.0.2:8001"}}
    assert "sekrit" not in str(action.detail)


def test_window_and_group_changes_are_recorded_from_and_to(tmp_path):
    with Store.open(tmp_path / "llmconsole.db") as store:
        assert _post("POST", "/v1/engines/demo/window", '{"set": 12}', store)[0] == 200
        assert _post("POST", "/v1/engines/demo/window", '{"set": 40}', store)[0] == 400
        assert _post("PUT", "/v1/groups/fast", '{"engines": ["a", "b"]}', store)[0] == 200
        assert _post("POST", "/v1/engines/demo/window", '{"sett": 3}', store)[0] == 400  # never reached the service
        acts = store.actions()
    assert [(a.kind, a.engine, a.outcome) for a in acts] == [
        ("window", "demo", "done"),
        ("window", "demo", "refused"),
        ("group", "fast", "done"),
    ]
    done, refused, group = acts
    # The test client speaks TCP, where no peer credentials name the user; the daemon's Unix socket does.
    assert done.actor == "unknown" and not done.automatic
    assert (done.detail["from"]["window"], done.detail["from"]["frozen"]) == (8, False)
    assert (done.detail["to"]["window"], done.detail["to"]["frozen"]) == (12, True)
    assert done.detail["asked"] == {"set": 12}
    assert "outside [4, 32]" in refused.detail["error"] and "to" not in refused.detail
    assert group.detail["from"] == {"engines": None} and group.detail["to"] == {"engines": ["a", "b"]}
