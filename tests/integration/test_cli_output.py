"""The CLI's output: in a pipe whose reader goes away (`status --json | head`) no traceback and
the exit status a shell expects of a process the pipe ended; a window signal with no samples
said as such."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from tests.support.daemon import Cli


def _closed_pipe_stdout() -> tuple[io.TextIOWrapper, int]:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    return io.TextIOWrapper(io.FileIO(w, "w"), write_through=False), w


def test_status_json_into_a_closed_pipe_ends_quietly(home):
    c = Cli(home)
    c("daemon", "start")
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmconsole.console.cli", "status", "--json"],
        env=c.env,
        stdout=w,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    os.close(w)
    os.close(r)  # as `head` does once it has its lines
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141
