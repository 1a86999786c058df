"""The tuner's Optuna study: where it is kept, how the next config is asked, what it holds.

The study lives in a journal file, so an interrupted tune resumes where it stopped. The next
config comes from the pattern search (search.py) while it has one, queued into the study
so the sampler and the journal see it as any trial, and from TPE after. The tuner and the
benchmark's replay both ask here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmconsole.engine.tune.search import LEADER_TIE, Probe, encode, next_config, start_config
from llmconsole.engine.tune.space import Budget, Knob, TrialOutcome, startup_trials

# Optuna (and the numpy under it) is imported where a study is made or read, not with this
# module: every CLI call imports the tune request's parsers, and a tenth of a second each adds up.
if TYPE_CHECKING:
    import optuna


def make_sampler(seed: int, budget: Budget) -> optuna.samplers.TPESampler:
    """TPE, multivariate (batch size and token budget interact), seeded; its random start is
    cut for small budgets so most of the few restarts a budget allows are guided."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # progress goes out as TuneProgress events
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials(budget), multivariate=True)


DEFAULT_BUDGET = Budget(trials=12)


def open_study(storage_path: Path, name: str, seed: int, budget: Budget = DEFAULT_BUDGET) -> optuna.Study:
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage_path.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(storage_path)))
    return optuna.create_study(
        study_name=name, storage=storage, sampler=make_sampler(seed, budget), direction="maximize", load_if_exists=True
    )


def outcomes(study: optuna.Study) -> list[TrialOutcome]:
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False):
        state = t.user_attrs.get("outcome") or {TrialState.RUNNING: "running", TrialState.FAIL: "interrupted"}.get(
            t.state, t.state.name.lower()
        )
        out.append(
            TrialOutcome(
                t.number,
                dict(t.user_attrs.get("config", t.params)),
                state,
                t.user_attrs.get("goodput_req_s"),
                int(t.user_attrs.get("requests", 0)),
                t.user_attrs.get("reason"),
            )
        )
    return out


def history(study: optuna.Study) -> list[Probe]:
    """What the pattern search learns from: every judged trial (a pruned one by its goodput at
    the rung it reached, an infeasible one as such); interrupted ones judged nothing."""
    return [
        Probe(o.params, (o.goodput_req_s or 0.0) if o.state in ("complete", "pruned") else None)
        for o in outcomes(study)
        if o.state in ("complete", "pruned", "infeasible")
    ]


def ask_next(
    study: optuna.Study, knobs: Sequence[Knob], start: dict[str, Any], search: str = "pattern", tie: float = LEADER_TIE
) -> tuple[optuna.Trial, dict[str, Any]]:
    """The next trial and its config. The pattern search's choice is queued into the study, so
    the sampler and the journal see it as any trial; with nothing left to it, TPE chooses. The
    tuner and the benchmark's replay both ask here."""
    if search in ("pattern", "bracket"):
        nxt = next_config(history(study), knobs, start, main_only=search == "bracket", tie=tie)
    else:
        nxt = start_config(knobs, start) if start and not study.trials else None
    if nxt is not None:
        study.enqueue_trial(encode(nxt, knobs))
    trial = study.ask()
    return trial, suggest_params(trial, knobs)


def suggest_params(trial: optuna.Trial, knobs: Sequence[Knob]) -> dict[str, Any]:
    """A config from the sampler. A list of numbers is searched by its position in sorted
    order, so TPE sees that 16 seats lie beyond 4 (as a category it would not); the values
    themselves are kept on the trial."""
    params: dict[str, Any] = {}
    for k in knobs:
        if k.choices and all(isinstance(v, (int, float)) for v in k.choices):
            ordered = sorted(k.choices)
            params[k.name] = ordered[trial.suggest_int(k.name, 0, len(ordered) - 1)]
        elif k.choices:
            params[k.name] = trial.suggest_categorical(k.name, list(k.choices))
        else:
            low, high = k.bounds
            params[k.name] = trial.suggest_int(k.name, low, high, log=high / low >= 4)
    trial.set_user_attr("config", params)
    return params
