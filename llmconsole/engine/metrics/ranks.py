"""The data-parallel ranks of one engine: each rank's queue and KV use, and the rank that lags.

An engine started with `--data-parallel-size N` runs N engine cores behind one API server, and
its /metrics page labels every series with `engine="0"`, `engine="1"`, ... . The merged figures
(page.py: queues summed, KV use averaged) are right for the engine as a whole, but they hide a
rank whose queue grows while the others idle, or whose KV cache is full while the others have
room: requests routed to it wait, the engine's totals look healthy. vLLM's own balancer sends a
request to the least loaded rank and evens queues out within a scheduler step or two, so a gap
that lasts is a sign of something else: an external router or a client pinning requests to a rank
(the `X-data-parallel-rank` header), a run of long prompts on one rank, a slow device.

The lag rule compares each rank with the mean of its peers (the other ranks, not itself: with
two ranks a mean that counts the lagging one halves every gap), on the high side only (the rank
whose requests suffer is the one with more load), and asks for the gap to hold:

- queue: at least `queue_excess` (4) requests waiting above the peers' mean, and at least
  `queue_ratio` (2) times it. Four is half of a small batch and less than a batch of any real
  deployment: below it a queue drains in the next step or two. Twice the peers' mean means its
  requests wait about twice as long as they would elsewhere; a rank at 14 with peers at 10 is
  busy, not lagging.
- KV: its KV use at least `kv_excess` (30 points) above the peers' mean, and itself at least
  `kv_floor` (50%). Requests of mixed lengths move one rank's use by ten or twenty points at a
  time; thirty is more than chance. Under half full, nothing waits for KV there, whatever the gap.
- held for `hold_s` (15 s) before the rank is marked: past vLLM's balancing (it rebalances every
  100 ms) and past the 10 s the rates beside it are taken over, so a burst that evens out never
  marks; soon enough that an operator watching sees it during the event. A marked rank clears
  once the gap has been gone for `clear_s` (5 s), so one lucky scrape in a lasting imbalance does
  not make the mark blink; by the same token a gap gone for less than `clear_s` does not start
  the hold again. A rank that requests are pinned to shows such dips: when several of its answers
  end in one step its queue is short until their clients send again, and a hold that restarted
  on each dip marked a rank queueing 12 against 0 for minutes only by luck.

An alert is a separate thing (engine/alerts/): the mark is a view, shown beside the figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class RankSample:
    """One data-parallel rank's gauges on one /metrics page. A series the page lacks is None."""

    rank: str  # the page's `engine` label
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # fraction 0..1


@dataclass(frozen=True)
class LagRule:
    """When a rank lags its peers (the module's docstring says why these values)."""

    queue_excess: float = 4.0
    queue_ratio: float = 2.0
    kv_excess: float = 0.30
    kv_floor: float = 0.50
    hold_s: float = 15.0
    clear_s: float = 5.0

    def gaps(self, rank: RankSample, peers: list[RankSample]) -> tuple[str, ...]:
        """What of `rank` is far above its peers' mean now: ("queue",), ("kv",), both or none."""
        out: list[str] = []
        peer_waiting = _mean([p.waiting for p in peers])
        if rank.waiting is not None and peer_waiting is not None:
            if rank.waiting - peer_waiting >= self.queue_excess and rank.waiting >= self.queue_ratio * peer_waiting:
                out.append("queue")
        peer_kv = _mean([p.kv_cache_usage for p in peers])
        if rank.kv_cache_usage is not None and peer_kv is not None:
            if rank.kv_cache_usage - peer_kv >= self.kv_excess and rank.kv_cache_usage >= self.kv_floor:
                out.append("kv")
        return tuple(out)


@dataclass(frozen=True)
class RankFigures:
    """One rank as shown: its gauges, its peers' means, and whether it lags them.

    `gaps` is what is far from the peers now; `lagging` says the gaps held for the rule's hold
    time (and have not been gone for its clear time); `gap_for_s` is how long they have held."""

    rank: str
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    peers_waiting: float | None = None  # the mean of the other ranks'
    peers_kv_cache_usage: float | None = None
    gaps: tuple[str, ...] = ()
    gap_for_s: float | None = None
    lagging: bool = False
    note: str | None = None  # lag_text(), kept as a field so that it crosses the wire as shown

    def lag_text(self) -> str | None:
        """`12 waiting against 0.5 on its peers, for 18 s`; None when the rank does not lag."""
        if not self.lagging:
            return None
        parts = []
        if "queue" in self.gaps or not self.gaps:
            parts.append(f"{_num(self.waiting)} waiting against {_num(self.peers_waiting)} on its peers")
        if "kv" in self.gaps:
            parts.append(f"KV {_pct(self.kv_cache_usage)} against {_pct(self.peers_kv_cache_usage)} on its peers")
        # A mark outlives its gap by the rule's clear time: say the gap is closing then.
        held = f", for {self.gap_for_s:.0f} s" if self.gaps and self.gap_for_s is not None else ", gap closing"
        return "; ".join(parts) + held


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _num(v: float | None) -> str:
    if v is None:
        return "N/A"
    return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "N/A" if v is None else f"{100 * v:.0f}%"


def rank_order(rank: str) -> tuple[int, int, str]:
    """Ranks in numeric order (`2` before `10`), any other label after them."""
    return (0, int(rank), "") if rank.isdigit() else (1, 0, rank)


class RankWatch:
    """Follows one run of one engine's ranks, page after page, and marks the rank that lags.

    Each rank's gap start and clear start are kept between pages; a rank that leaves the page
    forgets its own. A new run of the engine gets a new watch (as it gets a new window)."""

    def __init__(self, rule: LagRule | None = None) -> None:
        self.rule = rule or LagRule()
        self._gap_since: dict[str, float] = {}  # rank -> when its current gap began
        self._gone_since: dict[str, float] = {}  # rank with a gap held -> when the gap went away
        self._marked: set[str] = set()

    def add(self, ranks: tuple[RankSample, ...], at_s: float) -> tuple[RankFigures, ...]:
        """The ranks of the page taken at `at_s` (the scraper's monotonic clock), as shown.
        Fewer than two ranks: nothing to compare, no rows."""
        if len(ranks) < 2:
            self._gap_since.clear()
            self._gone_since.clear()
            self._marked.clear()
            return ()
        seen = {r.rank for r in ranks}
        for held in (self._gap_since, self._gone_since):
            for rank in [r for r in held if r not in seen]:
                del held[rank]
        self._marked &= seen
        out = []
        for r in sorted(ranks, key=lambda r: rank_order(r.rank)):
            peers = [p for p in ranks if p is not r]
            gaps = self.rule.gaps(r, peers)
            if gaps:
                began = self._gap_since.setdefault(r.rank, at_s)
                self._gone_since.pop(r.rank, None)
                if at_s - began >= self.rule.hold_s:
                    self._marked.add(r.rank)
            elif r.rank in self._gap_since:
                # Gone for the clear time: the hold is over and the mark cleared; gone for less
                # (a dip), both stand.
                gone = self._gone_since.setdefault(r.rank, at_s)
                if at_s - gone >= self.rule.clear_s:
                    del self._gap_since[r.rank], self._gone_since[r.rank]
                    self._marked.discard(r.rank)
            held_since = self._gap_since.get(r.rank)
            figures = RankFigures(
                rank=r.rank,
                running=r.running,
                waiting=r.waiting,
                kv_cache_usage=r.kv_cache_usage,
                peers_waiting=_mean([p.waiting for p in peers]),
                peers_kv_cache_usage=_mean([p.kv_cache_usage for p in peers]),
                gaps=gaps,
                gap_for_s=None if held_since is None else at_s - held_since,
                lagging=r.rank in self._marked,
            )
            out.append(dataclasses.replace(figures, note=figures.lag_text()))
        return tuple(out)
