"""Polling until something holds, with a message that says what never came and what was seen last."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _shown(value: Any) -> str:
    """A multi-line text (a screen, a log) as it reads; anything else as its repr."""
    return f"\n{value}" if isinstance(value, str) and "\n" in value else f" {value!r}"


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.5,
    what: str | Callable[[], str] = "",
    *,
    ok: Callable[[T], bool] | None = None,
) -> T:
    """Call `predicate` every `interval_s` until its value is truthy (or, given `ok`, until
    `ok(value)`), and return that value. After `timeout_s` raise AssertionError naming `what`
    (a string, or a callable read only then, such as a log's tail) and the last value seen.
    Exceptions from `predicate` propagate: a check that must fail at once can assert inside it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if ok(value) if ok is not None else value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            said = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {said or predicate}; last value:{_shown(value)}"
            )
        time.sleep(min(interval_s, left))


async def pilot_wait(
    pilot, predicate: Callable[[], Any], what: str, timeout_s: float = 3.0, interval_s: float = 0.01
) -> None:
    """wait_until for the console under a Textual pilot: `predicate` is checked between pauses of
    the app, at most timeout_s / interval_s times (a pause takes longer on a busy host: the count,
    not the clock, bounds the wait)."""
    for _ in range(round(timeout_s / interval_s)):
        if predicate():
            return
        await pilot.pause(interval_s)
    raise AssertionError(f"timed out waiting for {what}")
