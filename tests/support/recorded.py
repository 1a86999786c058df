"""The console fed by a status stream recorded from a real daemon and engine
(tests/fixtures/tui/status_stream.json). Tests under tests/tui/ get these as fixtures
(`frames`, `recorded_app`); module-level helpers and docs/make_screenshots.py import them."""

from __future__ import annotations

import json
from typing import Any

from llmconsole.console.tui import RecordedSource, make_app
from llmconsole.console.tui.sources.recording import load_frames, load_recording
from llmconsole.wire import WIRE_VERSION
from tests.support.paths import FIXTURES

STREAM = FIXTURES / "tui" / "status_stream.json"
START_STREAM = FIXTURES / "tui" / "start_stream.json"
LOST_REASON = "no daemon answers on /tmp/llmc-demo/run/control.sock ([Errno 111] Connection refused)"


def as_current_wire(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """These streams were recorded from a daemon of the untyped wire (version 1, which names no
    version); the current wire only added fields to it. The dashboard's tests read them as the
    current wire, so that they picture the dashboard rather than the note a console shows for an
    older daemon (tests/tui/test_wire_console.py pictures that, from answers of each version)."""
    for f in frames:
        if "status" in f:
            f["status"].setdefault("wire_version", WIRE_VERSION)
    return frames


def stream_frames() -> list[dict[str, Any]]:
    """The recorded frames, freshly read: a caller may change them."""
    return as_current_wire(load_frames(STREAM))


def stored() -> dict[str, dict[str, Any]]:
    """The daemon's stored history of the recorded engines (GET /v1/engines/{name}/samples)."""
    return load_recording(STREAM)[1]


def start_frames() -> list[dict[str, Any]]:
    """Frames of t1 starting, one per phase its log showed (recorded with the stream)."""
    return as_current_wire(load_frames(START_STREAM))


def make_recorded_app(extra_frames: list[dict[str, Any]] | None = None, **kw):
    """The console replaying the recorded stream (fast), then whatever frames follow."""
    source = RecordedSource(stream_frames() + list(extra_frames or []), stored())
    kw.setdefault("refresh_s", 0.01)
    app = make_app(source, cursor_blink=False, **kw)
    app.clock = lambda: 1000.0  # a pictured progress bar holds still
    return app, source


async def replay(pilot, settle: bool = True) -> None:
    """Wait until every frame has been applied and the stored history has come, then stop polling
    so the screen holds still."""
    app = pilot.app
    source = app.source
    for _ in range(1000):
        if (
            app.polls_done >= len(source.frames)
            and (app.fetches_done or not source.stored)
            and not app.log_reading  # the selected engine's log, read after its poll
        ):
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
        "derived_from": None,
        "diff_from_parent": [],
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
        "derived_from": "0123456789ab",
        "diff_from_parent": [{"field": "max_num_seqs", "before": 16, "after": 8}],
    }
    frame["history"] = {"t1": [now, older]}
    return frame


def run_record(kind: str) -> dict[str, Any]:
    """A sweep or a tune the daemon ran on a real engine: its request, its progress events as the
    daemon sent them, and its outcome (tests/fixtures/tui/record.py)."""
    return json.loads((FIXTURES / "tui" / f"{kind}_run.json").read_text())


async def stage_recorded(pilot, kind: str, upto: int | None = None):
    """The sweep (S) or tune (T) screen of t1 showing the recorded run's events (the first `upto`
    of them, the run still under way) or all of them and the outcome."""
    from llmconsole.console.tui.screens.run_base import RunFinished, RunProgressed, RunScreen

    await replay(pilot)
    await pilot.press("S" if kind == "sweep" else "T")
    for _ in range(300):
        if isinstance(pilot.app.screen, RunScreen):
            break
        await pilot.pause(0.01)
    screen = pilot.app.screen
    record = run_record(kind)
    screen.clock = lambda: 1000.0
    screen.show_run(screen.prepared_from_request(record["request"]))
    events = record["events"] if upto is None else record["events"][:upto]
    screen.running = upto is not None
    for raw in events:
        screen.post_message(RunProgressed(screen.event_from_json(raw)))
    if upto is None:
        screen.post_message(RunFinished(screen.outcome_from_json(record["outcome"]), None))
    await pilot.pause(0.2)
    return screen


# --- a console over two hosts ---------------------------------------------------------------

# ssh's own words when the host's sshd went away (tests/integration/test_hosts_engine.py shows
# the same from a host in a network namespace whose sshd is stopped).
FLEET_REASON = "ssh: connect to host 10.0.0.12 port 22: Connection refused"


def fleet_frames() -> list[dict[str, Any]]:
    """Frames of a console over two hosts, merged as the live console merges them
    (tui/sources/merge.py): gpu1 answers with the recorded stream, frame by frame; gpu2 answered the
    first poll with the stream's first status, then ssh stopped reaching it (its sshd went away)
    and its client backs off. Both hosts' statuses are a real daemon's answers."""
    from llmconsole.console.tui.sources.merge import HostState, fleet_status

    stream = stream_frames()
    gpu1 = HostState("gpu1", "gpu1")
    gpu2 = HostState("gpu2", "gpu2 (ops@10.0.0.12)")
    out = []
    for i, frame in enumerate(stream):
        now = 100.0 + i
        gpu1.answered(frame["status"], now)
        if i == 0:
            gpu2.answered(stream[0]["status"], now)
        else:
            gpu2.failed(FLEET_REASON, reachable=False, retry_in_s=min(60.0, 2.0 ** (i - 1)) - 0.4)
        logs = {f"{name}@gpu1": text for name, text in frame.get("logs", {}).items()}
        out.append({"status": fleet_status([gpu1, gpu2], now + 0.4), "logs": logs})
    return out


def make_fleet_app(**kw):
    """The console over two hosts (fleet_frames), replayed; its stored history is gpu1's."""
    source = RecordedSource(fleet_frames(), {f"{name}@gpu1": v for name, v in stored().items()})
    kw.setdefault("refresh_s", 0.01)
    app = make_app(source, cursor_blink=False, fleet=True, **kw)
    app.clock = lambda: 1000.0
    return app, source
