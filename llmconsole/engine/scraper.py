"""What a running engine says of itself: its log, its /metrics page, its processes' memory and CPU.

One `EngineScraper` per supervisor, and one loop per run of the engine, from its launch (or
adoption) to its exit. Every tick it follows the engine's log (start phase, kernel: see
engine/run_log.py); once the engine serves it also scrapes /metrics into a window and samples
its process tree. Each tick that learnt something calls `on_scraped`, and the supervisor
publishes a new status: the scraper keeps the latest values, it never publishes itself.

Poll, then re-arm: the next tick is scheduled only after this one finished, so a slow engine
stretches the period instead of piling up requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from llmconsole.engine.host import HostProbe, ProcessSample
from llmconsole.engine.metrics.page import parse_metrics
from llmconsole.engine.metrics.window import MetricsWindow, WindowedMetrics
from llmconsole.engine.run_log import RunLog
from llmconsole.engine.tasks import cancel_and_wait

_MIN_PAUSE_S = 0.05


class EngineScraper:
    def __init__(
        self,
        name: str,
        log_path: Path,
        http: aiohttp.ClientSession,
        interval_s: float,
        probe: HostProbe | None,
        on_scraped: Callable[[], None],
    ) -> None:
        self.name = name
        self.log = RunLog(log_path)
        self.interval_s = interval_s
        self._http = http
        self._probe = probe
        self._on_scraped = on_scraped
        self.metrics: WindowedMetrics | None = None
        self.process: ProcessSample | None = None
        self.task: asyncio.Task[None] | None = None
        self._serving = asyncio.Event()

    def run_began(self, log_offset: int) -> None:
        """A new run: its log from `log_offset` on, no metrics yet. (An adopted engine's is
        followed from the log's start: see RunLog.run_began.)"""
        self.log.run_began(log_offset)
        self.metrics = None

    def watch(self, url: str, pid: int) -> None:
        """Follow the run of process `pid`, serving at `url` once it is ready (see `serving`)."""
        if self.task is None or self.task.done():
            self.log.follow_pid(pid)
            self._serving = asyncio.Event()
            self.task = asyncio.create_task(self._loop(url, pid), name=f"scrape-{self.name}")

    def serving(self) -> None:
        """The engine is ready: scrape it from now on, the first time at once."""
        self._serving.set()

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            await cancel_and_wait(task)

    async def _loop(self, url: str, pid: int) -> None:
        window = MetricsWindow()
        timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s * 2))
        while True:
            began = time.monotonic()
            news = self.log.follow()
            if self._serving.is_set():
                self.metrics = await self._scrape(f"{url}/metrics", window, timeout)
                if self._probe is not None:
                    self.process = self._probe.sample_process(pid)
                news = True
            if news:
                self._on_scraped()
            pause = max(_MIN_PAUSE_S, self.interval_s - (time.monotonic() - began))
            if self._serving.is_set():
                await asyncio.sleep(pause)
            else:  # starting: wake at once when it is ready, for its first scrape
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._serving.wait(), pause)

    async def _scrape(self, url: str, window: MetricsWindow, timeout: aiohttp.ClientTimeout) -> WindowedMetrics:
        try:
            async with self._http.get(url, timeout=timeout) as r:
                if r.status != 200:
                    raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message="bad status")
                text = await r.text()
            return window.add(parse_metrics(text, time.monotonic()))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # unreachable or malformed: stale, counted, never fatal
            return window.failed(f"{type(e).__name__}: {e}", time.monotonic())
