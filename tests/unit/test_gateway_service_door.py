"""The daemon's side of the door: a saved or set port that is taken stops the start with a clear
message (gateway and exporter), the gateway's own key (environment or a 0600 file, created when
an engine has a key), the exporter's Host check, and the limits read from gateway.json."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from pathlib import Path

import aiohttp
import pytest

from llmconsole.daemon.services.exporter import Exporter
from llmconsole.daemon.services.gateway_service import GatewayService, PortTaken, read_key_file
from llmconsole.engine.fleet import Fleet
from llmconsole.paths import Paths


def _fleet(tmp_path: Path) -> Fleet:
    return Fleet(Paths(data_dir=tmp_path, runtime_dir=tmp_path / "run"))


def _holder() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def test_a_saved_gateway_port_that_is_taken_is_an_error_never_a_move(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    holder, port = _holder()
    (tmp_path / "gateway.json").write_text(json.dumps({"port": port}))

    async def main():
        svc = GatewayService(_fleet(tmp_path))
        with pytest.raises(PortTaken) as e:
            await svc.start()
        msg = str(e.value)
        assert f"127.0.0.1:{port} is taken" in msg and "gateway.json" in msg and "does not move" in msg
        monkeypatch.setenv("LLMCONSOLE_GATEWAY_PORT", str(port))
        with pytest.raises(PortTaken, match="set LLMCONSOLE_GATEWAY_PORT to a free port"):
            await GatewayService(_fleet(tmp_path)).start()

    try:
        asyncio.run(main())
    finally:
        holder.close()
    assert json.loads((tmp_path / "gateway.json").read_text())["port"] == port  # nothing rewritten


def test_a_saved_metrics_port_that_is_taken_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_METRICS_PORT", raising=False)
    holder, port = _holder()
    (tmp_path / "exporter.json").write_text(json.dumps({"port": port}))

    class Nothing:
        def collect(self):
            return iter(())

    async def main():
        with pytest.raises(PortTaken, match=f"metrics port 127.0.0.1:{port} is taken"):
            await Exporter(Nothing(), tmp_path).start()  # type: ignore[arg-type]

    try:
        asyncio.run(main())
    finally:
        holder.close()


def test_the_exporter_answers_loopback_hosts_only(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_METRICS_PORT", raising=False)

    class Nothing:
        def collect(self):
            return iter(())

    async def main():
        exp = Exporter(Nothing(), tmp_path)  # type: ignore[arg-type]
        await exp.start()
        try:
            async with aiohttp.ClientSession() as c:
                # A name that only starts like a loopback address is any address its owner likes.
                for host in ("rebound.example:80", "127.attacker.example", "127.0.0.1.nip.io:80"):
                    async with c.get(exp.url, headers={"Host": host}) as r:
                        assert r.status == 403, host
                for host in (None, "127.0.0.1:9", "127.3.4.5", "localhost", "[::1]:9"):
                    async with c.get(exp.url, headers={"Host": host} if host else None) as r:
                        assert r.status == 200, host
        finally:
            await exp.close()
        assert exp.refused_hosts == 3

    asyncio.run(main())


def test_the_gateway_key_comes_from_the_environment_or_a_private_file(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_KEY", raising=False)
    svc = GatewayService(_fleet(tmp_path))
    assert svc.gateway.key is None and svc.key_source() is None  # no key anywhere: optional
    key = svc._ensure_key_file()  # what sync() does once an engine has a key
    path = tmp_path / "gateway.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == key and len(key) >= 32
    assert GatewayService(_fleet(tmp_path)).gateway.key == key  # kept across restarts
    os.chmod(path, 0o644)
    assert read_key_file(path) == key and stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setenv("LLMCONSOLE_GATEWAY_KEY", "from-env")
    svc = GatewayService(_fleet(tmp_path))
    assert svc.gateway.key == "from-env" and svc.key_source() == "LLMCONSOLE_GATEWAY_KEY"


def test_limits_come_from_gateway_json_and_bad_ones_fall_back_to_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    (tmp_path / "gateway.json").write_text(json.dumps({"limits": {"max_body_bytes": 1048576, "write_timeout_s": 5}}))
    svc = GatewayService(_fleet(tmp_path))
    assert (svc.gateway.limits.max_body_bytes, svc.gateway.limits.write_timeout_s) == (1048576, 5)
    svc._save()
    assert json.loads((tmp_path / "gateway.json").read_text())["limits"]["write_timeout_s"] == 5
    (tmp_path / "gateway.json").write_text(json.dumps({"limits": {"max_body_bytes": -1}}))
    assert GatewayService(_fleet(tmp_path)).gateway.limits.max_body_bytes == 16 * 1024 * 1024


def test_the_daemon_refuses_to_start_on_a_taken_port_and_says_why(cli):
    holder, port = _holder()
    try:
        cli.env["LLMCONSOLE_GATEWAY_PORT"] = str(port)
        r = cli("daemon", "start", check=False, timeout=60)
        assert r.returncode != 0
        assert f"the gateway port 127.0.0.1:{port} is taken by another process" in r.stderr
    finally:
        holder.close()
