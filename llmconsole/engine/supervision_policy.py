"""How the daemon supervises an engine: the policy's numbers, apart from the supervisor.

Its own module so that the settings (and through them every `llmconsole` command) can name the
policy's fields and defaults without importing the supervisor and its HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SupervisionPolicy:
    poll_interval_s: float = 0.5  # how often the process is checked for exit
    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    health_failures_to_crash: int = 3
    scrape_interval_s: float = 1.0
    start_timeout_s: float = 900.0  # model loads on big GPUs can take many minutes
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    stable_after_s: float = 60.0  # ready this long: the run succeeded, the streak ends
    crash_loop_count: int = 3  # this many failed runs in a row (whatever each lasted),
    crash_loop_window_s: float = 300.0  # or this many crashes within this window: give up
    drain_timeout_s: float = 30.0
