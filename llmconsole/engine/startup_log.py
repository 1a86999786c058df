"""What an engine's log says about its start: KV-cache facts, readiness, and why it failed.

vLLM prints the facts an operator needs (how many tokens of KV cache, the maximum concurrency at
max_model_len) only in its startup log, and its reasons for failing only as a traceback there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# "CPU KV cache size: 6,144 tokens, Maximum concurrency for 512 tokens per request: 12.00x"
# GPU builds print "GPU KV cache size: ..." with the same shape.
_KV_LINE = re.compile(
    r"(?P<device>[A-Z]+) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.,]+)x"
)
_INIT_TOOK = re.compile(r"init engine \(.*?\) took (?P<s>[\d.]+) s")
_SERVING = re.compile(r"Starting vLLM (?:API )?server on (?P<url>\S+)")

# Exception lines worth showing, most specific first. vLLM raises ValueError for configs that
# cannot fit, RuntimeError for engine-core deaths; the last matching line of the first kind that
# appears is the operator's answer.
_ERROR_LINE = re.compile(
    r"^(?:.*?\s)?(?P<kind>ValueError|RuntimeError|OSError|torch\.OutOfMemoryError|"
    r"MemoryError|AssertionError|TypeError|KeyError|ImportError|ModuleNotFoundError|"
    r"FileNotFoundError|NotImplementedError|pydantic_core\._pydantic_core\.ValidationError|"
    r"\w+Error): (?P<msg>.+)$"
)
_ARG_ERROR = re.compile(r"error: (?P<msg>(?:unrecognized arguments|argument ).+)$")

# Errors that only wrap the real one further up.
_WRAPPER_MESSAGES = ("Engine core initialization failed", "EngineCore failed to start")


@dataclass(frozen=True)
class StartupFacts:
    device: str
    kv_cache_tokens: int
    max_concurrency_len: int
    max_concurrency: float
    init_engine_s: float | None = None


def parse_facts(text: str) -> StartupFacts | None:
    m = _KV_LINE.search(text)
    if not m:
        return None
    took = _INIT_TOOK.search(text)
    return StartupFacts(
        device=m["device"],
        kv_cache_tokens=int(m["tokens"].replace(",", "")),
        max_concurrency_len=int(m["len"].replace(",", "")),
        max_concurrency=float(m["conc"].replace(",", "")),
        init_engine_s=float(took["s"]) if took else None,
    )


def failure_reason(text: str) -> str | None:
    """The line that explains why the engine died, or None if the log does not say."""
    arg = None
    found: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        a = _ARG_ERROR.search(line)
        if a:
            arg = a["msg"]
        m = _ERROR_LINE.match(line)
        if m and not any(w in m["msg"] for w in _WRAPPER_MESSAGES):
            found.append(f"{m['kind'].rsplit('.', 1)[-1]}: {m['msg'].strip()}")
    if arg:
        return f"vLLM rejected its arguments: {arg}"
    if not found:
        return None
    # The first specific error is the root cause; later ones are its echoes from other processes.
    for reason in found:
        if reason.startswith("ValueError"):
            return reason
    return found[0]


# vLLM's start, in the order its log reveals it: each phase with the lines that say it began
# (CPU and CUDA builds, engine core in or out of process). A phase whose lines never appear (no
# compile with --enforce-eager) is passed over; the latest phase seen is where the start is.
START_PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("launching (Python imports)", ()),
    ("reading the model's config", ("non-default args", "Resolved architecture")),
    ("starting the engine core", ("Initializing a V1 LLM engine", "Initializing an LLM engine")),
    ("loading weights", ("Starting to load model", "Loading safetensors checkpoint", "Loading weights")),
    ("profiling memory", ("Loading weights took", "Model loading took", "Memory profiling takes")),
    ("allocating the KV cache", ("Available KV cache memory", "GiB for KV cache", "# GPU blocks", "# CPU blocks")),
    (
        "compiling and warming up",
        (
            "KV cache size:",
            "Compiling a graph",
            "torch.compile takes",
            "Capturing CUDA graph",
            "Graph capturing finished",
            "Dynamo bytecode transform",
        ),
    ),
    ("starting the API server", ("init engine (profile, create kv cache, warmup model) took", "Starting vLLM")),
    ("waiting for the health check", ("Application startup complete",)),
)


@dataclass(frozen=True)
class StartPhase:
    step: int  # 0-based, in START_PHASES
    steps: int
    name: str


def start_phase(text: str, pid: int | None = None) -> StartPhase:
    """Where a start is, from its log. The log is appended across runs: with the engine's `pid`
    only the lines from its own first line on count (vLLM prefixes them `(APIServer pid=N)`), so
    an earlier run's lines never read as progress; before that line it is still launching."""
    reader = StartPhaseReader(pid)
    reader.feed_lines(text.splitlines())
    return reader.phase


class StartPhaseReader:
    """`start_phase` for a log read as it grows: fed its lines a piece at a time, it keeps only
    the furthest phase seen, so following a start never reads the log twice."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._counting = pid is None
        self._step = 0

    def feed_lines(self, lines: list[str]) -> bool:
        """Whole lines of the log, in order. True when the phase moved."""
        before = self._step
        own = f"pid={self.pid})"
        for line in lines:
            if not self._counting:
                if own not in line:
                    continue
                self._counting = True
            for i in range(len(START_PHASES) - 1, self._step, -1):
                if any(m in line for m in START_PHASES[i][1]):
                    self._step = i
                    break
        return self._step != before

    @property
    def phase(self) -> StartPhase:
        return StartPhase(self._step, len(START_PHASES), START_PHASES[self._step][0])


def read_tail(path: Path, max_bytes: int = 256 * 1024) -> str:
    """The end of a log file (start-up reasons are near the end; logs can grow large)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
