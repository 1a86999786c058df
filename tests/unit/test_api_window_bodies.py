"""The window and group routes' handling of request bodies: a body that is not a JSON object, or
names fields the route does not know, is refused with a 400 that says what was wrong, and the
service is never called. The service here only records calls: what is under test is the routes'
parsing, not the gateway (the real gateway is driven in test_group_engine.py)."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from llmconsole.daemon.api import make_app
from llmconsole.daemon.context import DaemonContext


class _RecordingService:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def change_window(self, name, settings, freeze, window):
        self.calls.append(("window", name, settings, freeze, window))
        return {"engine": name}

    def set_group(self, name, engines):
        self.calls.append(("group", name, engines))
        return {"group": name, "engines": engines}


def _post(method: str, path: str, data: str) -> tuple[int, dict, list]:
    async def go():
        service = _RecordingService()
        app = make_app(DaemonContext(fleet=None, gateway=service))  # the routes and their error mapping
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(method, path, data=data, headers={"Content-Type": "application/json"})
            return resp.status, await resp.json(), service.calls
    return asyncio.run(go())


def test_window_body_errors_say_what_was_wrong_and_change_nothing():
    for data, error in (("not json", "request body is not JSON"), ("[1]", "request body must be a JSON object"),
                        ('{"sett": 3}', "unknown fields: sett"), ('{"set": "3"}', "set must be an integer"),
                        ('{"freeze": 1}', "freeze must be true or false")):
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
