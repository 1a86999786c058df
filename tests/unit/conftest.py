"""Unit tests: fast, in this process or a short child process, with no daemon and no vLLM engine.

A test that needs a real engine belongs in tests/integration/ (or tests/tui/ for the console) and
carries the `engine` marker, which `make test-fast` leaves out; one marked so here is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fake_engine import FakeEngine

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = [i.nodeid for i in items if i.path.is_relative_to(HERE) and i.get_closest_marker("engine")]
    if wrong:
        raise pytest.UsageError("tests/unit/ starts no engine; move these to tests/integration/: " + ", ".join(wrong))


@pytest.fixture
def fake(tmp_path):
    """A stand-in for a vLLM engine's process (tests/support/fake_engine.py) for supervision's
    unit tests; whatever a failed test left running is killed."""
    engine = FakeEngine(tmp_path / "fake")
    yield engine
    engine.kill_all()
