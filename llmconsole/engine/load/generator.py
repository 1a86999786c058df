"""The load generator: streams completions at an engine and times every token.

Closed loop: N streams, each sending its next request when the last one finished. Open loop:
requests arrive on a Poisson or gamma schedule at a rate, whatever the engine is doing (with an
optional cap on those in flight), which is how queues build up in production.

Per request it keeps TTFT, the gaps between streamed chunks, TPOT, end-to-end time and the
engine's own token counts (`stream_options.include_usage`). The timing follows `vllm bench
serve` (first chunk with choices = first token; end-to-end = last such chunk) so the two tools'
figures can be compared directly. Warm-up requests go first and count in nothing. A run is
bounded by its request count and optionally its duration; when stopped early (the time bound,
or `stop` set from a Ctrl-C handler) the requests in flight are cancelled and everything
finished so far is kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmconsole.engine.load.trace import TraceRequest
from llmconsole.engine.load.workload import (
    LengthDist,
    PlannedRequest,
    Tokenizer,
    Workload,
    exact_prompt,
    load_tokenizer,
    plan_requests,
)
from llmconsole.engine.metrics.latency import LatencyStats, Slo

# aiohttp is imported where a run begins: the CLI imports this module for its types with every
# command, and aiohttp is a fifth of a second of every CLI call's start.
if TYPE_CHECKING:
    import aiohttp

ProgressFn = Callable[[int, int], None]  # (finished measured requests, measured requests)


@dataclass(frozen=True)
class RequestRecord:
    index: int
    warmup: bool
    status: str  # "ok", or the error's kind (http_503, connect, timeout, ...)
    start_s: float  # since the measured phase began (negative for warm-up)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: tuple[float, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tpot_s(self) -> float | None:
        """Decode time per output token after the first, as vLLM defines it."""
        if (
            not self.ok
            or self.output_tokens is None
            or self.output_tokens < 2
            or self.ttft_s is None
            or self.e2e_s is None
        ):
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class LoadSummary:
    requests: int  # measured requests that were sent
    completed: int
    failed: int
    cancelled: int
    duration_s: float
    request_throughput_req_s: float
    output_throughput_tok_s: float
    total_token_throughput_tok_s: float
    input_tokens: int
    output_tokens: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)
    good_requests: int | None = None
    goodput_req_s: float | None = None
    slo_attainment: float | None = None  # good / completed
    slo_broken: tuple[str, ...] = ()  # the run-level targets missed

    @property
    def error_rate(self) -> float:
        sent = self.completed + self.failed
        return self.failed / sent if sent else 0.0

    def latency(self, metric: str) -> LatencyStats:
        stats: LatencyStats = getattr(self, metric)
        return stats


@dataclass(frozen=True)
class LoadResult:
    url: str
    model: str
    workload: Workload
    records: tuple[RequestRecord, ...]
    summary: LoadSummary
    stopped_early: str | None = None  # None, "time limit" or "interrupted"


_NO_SLO = Slo()


def summarize(
    records: list[RequestRecord] | tuple[RequestRecord, ...], duration_s: float, slo: Slo = _NO_SLO
) -> LoadSummary:
    """The figures of a run's measured requests (warm-up records are ignored)."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    cancelled = [r for r in measured if r.status == "cancelled"]
    failed = [r for r in measured if not r.ok and r.status != "cancelled"]
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.status] = errors.get(r.status, 0) + 1
    d = max(duration_s, 1e-9)
    n_in = sum(r.prompt_tokens or 0 for r in ok)
    n_out = sum(r.output_tokens or 0 for r in ok)
    stats = {
        "ttft": LatencyStats.of_seconds(r.ttft_s for r in ok if r.ttft_s is not None),
        "tpot": LatencyStats.of_seconds(r.tpot_s for r in ok if r.tpot_s is not None),
        "itl": LatencyStats.of_seconds(g for r in ok for g in r.itl_s),
        "e2e": LatencyStats.of_seconds(r.e2e_s for r in ok if r.e2e_s is not None),
    }
    good = goodput = attainment = None
    broken: tuple[str, ...] = ()
    if slo:
        good = sum(1 for r in ok if slo.request_is_good(r.ttft_s, r.tpot_s, r.e2e_s, max(r.itl_s, default=None)))
        goodput = good / d
        attainment = good / len(ok) if ok else 0.0
        broken = tuple(slo.broken_by(stats))
    return LoadSummary(
        requests=len(measured),
        completed=len(ok),
        failed=len(failed),
        cancelled=len(cancelled),
        duration_s=duration_s,
        request_throughput_req_s=len(ok) / d,
        output_throughput_tok_s=n_out / d,
        total_token_throughput_tok_s=(n_in + n_out) / d,
        input_tokens=n_in,
        output_tokens=n_out,
        errors_by_kind=errors,
        slo=slo.as_dict(),
        good_requests=good,
        goodput_req_s=goodput,
        slo_attainment=attainment,
        slo_broken=broken,
        ttft=stats["ttft"],
        tpot=stats["tpot"],
        itl=stats["itl"],
        e2e=stats["e2e"],
    )


# vLLM (and most OpenAI-compatible servers) write compact JSON: a chunk carrying a choice holds
# this, and is timed without being parsed. Anything else is parsed (usage, errors, spaced JSON).
_CONTENT = b'"choices":[{'


def _has_choices(payload: bytes) -> bool:
    """A chunk in JSON written with spaces that carries a choice (the slow, general path)."""
    if b'"choices"' not in payload or payload == b"[DONE]":
        return False
    try:
        return bool(json.loads(payload).get("choices"))
    except ValueError:
        return False


async def _no_chunks() -> AsyncIterator[bytes]:
    """What a whole (not streamed) answer gives the chunk loop: nothing."""
    return
    yield b""


class _Sender:
    """One HTTP session and the bookkeeping shared by every request of a run."""

    def __init__(self, url: str, model: str, ignore_eos: bool, api_key: str | None, request_timeout_s: float) -> None:
        self.endpoint = url.rstrip("/") + "/v1/completions"
        self.model = model
        self.ignore_eos = ignore_eos
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        import aiohttp

        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=request_timeout_s)
        self.session: aiohttp.ClientSession | None = None
        self.records: list[RequestRecord] = []
        self.t0 = 0.0  # the measured phase's start, perf_counter seconds
        self.done_measured = 0

    async def __aenter__(self) -> _Sender:
        import aiohttp

        # No connection limit: the workload, not the pool, decides how many are in flight.
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session().close()

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the sender is used outside `async with`")
        return self.session

    async def send(self, req: PlannedRequest) -> RequestRecord:
        import aiohttp

        body: dict[str, Any] = {
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.max_tokens,
            "stream": req.stream,
            "ignore_eos": self.ignore_eos,
        }
        if req.stream:
            body["stream_options"] = {"include_usage": True}
        if req.priority:
            body["priority"] = req.priority
        payload = json.dumps(body).encode()
        start = time.perf_counter()
        ttft: float | None = None
        last = start
        gaps: list[float] = []
        usage: dict[str, Any] | None = None
        record = functools.partial(RequestRecord, index=req.index, warmup=req.warmup, start_s=start - self.t0)
        try:
            async with self._session().post(self.endpoint, data=payload, headers=self.headers) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    rec = record(status=f"http_{resp.status}", error=text)
                    return self._keep(rec)
                if not req.stream:
                    # One answer: its first token reaches the client with its last.
                    usage = (await resp.json(content_type=None)).get("usage") or None
                    last = time.perf_counter()
                    ttft = last - start
                pending = b""
                async for data in resp.content.iter_any() if req.stream else _no_chunks():
                    now = time.perf_counter()
                    *lines, pending = (pending + data).split(b"\n")
                    for line in lines:
                        if not line.startswith(b"data: "):
                            continue  # blank separators and SSE comments (pings)
                        event = line[6:].rstrip()
                        if _CONTENT in event or _has_choices(event):
                            if ttft is None:
                                ttft = now - start
                            else:
                                gaps.append(now - last)
                            last = now
                        elif event == b"[DONE]":
                            break
                        else:
                            chunk = json.loads(event)
                            if chunk.get("usage"):
                                usage = chunk["usage"]
                            elif "error" in chunk:
                                err = str(chunk["error"])[:300]
                                return self._keep(record(status="stream_error", error=err))
        except asyncio.CancelledError:
            self._keep(record(status="cancelled"))
            raise
        except TimeoutError:
            return self._keep(record(status="timeout", error="no data within the read timeout"))
        except aiohttp.ClientConnectionError as e:
            return self._keep(record(status="connect", error=str(e)[:300]))
        except aiohttp.ClientError as e:
            return self._keep(record(status="http", error=str(e)[:300]))
        except ValueError as e:
            return self._keep(record(status="bad_stream", error=str(e)[:300]))
        if ttft is None or usage is None:
            what = "no tokens" if ttft is None else "no usage (stream_options unsupported?)"
            return self._keep(record(status="bad_stream", error=what))
        return self._keep(
            record(
                status="ok",
                prompt_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
                ttft_s=ttft,
                e2e_s=last - start,
                itl_s=tuple(gaps),
            )
        )

    def _keep(self, rec: RequestRecord) -> RequestRecord:
        self.records.append(rec)
        return rec


async def _closed(
    sender: _Sender, plan: list[PlannedRequest], streams: int, on_done: Callable[[RequestRecord], None]
) -> None:
    queue = iter(plan)

    async def stream() -> None:
        for req in queue:  # one shared iterator: each stream takes the next request
            on_done(await sender.send(req))

    await asyncio.gather(*(stream() for _ in range(min(streams, len(plan)))))


async def _open(
    sender: _Sender,
    plan: list[PlannedRequest],
    offsets_s: list[float],
    cap: int | None,
    on_done: Callable[[RequestRecord], None],
) -> None:
    gate = asyncio.Semaphore(cap) if cap else None
    tasks: list[asyncio.Future[None]] = []

    async def one(req: PlannedRequest) -> None:
        if gate is None:
            on_done(await sender.send(req))
            return
        async with gate:
            on_done(await sender.send(req))

    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        for req, due in zip(plan, offsets_s, strict=True):
            delay = start + due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(req)))
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_load(
    url: str,
    model: str,
    workload: Workload,
    *,
    tokenizer_source: str | None = None,
    plan: list[PlannedRequest] | None = None,
    slo: Slo = _NO_SLO,
    stop: asyncio.Event | None = None,
    on_progress: ProgressFn | None = None,
    api_key: str | None = None,
    request_timeout_s: float = 300.0,
    offsets_s: Sequence[float] | None = None,
) -> LoadResult:
    """Run `workload` against the OpenAI-compatible server at `url` serving `model`.

    `plan` (from plan_requests) can be built once and reused across runs; otherwise the
    tokenizer of `tokenizer_source` (a model directory or hub name) builds it here.
    `offsets_s`: when each measured request is due (a replayed trace), instead of the
    workload's arrival process.
    """
    if plan is None:
        if tokenizer_source is None:
            raise ValueError("give a plan or a tokenizer source (the engine's model directory)")
        plan = await asyncio.to_thread(plan_requests, workload, load_tokenizer(tokenizer_source))
    warm = [r for r in plan if r.warmup]
    measured = [r for r in plan if not r.warmup]
    total = len(measured)
    stopped: str | None = None

    async with _Sender(url, model, workload.ignore_eos, api_key, request_timeout_s) as sender:
        if warm:
            sender.t0 = time.perf_counter()
            await _closed(sender, warm, workload.concurrency or len(warm), lambda r: None)

        def on_done(rec: RequestRecord) -> None:
            sender.done_measured += 1
            if on_progress is not None:
                on_progress(sender.done_measured, total)

        sender.t0 = time.perf_counter()
        if offsets_s is not None:
            phase = _open(sender, measured, list(offsets_s), workload.concurrency, on_done)
        elif workload.arrival == "closed":
            assert workload.concurrency is not None  # a closed Workload is never without one
            phase = _closed(sender, measured, workload.concurrency, on_done)
        else:
            import random

            offsets = workload.arrival_offsets_s(total, random.Random(workload.seed + 1))
            phase = _open(sender, measured, offsets, workload.concurrency, on_done)
        work = asyncio.ensure_future(phase)
        waiters: set[asyncio.Future[None] | asyncio.Future[Literal[True]]] = {work}
        stop_wait = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if stop_wait is not None:
            waiters.add(stop_wait)
        done, _ = await asyncio.wait(waiters, timeout=workload.max_duration_s, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            stopped = "interrupted" if stop_wait is not None and stop_wait in done else "time limit"
            work.cancel()
        try:
            await work
        except asyncio.CancelledError:
            if not stopped:
                raise
        finally:
            if stop_wait is not None:
                stop_wait.cancel()
        # As vLLM's benchmark measures it: from the phase's start until its last request ended
        # (or the moment it was cut short).
        duration = time.perf_counter() - sender.t0
        records = tuple(sorted(sender.records, key=lambda r: r.index))
    return LoadResult(url, model, workload, records, summarize(records, duration, slo), stopped)


def trace_plan(
    requests: Sequence[TraceRequest], time_scale: float, tok: Tokenizer, seed: int = 0, warmup: int = 0
) -> tuple[Workload, list[PlannedRequest], list[float]]:
    """A replay of `requests` `time_scale` times faster: the workload that describes it, every
    request with a prompt of the trace's exact length, and when each is due."""
    if not time_scale > 0 or not math.isfinite(time_scale):
        raise ValueError("the time scale must be a number above 0 (10: ten times faster)")
    if not requests:
        raise ValueError("the trace holds no requests")
    import random

    rng = random.Random(seed)
    offsets = [r.arrival_s / time_scale for r in requests]
    span = max(offsets[-1], 1e-3)
    wl = Workload.open(
        max(len(requests) / span, 1e-6),
        len(requests),
        LengthDist.fixed(max(1, round(sum(r.input_tokens for r in requests) / len(requests)))),
        LengthDist.fixed(max(1, round(sum(r.output_tokens for r in requests) / len(requests)))),
        warmup_requests=warmup,
        seed=seed,
    )
    plan = [PlannedRequest(i, exact_prompt(tok, 8, rng), 8, 8, True) for i in range(warmup)] + [
        PlannedRequest(
            warmup + i,
            exact_prompt(tok, r.input_tokens, rng),
            r.input_tokens,
            r.output_tokens,
            False,
            r.stream,
            r.priority,
        )
        for i, r in enumerate(requests)
    ]
    return wl, plan, offsets


async def run_trace(
    url: str,
    model: str,
    requests: Sequence[TraceRequest],
    time_scale: float,
    *,
    tokenizer_source: str,
    slo: Slo = _NO_SLO,
    stop: asyncio.Event | None = None,
    on_progress: ProgressFn | None = None,
    api_key: str | None = None,
    seed: int = 0,
    warmup: int = 0,
    max_duration_s: float | None = None,
) -> LoadResult:
    """Replay a trace through the server at `url`, with the load generator's accounting."""
    tok = await asyncio.to_thread(load_tokenizer, tokenizer_source)
    wl, plan, offsets = await asyncio.to_thread(trace_plan, requests, time_scale, tok, seed, warmup)
    if max_duration_s is not None:
        wl = dataclasses.replace(wl, max_duration_s=max_duration_s)
    return await run_load(
        url, model, wl, plan=plan, slo=slo, stop=stop, on_progress=on_progress, api_key=api_key, offsets_s=offsets
    )
