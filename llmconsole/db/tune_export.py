"""The tunes of a span, for a session export: each study the tuner kept (in its Optuna journal,
beside the store), its trials in the span, its recommendation, and whether it was applied.

A tune restarts its engine on trial configs and puts the original back; it is no action in the
store unless its winner is applied. Without this a colleague reading the export saw restarts
with no cause and no trace of what was tried or found.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmconsole.db.records import Action


def read_tunes(journal: Path, since_s: float | None, until_s: float) -> list[dict[str, Any]]:
    """Each study with a trial started in the span: its trials there and its recommendation."""
    if not journal.is_file():
        return []
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from llmconsole.engine.tune.study import outcomes

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    out = []
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        started = {t.number: t.datetime_start for t in study.get_trials(deepcopy=False)}
        finished = {t.number: t.datetime_complete for t in study.get_trials(deepcopy=False)}
        trials = []
        for o in outcomes(study):
            at = started.get(o.number)
            at_s = at.timestamp() if at is not None else None
            if at_s is None or at_s > until_s or (since_s is not None and at_s < since_s):
                continue
            end = finished.get(o.number)
            trials.append(
                {
                    "trial": o.number,
                    "params": o.params,
                    "state": o.state,
                    "goodput_req_s": o.goodput_req_s,
                    "requests": o.requests,
                    "reason": o.reason,
                    "started_at": at_s,
                    "finished_at": end.timestamp() if end is not None else None,
                }
            )
        if not trials:
            continue
        out.append(
            {
                "study": study.study_name,
                "engine": study.study_name.rsplit("-", 1)[0],
                "trials": trials,
                "recommendation": study.user_attrs.get("recommendation"),
            }
        )
    return out


def with_applied(tunes: Iterable[dict[str, Any]], actions: Iterable[Action]) -> list[dict[str, Any]]:
    """Each tune with `applied`: the last `tune` action in the span that applied it (the daemon's
    apply names the study; an older one is known by its overrides being the recommended
    params), or None: recommended, not applied."""
    applies = [a for a in actions if a.kind == "tune"]
    out = []
    for t in tunes:
        params = (t.get("recommendation") or {}).get("params")

        def applied_it(a: Action, t: dict[str, Any] = t, params: Any = params) -> bool:
            if a.detail.get("study"):
                return bool(a.detail["study"] == t["study"])
            return a.engine == t["engine"] and bool(params) and (a.detail.get("overrides") or {}) == params

        hit = next((a for a in reversed(applies) if applied_it(a)), None)
        out.append({**t, "applied": None if hit is None else {"action_id": hit.id, "outcome": hit.outcome}})
    return out


def tune_lines(tunes: Iterable[dict[str, Any]]) -> list[str]:
    """The report's section on the tunes: trials, the recommendation, applied or not."""
    lines = []
    for t in tunes:
        trials = t["trials"]
        feasible = [x for x in trials if x["state"] == "complete" and x["goodput_req_s"] is not None]
        lines.append(
            f"- **{t['study']}** (engine {t['engine']}): {len(trials)} trial(s) in the span, "
            f"{len(feasible)} complete and feasible"
        )
        rec = t.get("recommendation")
        if rec and rec.get("params"):
            goodput = rec.get("median_req_s")
            shown = ", ".join(f"`{k}` {v}" for k, v in rec["params"].items())
            lines.append(
                f"  - recommendation: {shown}"
                + (f" ({goodput:.2f} req/s goodput, re-measured)" if goodput is not None else "")
            )
            applied = t.get("applied")
            lines.append(
                f"  - applied: action {applied['action_id']} ({applied['outcome']})" if applied else "  - not applied"
            )
        else:
            lines.append("  - no recommendation (the tune found no feasible winner, or did not finish)")
    return lines
