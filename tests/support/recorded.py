"""The console fed by a status stream recorded from a real daemon and engine
(tests/fixtures/tui/status_stream.json). Tests under tests/tui/ get these as fixtures
(`frames`, `recorded_app`); module-level helpers and docs/make_screenshots.py import them."""

from __future__ import annotations

import json
from typing import Any

from llmconsole.console.tui import RecordedSource, make_app
from llmconsole.console.tui.recording import load_frames
from tests.support.paths import FIXTURES

STREAM = FIXTURES / "tui" / "status_stream.json"
LOST_REASON = "no daemon answers on /tmp/llmc-demo/run/control.sock ([Errno 111] Connection refused)"


def stream_frames() -> list[dict[str, Any]]:
    """The recorded frames, freshly read: a caller may change them."""
    return load_frames(STREAM)


def make_recorded_app(extra_frames: list[dict[str, Any]] | None = None, **kw):
    """The console replaying the recorded stream (fast), then whatever frames follow."""
    source = RecordedSource(stream_frames() + list(extra_frames or []))
    kw.setdefault("refresh_s", 0.01)
    app = make_app(source, cursor_blink=False, **kw)
    return app, source


async def replay(pilot, settle: bool = True) -> None:
    """Wait until every frame has been applied, then stop polling so the screen holds still."""
    app = pilot.app
    source = app.source
    for _ in range(1000):
        if app.polls_done >= len(source.frames):
            break
        await pilot.pause(0.01)
    else:
        raise AssertionError(f"the replay did not finish: {source.position}/{len(source.frames)} frames")
    if settle:
        app.hold_polls = True
    await pilot.pause(0.05)


def lost_frame(reason: str = LOST_REASON) -> dict[str, Any]:
    return {"daemon_lost": reason}


def status_frame(status: Any, logs: dict[str, str] | None = None) -> dict[str, Any]:
    return {"status": json.loads(json.dumps(status)), "logs": logs or {}}


def history_frame(current: str) -> dict[str, Any]:
    """The last recorded frame, plus a config history of t1: the current version and an older one."""
    frame = dict(stream_frames()[-1])
    older = {
        "config_id": "0123456789ab",
        "verdict": "known_good",
        "runs": 2,
        "first_used_at": 1.7e9,
        "last_used_at": 1.7e9 + 600,
        "in_use": False,
        "label": None,
        "spec": {},
        "diff_from_previous": [],
    }
    now = {
        "config_id": current,
        "verdict": "known_good",
        "runs": 1,
        "first_used_at": 1.7e9 + 700,
        "last_used_at": 1.7e9 + 900,
        "in_use": True,
        "label": None,
        "spec": {},
        "diff_from_previous": [{"field": "max_num_seqs", "before": 16, "after": 8}],
    }
    frame["history"] = {"t1": [now, older]}
    return frame
