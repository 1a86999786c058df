"""Request traces: what arrived when, with how many prompt and output tokens, read from a file.

A trace is replayed through the load generator (generator.run_trace) with its arrival times
divided by a time scale, so a day can be replayed in minutes with its shape intact. Three CSV
layouts are read, told apart by their header row:

  llmconsole   arrival_s,input_tokens,output_tokens[,stream][,priority]  (bench/make_traces.py)
  Azure        TIMESTAMP,ContextTokens,GeneratedTokens  (the Azure LLM inference traces, 2023/2024)
  BurstGPT     Timestamp,Model,Request tokens,Response tokens,...  (seconds from the trace's start)

Arrival times are made relative to the earliest request. A bad file is an error naming the
line and what is wrong, never a silently shorter replay.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path


class TraceError(ValueError):
    """The trace cannot be read; the message names the file, the line and what is wrong."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # since the trace's first request
    input_tokens: int
    output_tokens: int
    stream: bool = True
    priority: int = 0  # sent only when not 0 (the engine must run priority scheduling)


# header (lower case, stripped) -> (arrival column, input column, output column, arrival kind)
_LAYOUTS: dict[str, tuple[str, str, str, str]] = {
    "llmconsole": ("arrival_s", "input_tokens", "output_tokens", "seconds"),
    "azure": ("timestamp", "contexttokens", "generatedtokens", "datetime"),
    "burstgpt": ("timestamp", "request tokens", "response tokens", "seconds"),
}
FORMATS = tuple(_LAYOUTS)


def _layout(header: Sequence[str]) -> str:
    cols = {h.strip().lower() for h in header}
    for name, (t, i, o, _kind) in _LAYOUTS.items():
        if {t, i, o} <= cols:
            return name
    raise TraceError(
        f"header {','.join(header)!r} is none of the trace formats read: "
        "arrival_s,input_tokens,output_tokens (llmconsole), TIMESTAMP,ContextTokens,GeneratedTokens "
        "(Azure LLM inference traces) or Timestamp,Model,Request tokens,Response tokens (BurstGPT)"
    )


def _arrival(text: str, kind: str) -> float:
    if kind == "seconds":
        v = float(text)
        if not math.isfinite(v):
            raise ValueError(f"{text!r} is not a finite number of seconds")
        return v
    # Azure writes seven fractional digits ("2023-11-16 18:15:46.6805900"); Python reads six.
    head, dot, frac = text.strip().partition(".")
    return datetime.fromisoformat(head + (dot + frac[:6] if dot else "")).timestamp()


def _tokens(text: str, what: str, low: int) -> int:
    try:
        n = int(float(text))
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number of tokens") from None
    if n < low:
        raise ValueError(f"{what} must be at least {low}, not {n}")
    return n


def _flag(text: str | None) -> bool:
    t = (text or "").strip().lower()
    if t in ("", "1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise ValueError(f"stream {text!r} is not true or false")


def parse_trace(lines: Iterable[str], source: str = "trace") -> tuple[TraceRequest, ...]:
    """The requests of a CSV trace in arrival order, the first at 0 s.

    A request with 0 prompt tokens is kept with 1 (a trace's rounding); 0 output tokens too,
    since an answer of no tokens cannot be timed."""
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{source} is empty")
    layout = _layout(header)
    t_col, i_col, o_col, kind = _LAYOUTS[layout]
    index = {h.strip().lower(): n for n, h in enumerate(header)}
    out: list[TraceRequest] = []
    for row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        line = reader.line_num
        try:
            if len(row) < len(header):
                raise ValueError(f"{len(row)} fields where the header has {len(header)}")
            out.append(
                TraceRequest(
                    _arrival(row[index[t_col]], kind),
                    max(1, _tokens(row[index[i_col]], "input tokens", 0)),
                    max(1, _tokens(row[index[o_col]], "output tokens", 0)),
                    _flag(row[index["stream"]]) if "stream" in index else True,
                    int(row[index["priority"]]) if "priority" in index and row[index["priority"]].strip() else 0,
                )
            )
        except ValueError as e:
            raise TraceError(f"{source}, line {line}: {e}") from None
    if not out:
        raise TraceError(f"{source} holds a header but no requests")
    out.sort(key=lambda r: r.arrival_s)
    t0 = out[0].arrival_s
    return tuple(replace(r, arrival_s=r.arrival_s - t0) for r in out)


def read_trace(path: str | Path) -> tuple[TraceRequest, ...]:
    p = Path(path).expanduser()
    try:
        with p.open(newline="", encoding="utf-8") as f:
            return parse_trace(f, str(p))
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p} is not a text (CSV) file") from None


def write_trace(path: str | Path, requests: Sequence[TraceRequest]) -> None:
    """The llmconsole layout, which read_trace reads back exactly (times to the millisecond)."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["arrival_s", "input_tokens", "output_tokens", "stream", "priority"])
        for r in requests:
            w.writerow([f"{r.arrival_s:.3f}", r.input_tokens, r.output_tokens, int(r.stream), r.priority])


def fit_to_context(requests: Sequence[TraceRequest], max_model_len: int) -> tuple[TraceRequest, ...]:
    """Requests that fit an engine of `max_model_len` tokens: a longer one keeps its output
    length (up to half the context) and loses prompt tokens, so the replay keeps its arrivals
    and stays long where the trace was long, on a small test model too."""
    if max_model_len < 2:
        raise ValueError("max_model_len must be at least 2 tokens")
    out = []
    for r in requests:
        if r.input_tokens + r.output_tokens <= max_model_len:
            out.append(r)
            continue
        o = min(r.output_tokens, max_model_len // 2)
        out.append(replace(r, input_tokens=max(1, min(r.input_tokens, max_model_len - o)), output_tokens=o))
    return tuple(out)


def trace_span_s(requests: Sequence[TraceRequest]) -> float:
    return requests[-1].arrival_s if requests else 0.0
