"""A restart under way, and the phases of it where the daemon's death must be survivable.

A restart (an operator's, a rollback, a mode switch) is recorded as the engine's pending change
before the old process is stopped; the fleet writes it to its state file, and a daemon that
starts finds it there and carries it on (engine/supervisor.py, Fleet._load_one).

`PAUSE_PHASES` are fault-injection points for tests, inert unless a `PauseAt` is given (the
daemon gives one only when LLMCONSOLE_TEST_PAUSE_AT is set: daemon/fault_points.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmconsole.engine.spec import EngineSpec

# The phases of a restart where the daemon's death must leave a state the next daemon resumes:
# the intent saved (the old process still runs), the old process stopped (none runs), the new
# one launched and starting.
PAUSE_INTENT_SAVED = "restart-intent-saved"
PAUSE_OLD_STOPPED = "restart-old-stopped"
PAUSE_NEW_STARTING = "restart-new-starting"
PAUSE_PHASES = (PAUSE_INTENT_SAVED, PAUSE_OLD_STOPPED, PAUSE_NEW_STARTING)

PauseAt = Callable[[str, str], Awaitable[None]]  # (engine name, phase)


@dataclass(frozen=True)
class PendingChange:
    """A restart under way: the config it goes to and the one it leaves. `action_id`: the
    action in the store that asked for it, ended with `done_outcome` once the target serves (or
    `failed`, `cancelled`) through the fleet's change listeners; None for a caller that records
    its own outcome (a guarded apply) or for a change a previous daemon left (its action was
    closed as interrupted)."""

    target: EngineSpec
    from_config_id: str
    action_id: int | None = None
    done_outcome: str = "done"
