"""A session export holds the tunes of its span: study, trials, recommendation, applied or not
(a tune's trial restarts are no actions in the store; its study journal is its record)."""

from __future__ import annotations

import json

from llmconsole.db import Store
from llmconsole.db.export import export_bundle
from llmconsole.engine.tune.study import open_study


def _tune(journal, name: str, goodputs: list[float], recommended: dict | None) -> None:
    study = open_study(journal, name, seed=0)
    for i, goodput in enumerate(goodputs):
        trial = study.ask()
        for key, value in (
            ("config", {"max_num_seqs": 4 * (i + 1)}),
            ("outcome", "complete"),
            ("goodput_req_s", goodput),
            ("requests", 32),
        ):
            trial.set_user_attr(key, value)
        study.tell(trial, goodput)
    if recommended is not None:  # as the tuner keeps its winner (Tuner._keep_recommendation)
        study.set_user_attr(
            "recommendation",
            {"trial": 1, "params": recommended, "goodputs_req_s": [3.1, 3.3], "median_req_s": 3.2, "failed": 0},
        )


def test_the_export_has_each_tune_its_trials_its_recommendation_and_whether_it_was_applied(tmp_path):
    journal = tmp_path / "tuning" / "studies.journal"
    _tune(journal, "chat-0123456789ab", [2.5, 3.2], {"max_num_seqs": 8})
    _tune(journal, "batch-ba9876543210", [1.0], {"max_num_seqs": 4})
    store = Store.open(tmp_path / "db.sqlite")
    applied = store.record_action(
        "tune", engine="chat", actor="ops", outcome="ok", detail={"overrides": {"max_num_seqs": 8}}
    )
    result = export_bundle(store, tmp_path / "out", tunes_journal=journal)

    assert ("tunes", 2) in result.counts
    lines = (tmp_path / "out" / "tunes.jsonl").read_text().splitlines()
    tunes = {t["study"]: t for t in map(json.loads, lines)}
    chat = tunes["chat-0123456789ab"]
    assert chat["engine"] == "chat"
    assert [(t["params"], t["goodput_req_s"], t["state"]) for t in chat["trials"]] == [
        ({"max_num_seqs": 4}, 2.5, "complete"),
        ({"max_num_seqs": 8}, 3.2, "complete"),
    ]
    assert chat["recommendation"]["params"] == {"max_num_seqs": 8}
    assert chat["applied"] == {"action_id": applied, "outcome": "ok"}
    assert tunes["batch-ba9876543210"]["applied"] is None  # recommended, never applied

    report = (tmp_path / "out" / "report.md").read_text()
    changed = report.split("## What changed", 1)[1].split("## Alerts", 1)[0]
    assert "### Tunes" in changed
    assert "**chat-0123456789ab** (engine chat): 2 trial(s) in the span, 2 complete and feasible" in changed
    assert f"applied: action {applied} (ok)" in changed
    assert "**batch-ba9876543210** (engine batch)" in changed and "not applied" in changed


def test_an_export_without_a_tune_journal_has_an_empty_tunes_file(tmp_path):
    store = Store.open(tmp_path / "db.sqlite")
    result = export_bundle(store, tmp_path / "out", tunes_journal=tmp_path / "none" / "studies.journal")
    assert ("tunes", 0) in result.counts and (tmp_path / "out" / "tunes.jsonl").read_text() == ""
