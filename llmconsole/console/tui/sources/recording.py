"""Recorded state streams: what a daemon said, frame by frame, replayable without one.

A frame is one GET /v1/status answer plus the log tail of each engine at that moment. Tests and
the benchmark replay recordings through RecordedSource, so the console's screens can be checked
against what a real daemon and a real engine reported, byte for byte, every run.

    python -m llmconsole.console.tui.sources.recording OUT.json [--frames 10] [--interval-s 1]
        [--load-url http://127.0.0.1:PORT --load-model tiny]

records from the daemon of $LLMCONSOLE_HOME while (optionally) sending completions to an engine.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

FORMAT = "llmconsole-status-recording/1"


def load_frames(path: Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a status recording ({FORMAT})")
    return list(data["frames"])


def load_recording(path: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The frames, and the daemon's stored history per engine where the recording kept it."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a status recording ({FORMAT})")
    return list(data["frames"]), dict(data.get("samples") or {})


def save_frames(path: Path, frames: list[dict[str, Any]], note: str = "") -> None:
    Path(path).write_text(json.dumps({"format": FORMAT, "note": note, "frames": frames}, indent=1) + "\n")


def _send_load(url: str, model: str, stop: threading.Event) -> None:
    body = json.dumps({"model": model, "prompt": "The quick brown fox", "max_tokens": 24, "ignore_eos": True}).encode()
    while not stop.is_set():
        req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
        except OSError:
            pass
        stop.wait(0.3)


def record(frames: int, interval_s: float, load_url: str | None, load_model: str) -> list[dict[str, Any]]:
    from llmconsole.console.client import DaemonClient
    from llmconsole.paths import resolve
    from llmconsole.wire.status import StatusAnswer

    stop = threading.Event()
    loaders = (
        [threading.Thread(target=_send_load, args=(load_url, load_model, stop), daemon=True) for _ in range(2)]
        if load_url
        else []
    )
    for t in loaders:
        t.start()
    out: list[dict[str, Any]] = []
    try:
        with DaemonClient(resolve()) as client:
            for _ in range(frames):
                began = time.monotonic()
                status = client.status()  # as it came: a replay parses it as a live poll does
                names = [e.name for e in StatusAnswer.model_validate(status).engines]
                logs = {n: client.logs(n, max_bytes=4096)["text"] for n in names}
                out.append({"status": status, "logs": logs})
                time.sleep(max(0.0, interval_s - (time.monotonic() - began)))
    finally:
        stop.set()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--frames", type=int, default=10)
    p.add_argument("--interval-s", type=float, default=1.0)
    p.add_argument("--load-url")
    p.add_argument("--load-model", default="tiny")
    ns = p.parse_args(argv)
    frames = record(ns.frames, ns.interval_s, ns.load_url, ns.load_model)
    save_frames(Path(ns.out), frames, note="recorded from a live daemon")
    print(f"{len(frames)} frames in {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
