"""Real memory pressure for the auto memory mode's tests: a process that holds host memory.

The auto policy watches the share of host memory in use (total less available, as psutil
reads it), so the ballast holds whatever share the test asks for: it measures the host, takes
or gives back memory in 64 MiB blocks written through (untouched pages would not count), and
keeps doing so while engines, the test and the host's other tenants come and go. It runs as a
process of its own so that its memory goes back to the host the moment it ends, and it ends by
itself when its parent closes its stdin (a test killed half-way leaves no ballast behind).

    python -m tests.support.ballast     # then write a fraction per line on stdin: 0.65, 0.52, 0
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

BLOCK_BYTES = 64 << 20
TOLERANCE = 0.01  # of total memory: the band the ballast leaves alone
MOST = 0.85  # never asked to hold more than this share of the host


def used_fraction() -> float:
    vm = psutil.virtual_memory()
    return (vm.total - vm.available) / vm.total


class Ballast:
    """The ballast process, driven from a test: `hold(f)` keeps host memory in use at about f."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.ballast"],
            stdin=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=Path(__file__).resolve().parents[2],  # the repository root: tests.support imports from there
        )

    def hold(self, fraction: float) -> None:
        if not 0 <= fraction <= MOST:
            raise ValueError(f"a ballast holds between 0 and {MOST:.0%} of host memory, not {fraction}")
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{fraction}\n")

    def __enter__(self) -> Ballast:
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the ballast's cue to end
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def _main() -> None:
    target = [0.0]
    ended = threading.Event()

    def read() -> None:
        for line in sys.stdin:
            target[0] = min(MOST, max(0.0, float(line)))
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    blocks: list[bytes] = []
    total = psutil.virtual_memory().total
    while not ended.is_set():
        gap_bytes = (target[0] - used_fraction()) * total
        if gap_bytes > TOLERANCE * total:
            for _ in range(int(gap_bytes // BLOCK_BYTES)):
                blocks.append(b"\x01" * BLOCK_BYTES)  # written, so resident
        elif gap_bytes < -TOLERANCE * total:
            for _ in range(min(len(blocks), int(-gap_bytes // BLOCK_BYTES))):
                blocks.pop()
        time.sleep(0.2)


if __name__ == "__main__":
    _main()
