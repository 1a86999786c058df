"""Write the shipped request traces into bench/traces/ (llmconsole CSV layout).

    python bench/make_traces.py            # every trace, from fixed seeds: the same bytes each time

diurnal-day.csv: one day (86,400 s of arrival times) with a quiet night, a morning ramp, a
daytime plateau, an evening peak at 3x the daytime trough and three 20-minute bursts of long
prompts (llmconsole/engine/load/trace_gen.py holds the shape). diurnal-day-small.csv: the
same day with a quarter of the requests, for short replays. Replay one with
`llmconsole load ENGINE --trace bench/traces/diurnal-day.csv --time-scale 360` (a day in 4
minutes). No data is copied from anywhere: every request is drawn from the shape.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmconsole.engine.load.trace import write_trace
from llmconsole.engine.load.trace_gen import DayShape, diurnal_day

HERE = Path(__file__).parent / "traces"

TRACES = {
    "diurnal-day.csv": (DayShape(), 1),
    "diurnal-day-small.csv": (DayShape(requests=600, burst_requests=15), 2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE, help="folder to write into")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (shape, seed) in TRACES.items():
        reqs = diurnal_day(shape, seed)
        write_trace(args.out / name, reqs)
        print(f"{args.out / name}: {len(reqs)} requests")


if __name__ == "__main__":
    main()
