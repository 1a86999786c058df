"""The daemon's state and settings files: each written whole and durably through one helper, and
a torn gateway.json kept aside and reported, never silently replaced by defaults."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from llmconsole.atomic import write_atomic
from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.engine.fleet import Fleet
from llmconsole.paths import Paths

TORN = '{\n "port": 18123,\n "groups": {\n  "chat": {"target_ms": 800.0, "sig'


def _fleet(tmp_path: Path) -> Fleet:
    return Fleet(Paths(data_dir=tmp_path, runtime_dir=tmp_path / "run"))


@pytest.fixture
def fsyncs(monkeypatch):
    """What was fsynced, by kind: 'file' or 'folder'."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_an_atomic_write_syncs_the_file_then_the_folder_and_leaves_no_temporary(tmp_path, fsyncs):
    target = tmp_path / "state.json"
    target.write_text("old")
    write_atomic(target, '{"new": 1}')
    assert target.read_text() == '{"new": 1}' and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert fsyncs == ["file", "folder"]
    write_atomic(target, "public", mode=0o644)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_gateway_json_is_written_durably(tmp_path, fsyncs, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    svc = GatewayService(_fleet(tmp_path))
    svc._save()
    assert json.loads((tmp_path / "gateway.json").read_text())["groups"] == {}
    assert fsyncs == ["file", "folder"]


def test_a_torn_gateway_json_is_kept_aside_logged_and_reported(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    (tmp_path / "gateway.json").write_text(TORN)
    with caplog.at_level(logging.ERROR):
        svc = GatewayService(_fleet(tmp_path))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("gateway.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_text() == TORN  # what it held, for the operator
    assert not (tmp_path / "gateway.json").exists()
    assert svc.settings_error is not None
    assert aside[0].name in svc.settings_error and "default port, groups and limits" in svc.settings_error
    assert svc.door_state()["settings_error"] == svc.settings_error
    assert any(aside[0].name in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    # A second torn file later is kept beside the first, not over it.
    (tmp_path / "gateway.json").write_text("[]")
    GatewayService(_fleet(tmp_path))
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("gateway.json.corrupt-")]) == 2


def test_a_readable_gateway_json_is_no_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    (tmp_path / "gateway.json").write_text(json.dumps({"port": 18124, "groups": {}}))
    svc = GatewayService(_fleet(tmp_path))
    assert svc.settings_error is None and svc._port == 18124


def test_the_daemon_status_says_it_started_on_defaults(cli):
    (cli.home / "gateway.json").write_text(TORN)
    cli("daemon", "start")
    status = cli.status()
    warnings = status["daemon"]["warnings"]
    assert len(warnings) == 1 and "gateway.json could not be read" in warnings[0]
    text = cli("status").stdout
    assert "warning: " in text and "gateway.json.corrupt-" in text
    assert [p for p in cli.home.iterdir() if p.name.startswith("gateway.json.corrupt-")]
