"""Render the README's console screenshots (SVG, by Textual) from the recorded status stream.

    .venv/bin/python docs/make_screenshots.py        # writes docs/console.svg, docs/history.svg
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_tui_support import frames, history_frame, recorded_app, replay  # noqa: E402


async def shoot(name: str, keys: list[str], extra=None) -> None:
    app, _ = recorded_app(extra)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay(pilot)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        app.save_screenshot(filename=f"{name}.svg", path=str(ROOT / "docs"))


async def main() -> None:
    current = frames()[-1]["status"]["engines"][0]["config_id"]
    await shoot("console", [])
    await shoot("history", ["h", "down"], [history_frame(current)])


if __name__ == "__main__":
    asyncio.run(main())
    print("wrote docs/console.svg and docs/history.svg")
