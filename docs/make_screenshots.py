"""Render the README's console screenshots (SVG, by Textual) from the recorded status stream.

    .venv/bin/python docs/make_screenshots.py [NAME ...]   # docs/console.svg, history, sweep, tune
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.recorded import history_frame, make_recorded_app, replay, stream_frames  # noqa: E402


async def shoot(name: str, keys: list[str], extra=None) -> None:
    app, _ = make_recorded_app(extra)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay(pilot)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        app.save_screenshot(filename=f"{name}.svg", path=str(ROOT / "docs"))


async def shoot_staged(name: str, stage, events) -> None:
    """A sweep or tune screen showing a fixed sequence of its runner's events (the tests' own)."""
    app, _ = make_recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await stage(pilot, events)
        await pilot.pause(0.3)
        app.save_screenshot(filename=f"{name}.svg", path=str(ROOT / "docs"))


async def main(names: list[str]) -> None:
    from tests.tui import test_tui_sweep, test_tui_tune

    current = stream_frames()[-1]["status"]["engines"][0]["config_id"]
    shots = {
        "console": lambda: shoot("console", []),
        "history": lambda: shoot("history", ["h", "down"], [history_frame(current)]),
        "sweep": lambda: shoot_staged("sweep", test_tui_sweep.stage, test_tui_sweep.EVENTS),
        "tune": lambda: shoot_staged("tune", test_tui_tune.stage, test_tui_tune.EVENTS),
    }
    for name in names or list(shots):
        await shots[name]()
        print(f"wrote docs/{name}.svg")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
