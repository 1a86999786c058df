"""The console fed by real answers of each wire version (tests/data/wire/, a real daemon and
engine): the dashboard shows the engine's figures from either, and says when its daemon speaks
another wire than this console; over several hosts, the host's view says which host does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from llmconsole.console.tui import RecordedSource, make_app
from llmconsole.console.tui.screens.hosts import host_title
from llmconsole.console.tui.sources.merge import HostState, fleet_status
from llmconsole.console.tui.views.status import Snapshot, fmt_rate
from llmconsole.console.tui.widgets.engines_table import EnginesTable
from llmconsole.console.tui.widgets.panels import StatusLine
from llmconsole.engine.metrics.percentile import percentile_text
from tests.support.paths import ROOT
from tests.support.recorded import replay, status_frame

WIRE = ROOT / "tests" / "data" / "wire"


def answer(version: int, name: str = "status") -> dict[str, Any]:
    return json.loads((WIRE / f"v{version}" / f"{name}.json").read_text())


@pytest.mark.parametrize("version", [1, 2])
def test_the_dashboard_shows_a_recorded_answer_of_either_wire(version):
    raw = answer(version)
    (t1,) = raw["engines"]

    async def go() -> tuple[str, list[str]]:
        source = RecordedSource([status_frame(raw, {"t1": "INFO ready\n"})])
        app = make_app(source, cursor_blink=False, refresh_s=0.01)
        async with app.run_test(size=(200, 50)) as pilot:
            await replay(pilot)
            line = str(app.screen.query_one(StatusLine).render())
            row = [str(c) for c in app.screen.query_one(EnginesTable).get_row("t1")]
            return line, row

    line, row = asyncio.run(go())
    assert row[:4] == ["t1", "ready", "tiny", t1["config_id"]]
    kv, running, gen, ttft = row[-4:]
    assert kv == f"{100 * t1['metrics']['kv_cache_usage']:.0f}%" and running == "0"
    assert gen == fmt_rate(t1["metrics"]["generation_tok_s"]) != "N/A"
    # The p99's bucket, from the real scrapes: what the engine's own rendering of the answer says.
    assert ttft == percentile_text(t1["metrics"], "p99_ttft_s", "N/A", compact=True) != "N/A"
    assert f"daemon pid {raw['daemon']['pid']} v{raw['daemon']['version']}" in line
    note = f"the daemon runs llmconsole {raw['daemon']['version']} (wire v1), older than this client's (wire v2)"
    assert (note in line) == (version == 1), line


def test_a_host_view_says_which_wire_its_daemon_speaks():
    new, old, never = HostState("new", "new"), HostState("old", "old"), HostState("down", "down")
    new.answered(answer(2), 10.0)
    old.answered(answer(1), 10.0)
    never.failed("ssh: connect to host down port 22: Connection refused", reachable=False)
    snap = Snapshot.parse(fleet_status([new, old, never], 11.0))
    assert [s.wire_version for s in snap.hosts] == [2, 1, None]
    assert snap.section("new").wire_note is None and snap.section("down").wire_note is None
    title = str(host_title(snap.section("old")))
    assert "old runs llmconsole 0.1.0 (wire v1), older than this client's (wire v2)" in title
    assert "wire v" not in str(host_title(snap.section("new")))
    assert [e.name for e in snap.engines] == ["t1@new", "t1@old"]  # the older host's engines all the same
    assert (
        snap.engine("t1@old").metric("requests_in_window") == answer(1)["engines"][0]["metrics"]["requests_in_window"]
    )
