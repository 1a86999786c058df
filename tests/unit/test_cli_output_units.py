"""The CLI's output: in a pipe whose reader goes away (`status --json | head`) no traceback and
the exit status a shell expects of a process the pipe ended; a window signal with no samples
said as such."""

from __future__ import annotations

import io
import os
import sys

from llmconsole.console import cli
from llmconsole.console.commands import window as window_cmd
from llmconsole.wire.gateway import WindowState


def _closed_pipe_stdout() -> tuple[io.TextIOWrapper, int]:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    return io.TextIOWrapper(io.FileIO(w, "w"), write_through=False), w


class _Client:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def window(self, name):
        trace = [{"measured_ms": 400.0 + i, "window": 8, "action": "hold-band"} for i in range(10)]
        return {
            "engine": name,
            "group": name,
            "engines": {name: {}},
            "window": 8,
            "frozen": False,
            "in_flight": 0,
            "queued": 0,
            "open": True,
            "gateway_url": "http://127.0.0.1:1/g/demo",
            "signal": "ttft",
            "target_ms": 800.0,
            "min_window": 4,
            "max_window": 32,
            "kp": 1,
            "ki": 1,
            "kd": 0,
            "admitted_total": 5,
            "rejected_full_total": 0,
            "timed_out_total": 0,
            "trace": trace,
        }


def test_window_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    monkeypatch.setattr(window_cmd, "daemon_client", _Client)
    out, fd = _closed_pipe_stdout()
    saved = os.dup(1)
    monkeypatch.setattr(sys, "stdout", out)
    try:
        assert cli.main(["window", "demo"]) == 141
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert "Traceback" not in capsys.readouterr().err


def test_a_signal_without_samples_says_why_instead_of_showing_a_value():
    state = _Client().window("demo")
    state["trace"] = [dict(t, measured_ms=None, action="hold-idle") for t in state["trace"]]
    text = window_cmd.format_window(WindowState.model_validate(dict(state, recent_ok=12, recent_streamed=0)))
    assert "measured no TTFT samples: requests not streamed" in text and "N/A" not in text
    assert "no samples ->   8 (hold-idle)" in text
    idle = WindowState.model_validate(dict(state, recent_ok=0, recent_streamed=0))
    assert "no requests finished lately" in window_cmd.format_window(idle)
    e2e_state = dict(_Client().window("demo"), signal="e2e", recent_ok=3, recent_streamed=0)
    e2e = window_cmd.format_window(WindowState.model_validate(e2e_state))
    assert "measured p99 e2e 409 ms (target 800 ms)" in e2e


def test_status_says_which_kernel_an_engine_runs_when_it_differs_from_its_spec():
    """The note was printed only beside a state-file warning, and then for the last engine only."""
    from llmconsole.wire.status import StatusAnswer

    engines = [
        {"name": "a", "state": "ready", "kernel": "stock", "kernel_note": "custom needs AVX-512; runs stock"},
        {"name": "b", "state": "ready", "kernel": "stock"},
    ]
    text = cli.format_status(StatusAnswer.model_validate({"engines": engines}))
    assert "a: kernel stock (custom needs AVX-512; runs stock)" in text
    assert "b: kernel" not in text
