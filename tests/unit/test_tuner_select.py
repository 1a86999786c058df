"""The re-measurement race and the recommendation (engine/tune/select.py): pure rules, no engine."""

from __future__ import annotations

from llmconsole.engine.tune.select import MIN_REL_SD, Remeasured, contenders, next_remeasure, pick_winner, start_race
from llmconsole.engine.tune.space import TrialOutcome


def _c(n: int, *runs: float, failed: str | None = None) -> Remeasured:
    return Remeasured(n, {"max_num_seqs": n}, tuple(runs), failed)


def test_the_race_starts_from_each_candidates_trial_run():
    o = [
        TrialOutcome(0, {"s": 8}, "complete", 26.0, 32),
        TrialOutcome(1, {"s": 16}, "complete", 30.0, 32),
        TrialOutcome(2, {"s": 4}, "pruned", 40.0, 8),
        TrialOutcome(3, {"s": 12}, "complete", 28.0, 32),
    ]
    race = start_race(o, 2)
    assert [(c.number, c.goodputs_req_s) for c in race] == [(1, (30.0,)), (3, (28.0,))]


def test_rounds_interleave_and_the_running_config_goes_first():
    a, b, c = _c(0, 30.0), _c(1, 29.0), _c(2, 28.0)
    assert next_remeasure([a, b, c], repeats=3) == 0  # nothing running: the best first
    assert next_remeasure([a, b, c], repeats=3, last=2) == 2  # the last trial's config runs now: no restart
    # A, B, C done: the next round walks back from C (C, B, A), never one config twice in a row
    # while another waits for its run of the round.
    race = [_c(0, 30.0, 30.5), _c(1, 29.0, 29.5), _c(2, 28.0, 28.4)]
    order, last = [], 2
    for _ in range(3):
        i = next_remeasure(race, repeats=3, last=last)
        order.append(i)
        race[i] = Remeasured(race[i].number, race[i].params, race[i].goodputs_req_s + (29.0,))
        last = i
    assert order == [2, 1, 0]


def test_a_candidate_clearly_below_the_leader_leaves_the_race_and_stays_out():
    # After a round each has two runs; C is 30% below A, far past the noise the runs show.
    race = [_c(0, 30.0, 31.0), _c(1, 29.0, 30.0), _c(2, 21.0, 20.0)]
    assert contenders(race) == [0, 1]
    # A and B run on; C, with fewer runs now, is not let back in by the unequal counts.
    race[0] = _c(0, 30.0, 31.0, 30.5)
    assert contenders(race) == [0, 1] and next_remeasure(race, repeats=3, last=0) == 1
    # Within the noise floor (8% per run), a close one stays in.
    close = [_c(0, 30.0, 30.0), _c(1, 30.0 * (1 - MIN_REL_SD / 2), 30.0 * (1 - MIN_REL_SD / 2))]
    assert contenders(close) == [0, 1]


def test_the_race_ends_when_one_is_left_with_its_repeats_or_none_started():
    assert next_remeasure([_c(0, 30.0, 31.0), _c(1, 15.0, 14.0)], repeats=1) is None
    assert next_remeasure([_c(0, 30.0, 31.0), _c(1, 15.0, 14.0)], repeats=2) == 0  # the winner's repeats
    assert next_remeasure([_c(0, 30.0, failed="no room")], repeats=2) is None
    assert next_remeasure([], repeats=3) is None


def test_the_winner_is_judged_on_all_its_runs_the_trials_included():
    # A's trial made 32 and its two re-measurements 28; B's made 26, then 28.5 twice. Judged on the
    # re-measurements alone (or on the median of all runs) B would win; every run counts alike.
    a = _c(0, 32.0, 28.0, 28.0)
    b = _c(1, 26.0, 28.5, 28.5)
    assert b.median_req_s > a.median_req_s and pick_winner([a, b]) is a
    # One that no longer starts cannot win, whatever its trial made.
    assert pick_winner([_c(0, 40.0, failed="did not start"), _c(1, 20.0, 21.0)]).number == 1
    assert pick_winner([_c(0, failed="did not start")]) is None
