"""Fault-injection points, for tests only: inert unless LLMCONSOLE_TEST_PAUSE_AT is set.

A test that must kill the daemon at an exact phase of a restart (engine/supervisor.py's
PAUSE_PHASES: the intent saved, the old process stopped, the new one starting) starts the daemon
with LLMCONSOLE_TEST_PAUSE_AT=<phase>. When a restart reaches that phase, the daemon writes the
phase and the engine's name to `fault-paused` in its data directory and waits there for ever,
so the test can kill -9 it at that point and no other. Without the variable nothing here runs:
the supervisor is given no pause hook at all.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from llmconsole.engine.supervisor import PAUSE_PHASES, PauseAt

log = logging.getLogger(__name__)

# Read from the environment here, not through llmconsole/settings: a test-only hook, no setting an
# operator has, so `llmconsole config show` and docs/settings.md leave it out.
PAUSE_ENV = "LLMCONSOLE_TEST_PAUSE_AT"
MARKER_NAME = "fault-paused"


def pause_hook(data_dir: Path, environ: Mapping[str, str] | None = None) -> PauseAt | None:
    """The supervisor's pause hook for the phase $LLMCONSOLE_TEST_PAUSE_AT names, or None when
    it names none. An unknown phase is a ValueError (the daemon refuses to start, saying why)."""
    phase = (os.environ if environ is None else environ).get(PAUSE_ENV, "")
    if not phase:
        return None
    if phase not in PAUSE_PHASES:
        raise ValueError(f"{PAUSE_ENV}={phase!r}: not a fault-injection point (known: {', '.join(PAUSE_PHASES)})")
    marker = data_dir / MARKER_NAME

    async def pause(engine: str, at: str) -> None:
        if at != phase:
            return
        log.warning("fault injection (%s): engine %s paused at %s until the daemon is killed", PAUSE_ENV, engine, at)
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(f"{at} {engine} {os.getpid()}\n")
        os.replace(tmp, marker)
        await asyncio.Event().wait()  # for ever: the test kills the daemon here

    return pause
