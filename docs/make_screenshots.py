"""Render the console screenshots of the README and docs/ (SVG, by Textual) from the snapshot tests' scenarios: the
recorded status stream of a real daemon and engine, and a sweep and a tune a real engine ran.

    .venv/bin/python docs/make_screenshots.py [NAME ...]   # docs/console.svg, console-80x24, console-hosts,
                                                           # history, sweep, tune
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.recorded import (  # noqa: E402
    history_frame,
    make_fleet_app,
    make_recorded_app,
    replay,
    stage_recorded,
    stream_frames,
)


async def shoot(name: str, keys: list[str], size: tuple[int, int], extra=None, fleet: bool = False) -> None:
    app, _ = make_fleet_app() if fleet else make_recorded_app(extra)
    async with app.run_test(size=size) as pilot:
        await replay(pilot)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        app.save_screenshot(filename=f"{name}.svg", path=str(ROOT / "docs"))


async def shoot_run(name: str, kind: str, size: tuple[int, int]) -> None:
    """A sweep or tune screen at the end of the run a real engine did (the tests' recording)."""
    app, _ = make_recorded_app()
    async with app.run_test(size=size) as pilot:
        await stage_recorded(pilot, kind)
        await pilot.pause(0.3)
        app.save_screenshot(filename=f"{name}.svg", path=str(ROOT / "docs"))


async def main(names: list[str]) -> None:
    current = stream_frames()[-1]["status"]["engines"][0]["config_id"]
    shots = {
        "console": lambda: shoot("console", [], (200, 60)),
        "console-80x24": lambda: shoot("console-80x24", [], (80, 24)),
        "console-hosts": lambda: shoot("console-hosts", [], (120, 32), fleet=True),
        "history": lambda: shoot("history", ["h", "down"], (120, 40), [history_frame(current)]),
        "sweep": lambda: shoot_run("sweep", "sweep", (200, 60)),
        "tune": lambda: shoot_run("tune", "tune", (200, 60)),
    }
    for name in names or list(shots):
        await shots[name]()
        print(f"wrote docs/{name}.svg")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
