"""How often an engine's attention ran llmconsole's kernel, and how often (and why) it fell back.

Three kinds of attention call: all rows in the kernel (a decode-only step); split (a step
mixing decode and prefill rows: the decode rows in the kernel, the prefill rows in vLLM's op);
and fallback (vLLM's op for the whole call, counted per reason). Tokens are counted per kind,
so a log says both how many calls and how much of the work each path took.

The counters live in each vLLM worker process. They reach the operator through the engine's
log, which the daemon already keeps: one line when the kernel first runs, one line the first
time each fallback reason occurs, and a cumulative counters line whenever the counts changed
in the last few seconds. Every line starts with LOG_PREFIX; the counters line carries JSON so
`parse_usage` can read it back without guessing at a format.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

LOG_PREFIX = "llmconsole-kernel:"
_COUNTERS_TAG = "counters "
_COUNTERS_LINE = re.compile(re.escape(LOG_PREFIX) + r" " + re.escape(_COUNTERS_TAG) + r"(\{.*\})")
# How often the reporter thread looks for changed counts. Short enough that a test or the
# console sees decode traffic within seconds; idle engines log nothing.
REPORT_EVERY_S = 2.0


@dataclass(frozen=True)
class KernelUsage:
    """Counts summed over an engine's worker processes."""

    decode_calls: int = 0  # calls in which the kernel ran: decode-only and split calls
    decode_tokens: int = 0  # query tokens the kernel computed
    split_calls: int = 0  # of decode_calls, those whose prefill rows went to vLLM's op
    split_prefill_tokens: int = 0  # query tokens of those prefill rows
    fallback_calls: dict[str, int] = field(default_factory=dict)  # whole calls in vLLM's op
    fallback_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def total_fallback_calls(self) -> int:
        return sum(self.fallback_calls.values())

    @property
    def total_fallback_tokens(self) -> int:
        return sum(self.fallback_tokens.values())

    @property
    def calls(self) -> int:
        """All attention calls counted (each layer of each step is one)."""
        return self.decode_calls + self.total_fallback_calls

    @property
    def vllm_tokens(self) -> int:
        """Query tokens vLLM's op computed: whole fallbacks plus split calls' prefill rows."""
        return self.total_fallback_tokens + self.split_prefill_tokens

    def minus(self, earlier: KernelUsage) -> KernelUsage:
        """The counts since `earlier` (an earlier reading of the same engine)."""

        def sub(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            return {k: a.get(k, 0) - b.get(k, 0) for k in a if a.get(k, 0) - b.get(k, 0)}

        return KernelUsage(
            self.decode_calls - earlier.decode_calls,
            self.decode_tokens - earlier.decode_tokens,
            self.split_calls - earlier.split_calls,
            self.split_prefill_tokens - earlier.split_prefill_tokens,
            sub(self.fallback_calls, earlier.fallback_calls),
            sub(self.fallback_tokens, earlier.fallback_tokens),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode_calls": self.decode_calls,
            "decode_tokens": self.decode_tokens,
            "split_calls": self.split_calls,
            "split_prefill_tokens": self.split_prefill_tokens,
            "fallback_calls": dict(self.fallback_calls),
            "fallback_tokens": dict(self.fallback_tokens),
        }


def parse_usage(log_text: str) -> KernelUsage | None:
    """The latest counters of each worker process in an engine log, summed; None when the
    log has no counters line (a stock engine, or a custom one that has not decoded yet)."""
    latest: dict[int, dict[str, Any]] = {}  # worker pid -> its counters line
    for match in _COUNTERS_LINE.finditer(log_text):
        try:
            data = json.loads(match.group(1))
            latest[int(data["pid"])] = data
        except (ValueError, KeyError, TypeError):
            continue
    if not latest:
        return None

    def total(key: str) -> int:
        return sum(int(d.get(key, 0)) for d in latest.values())

    def by_reason(key: str) -> dict[str, int]:
        sums: dict[str, int] = {}
        for data in latest.values():
            for reason, n in data.get(key, {}).items():
                sums[reason] = sums.get(reason, 0) + int(n)
        return sums

    return KernelUsage(
        decode_calls=total("decode_calls"),
        decode_tokens=total("decode_tokens"),
        split_calls=total("split_calls"),
        split_prefill_tokens=total("split_prefill_tokens"),
        fallback_calls=by_reason("fallback_calls"),
        fallback_tokens=by_reason("fallback_tokens"),
    )


# The lines that say which kernel an engine runs, logged by its own processes: the backend when
# its kernel loaded (or failed to), the plugin when it would not install a backend, the backend
# when a layer keeps vLLM's attention whatever the batch. The engine's word, not the spec's.
LOADED_TAG = "custom decode kernel loaded from"
UNAVAILABLE_TAG = "custom decode kernel unavailable, vLLM's attention runs instead:"
IGNORED_TAG = "ignored:"
LAYER_KEPT_TAG = "attention layer kept on vLLM's attention:"
# The line the supervisor writes before each launch: what follows belongs to that run alone.
LAUNCH_MARKER = "----- llmconsole: launching engine"


@dataclass(frozen=True)
class KernelReport:
    """Which decode attention an engine runs, as its log says. kernel: "custom" (its attention
    backend loaded llmconsole's kernel), "stock" (vLLM's own), or None (not said yet); note: why
    it is not what was asked, or what is still unknown."""

    kernel: str | None
    note: str | None = None
    usage: KernelUsage | None = None


class KernelLogReader:
    """Reads an engine's log as it grows (feed() each new piece) and reports its kernel. Keeps
    only what matters: the kernel lines and each worker's latest counters."""

    def __init__(self) -> None:
        self._partial = ""
        self._reset()

    def _reset(self) -> None:
        self._loaded = False
        self._unavailable: str | None = None
        self._ignored: str | None = None
        self._kept: dict[str, None] = {}
        self._counters: dict[int, str] = {}

    def feed(self, text: str) -> None:
        text = self._partial + text
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(LAUNCH_MARKER):
                self._reset()
                continue
            at = line.find(LOG_PREFIX)
            if at < 0:
                continue
            said = line[at + len(LOG_PREFIX) :].strip()
            if said.startswith(_COUNTERS_TAG):
                match = _COUNTERS_LINE.search(line)
                if match:
                    try:
                        self._counters[int(json.loads(match.group(1))["pid"])] = line[match.start() :]
                    except (ValueError, KeyError, TypeError):
                        pass
            elif said.startswith(LOADED_TAG):
                self._loaded = True
            elif said.startswith(UNAVAILABLE_TAG):
                self._unavailable = said.removeprefix(UNAVAILABLE_TAG).strip()
            elif LAYER_KEPT_TAG in said:
                self._kept[said.split(LAYER_KEPT_TAG, 1)[1].strip()] = None
            elif IGNORED_TAG in said:
                self._ignored = said

    def report(self, requested: str, ready: bool) -> KernelReport:
        """What the engine runs, given the kernel its spec asked for and whether it is ready (by
        then every attention layer of a vLLM engine has been built, and has said so)."""
        usage = parse_usage("\n".join(self._counters.values())) if self._counters else None
        if requested != "custom":
            return KernelReport("stock", None, usage)  # the plugin installs nothing unasked
        if self._unavailable is not None:
            return KernelReport("stock", f"custom asked; {self._unavailable}", usage)
        if self._loaded:
            return KernelReport("custom", None, usage)
        if self._ignored is not None:
            return KernelReport("stock", f"custom asked; {self._ignored}", usage)
        if self._kept:
            return KernelReport(
                "stock", "custom asked; every attention layer stays vLLM's: " + "; ".join(self._kept), usage
            )
        if ready:
            return KernelReport(
                "stock",
                "custom asked, but the engine loaded no llmconsole attention "
                "backend (vLLM selected another, or the plugin did not run): see its log",
                usage,
            )
        return KernelReport(None, "custom asked; the engine has not said yet which kernel runs", usage)


class UsageCounter:
    """Per-process counters with the logging described above. Thread-safe; cheap per call."""

    def __init__(self, logger: logging.Logger, report_every_s: float = REPORT_EVERY_S):
        self._log = logger
        self._lock = threading.Lock()
        self._decode_calls = 0
        self._decode_tokens = 0
        self._split_calls = 0
        self._split_prefill_tokens = 0
        self._fallbacks: dict[str, int] = {}
        self._fallback_tokens: dict[str, int] = {}
        self._kept: set[str] = set()
        self._reported: tuple[int, int, int, tuple[tuple[str, int], ...]] | None = None
        self._report_every_s = report_every_s
        self._reporter: threading.Thread | None = None

    def decode(self, num_tokens: int) -> None:
        with self._lock:
            first = self._decode_calls == 0
            self._decode_calls += 1
            self._decode_tokens += num_tokens
        if first:
            self._log.info("%s custom decode kernel ran its first batch (%d sequences)", LOG_PREFIX, num_tokens)
            self._start_reporter()

    def split(self, decode_tokens: int, prefill_tokens: int) -> None:
        """A mixed call: decode_tokens rows in the kernel, prefill_tokens in vLLM's op."""
        with self._lock:
            first = self._split_calls == 0
            self._split_calls += 1
            self._split_prefill_tokens += prefill_tokens
        if first:
            self._log.info(
                "%s mixed batch split: %d decode rows in the custom kernel, %d "
                "prefill tokens in vLLM's attention (logged once, counted)",
                LOG_PREFIX,
                decode_tokens,
                prefill_tokens,
            )
        self.decode(decode_tokens)

    def fallback(self, reason: str, num_tokens: int = 0) -> None:
        with self._lock:
            first = reason not in self._fallbacks
            self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1
            self._fallback_tokens[reason] = self._fallback_tokens.get(reason, 0) + num_tokens
        if first:
            self._log.info("%s falling back to vLLM's attention for %s (logged once, counted)", LOG_PREFIX, reason)
            self._start_reporter()

    def layer_kept(self, reason: str) -> None:
        """A layer that never runs the kernel (its attention is one the kernel does not cover):
        said once per reason, when the layer is built, so the engine's log tells before any
        step whether the kernel can run at all."""
        with self._lock:
            first = reason not in self._kept
            self._kept.add(reason)
        if first:
            self._log.info("%s %s %s", LOG_PREFIX, LAYER_KEPT_TAG, reason)

    def snapshot(self) -> KernelUsage:
        with self._lock:
            return KernelUsage(
                self._decode_calls,
                self._decode_tokens,
                self._split_calls,
                self._split_prefill_tokens,
                dict(self._fallbacks),
                dict(self._fallback_tokens),
            )

    def report(self) -> bool:
        """Log the counters line if anything changed since the last one; True if it logged."""
        usage = self.snapshot()
        key = (usage.decode_calls, usage.decode_tokens, usage.split_calls, tuple(sorted(usage.fallback_calls.items())))
        if key == self._reported:
            return False
        self._reported = key
        self._log.info(
            "%s %s%s", LOG_PREFIX, _COUNTERS_TAG, json.dumps({"pid": os.getpid(), **usage.as_dict()}, sort_keys=True)
        )
        return True

    def _start_reporter(self) -> None:
        with self._lock:
            if self._reporter is not None:
                return
            self._reporter = threading.Thread(target=self._report_loop, daemon=True, name="llmconsole-kernel-usage")
        self._reporter.start()

    def _report_loop(self) -> None:
        while True:
            time.sleep(self._report_every_s)
            try:
                self.report()
            except Exception:  # logging must never take the engine down
                pass
