"""Cut an engine log down to a time span, for an export.

vLLM stamps its lines `INFO 12-02 18:46:31 [file.py:1] ...` in local time and without a year;
our own logs use ISO dates. Lines without a stamp (tracebacks, warnings, banners) belong to the
stamped line before them, so a traceback is kept or dropped together with its error line.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TextIO

_VLLM_STAMP = re.compile(
    r"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<mon>\d\d)-(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
)
_ISO_STAMP = re.compile(r"^\[?(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def line_time(line: str, near_s: float) -> float | None:
    """The epoch time a line is stamped with, or None; a yearless stamp takes the year near `near_s`."""
    m = _ISO_STAMP.match(line)
    if m:
        try:
            dt = datetime.fromisoformat(m["iso"].replace("Z", "+00:00"))
        except ValueError:
            return None
        return dt.timestamp()  # naive stamps are local time, as the logger wrote them
    m = _VLLM_STAMP.match(line)
    if not m:
        return None
    year = time.localtime(near_s).tm_year
    best = None
    for y in (year - 1, year, year + 1):  # a span across New Year
        try:
            t = datetime(y, int(m["mon"]), int(m["day"]), int(m["h"]), int(m["m"]), int(m["s"])).timestamp()
        except ValueError:
            continue
        if best is None or abs(t - near_s) < abs(best - near_s):
            best = t
    return best


def clip_lines(lines: Iterable[str], since_s: float | None, until_s: float | None) -> Iterator[str]:
    """The lines stamped within [since_s, until_s] (whole seconds), with their unstamped followers."""
    near_s = since_s if since_s is not None else (until_s if until_s is not None else time.time())
    pending: list[str] = []  # unstamped lines at the top of the file: kept if the first stamp is in
    keeping: bool | None = None
    for line in lines:
        t = line_time(line, near_s)
        if t is not None:
            keeping = (since_s is None or t >= int(since_s)) and (until_s is None or t < int(until_s) + 1)
            if pending:
                if keeping:
                    yield from pending
                pending = []
        if keeping is None:
            pending.append(line)
        elif keeping:
            yield line
    if keeping is None:
        yield from pending  # nothing in the file is stamped: keep it all rather than guess


def clip_file(
    src: Path, dst: TextIO, since_s: float | None, until_s: float | None, scrub_line: Callable[[str], str] = lambda s: s
) -> int:
    """Copy the part of `src` within the span to `dst`, each line through `scrub_line`; lines written."""
    n = 0
    with open(src, encoding="utf-8", errors="replace") as f:
        for line in clip_lines(f, since_s, until_s):
            dst.write(scrub_line(line))
            n += 1
    return n
