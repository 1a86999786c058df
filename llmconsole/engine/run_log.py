"""An engine's log for its current run, read as it grows: what its status needs from it.

vLLM tells some things only in its log: how far a start has come, which decode kernel runs (and
a custom kernel's counters), the KV-cache facts once it is up and the reason it died. The
scraper follows the log (`follow`, one stat a tick and a read only of what was appended) and
keeps what the status shows; a status read never opens the file. The whole run's text is read
only at the moments that need it (ready: the KV facts; exit: the reason).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from llmconsole.engine.startup_log import StartPhase, StartPhaseReader, StartupFacts, failure_reason, parse_facts
from llmconsole.kernels.usage import KernelLogReader, KernelReport

# At most this much is read a tick: an engine that floods its log is followed over several.
FOLLOW_CHUNK_BYTES = 8 << 20


class RunLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._start = 0  # where the current run's lines begin (the launch line's end)
        self._pos = 0  # how far the log has been followed
        self._partial = ""  # a line not yet ended
        self.kernel = KernelLogReader()
        self._phase = StartPhaseReader()

    def run_began(self, offset: int) -> None:
        """A run starts at byte `offset` of the log. An adopted engine's run is followed from 0:
        the kernel reader starts over at each launch's marker, and the phase counts from the
        engine's own first line (see `follow_pid`)."""
        self._start = self._pos = offset
        self._partial = ""
        self.kernel = KernelLogReader()
        self._phase = StartPhaseReader()

    def follow_pid(self, pid: int) -> None:
        """The run's API server is `pid`: only its lines on say how far its start has come."""
        if self._phase.pid != pid:
            self._phase = StartPhaseReader(pid)

    def follow(self) -> bool:
        """Read what the log gained since the last look. True when what it says moved on (a new
        start phase, or any line the kernel reader keeps): the status then has news."""
        try:
            if os.stat(self.path).st_size <= self._pos:
                return False
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read(FOLLOW_CHUNK_BYTES)
        except OSError:
            return False
        self._pos += len(data)
        text = data.decode("utf-8", errors="replace")
        kernel_before = self.kernel_said()
        self.kernel.feed(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        moved = self._phase.feed_lines(lines)
        return moved or self.kernel_said() != kernel_before

    def kernel_said(self) -> KernelReport:
        """What the kernel lines say, ready or not (for telling whether a piece said anything)."""
        return self.kernel.report("custom", True)

    @property
    def start_phase(self) -> StartPhase:
        return self._phase.phase

    def text(self) -> str:
        """The current run's log, whole (read at ready and at exit only)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._start)
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def startup_facts(self) -> StartupFacts | None:
        return parse_facts(self.text())

    def failure_reason(self) -> str | None:
        return failure_reason(self.text())


def begin_run(log_path: Path, name: str, config_id: str, argv: list[str]) -> int:
    """Append the line that opens a launch's part of the engine's log (the log is the operator's
    to read: 0600, never through a link) and return where the run's own lines begin."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        os.fchmod(fd, 0o600)
        f.write(
            f"\n----- llmconsole: launching engine {name} (config {config_id}) "
            f"at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} -----\n$ {' '.join(argv)}\n"
        )
        f.flush()
        return f.tell()
