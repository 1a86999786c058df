"""What the sweep and tune screens share, as plain functions: durations, params, and a form's
fields checked and named the way the screens report them (the typed requests in engine/sweep
and engine/tune then check the rest exactly as they do for the CLI).

No Textual here: these are the parts with fast unit tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def fmt_duration(seconds: float | None) -> str:
    """`45 s`, `3 min 05 s`, `1 h 02 min`; N/A when there is no figure yet."""
    if seconds is None:
        return "N/A"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def params_text(params: Mapping[str, Any]) -> str:
    """`max_num_seqs=8, concurrency=2`, as the CLI's progress lines and the sweep table print them."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def ticked(elapsed_s: float, eta_s: float | None, since_s: float) -> tuple[float, float | None]:
    """Elapsed and time left `since_s` after an event said (elapsed_s, eta_s): the screen ticks
    between events, and time left never goes below zero while a point overruns its estimate."""
    since_s = max(0.0, since_s)
    return elapsed_s + since_s, None if eta_s is None else max(0.0, eta_s - since_s)


def split_items(text: str) -> list[str]:
    """`max_num_seqs=4,8; max_model_len=512,1024` into the items a repeated CLI flag would hold."""
    return [t for t in re.split(r"[;\s]+", text.strip()) if t]


def whole_number(text: str, what: str, minimum: int = 1) -> int:
    """A form's number field; ValueError names the field and what it must be."""
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{what} must be a whole number, got {text.strip()!r}") from None
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return value


def length(text: str, what: str) -> str:
    """A form's token-length field, checked as the CLI will parse it; ValueError names the field."""
    from llmconsole.engine.load.workload import LengthDist

    try:
        LengthDist.parse(text.strip())
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    return text.strip()
