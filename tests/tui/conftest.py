"""The console's tests: its parts without a screen, Textual pilots and snapshots fed by the
recorded status stream, and the real binary in tmux (those two drive a real engine and carry
the `engine` marker). Snapshots live in tests/tui/__snapshots__/<test module>/."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.recorded import make_recorded_app, stream_frames


@pytest.fixture
def frames() -> list[dict[str, Any]]:
    """The recorded status stream's frames (tests/fixtures/tui/status_stream.json), read afresh."""
    return stream_frames()


@pytest.fixture
def recorded_app():
    """Builds the console on a RecordedSource replaying the stream, then any extra frames:
    `app, source = recorded_app([extra, ...], **make_app_kwargs)`; `replay(pilot)` (from
    tests.support.recorded) waits until every frame has been applied."""
    return make_recorded_app
