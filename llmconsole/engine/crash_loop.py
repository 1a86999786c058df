"""An engine's failed runs in a row: restart it after a backoff, or give up on its config.

What counts as a failed run and when a streak is a crash loop is kept apart from the supervisor
that acts on it, so the arithmetic can be read (and tested) on its own.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from llmconsole.engine.supervision_policy import SupervisionPolicy


@dataclass(frozen=True)
class RestartDecision:
    give_up: str | None  # why supervision stops restarting the engine; None: restart it
    delay_s: float  # the backoff before that restart


class FailureCounter:
    """Counts an engine's failed runs, to choose between a restart after a backoff and giving up.

    A run failed when it ended before it was stable: it never became ready (it exited, or hung
    past the start timeout and was killed), or it served for less than `stable_after_s`. Failed
    runs in a row are a loop whatever each one lasted: a model that takes minutes to load loops
    as surely as one that dies in a second. A run that was stable ends the streak (its crash is
    the first of a new one); crashes that come fast, stable or not, are a loop as well when
    `crash_loop_count` of them fall within `crash_loop_window_s`. The backoff doubles with each
    failed run in a row, up to `backoff_max_s`.
    """

    def __init__(self, policy: SupervisionPolicy) -> None:
        self.policy = policy
        self.consecutive = 0
        self._times: collections.deque[float] = collections.deque()

    def reset(self) -> None:
        self.consecutive = 0
        self._times.clear()

    def served(self) -> None:
        """The current run became stable: the streak of failed runs is over."""
        self.consecutive = 0

    def record(self, now: float, stable: bool) -> RestartDecision:
        """A run ended at `now` (monotonic seconds); `stable`: it had served long enough."""
        p = self.policy
        self.consecutive = 1 if stable else self.consecutive + 1
        self._times.append(now)
        while self._times and now - self._times[0] > p.crash_loop_window_s:
            self._times.popleft()
        give_up = None
        if self.consecutive >= p.crash_loop_count:
            give_up = f"{self.consecutive} runs in a row ended before serving {p.stable_after_s:.0f} s"
        elif len(self._times) >= p.crash_loop_count:
            give_up = f"{len(self._times)} crashes in {p.crash_loop_window_s:.0f} s"
        delay = min(p.backoff_max_s, p.backoff_initial_s * (2 ** (self.consecutive - 1)))
        return RestartDecision(give_up, delay)
