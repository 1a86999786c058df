"""Schema versions: a v1 file is upgraded in place, a newer one is refused and left alone."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from llmconsole.db import SCHEMA_VERSION, MetricSample, Store, StoreError, guard, migrations
from llmconsole.db.schema import TABLES


def _make_v1_file(path) -> None:
    """A file exactly as the first release wrote it: the v1 migration only."""
    guard.create_private(path)
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    assert migrations.upgrade(raw, target=1) == (0, 1)
    raw.executescript("""
        INSERT INTO sessions (id, attached_at, user, host, client) VALUES (1, 10.0, 'ana', 'box', 'tui');
        INSERT INTO config_versions (config_id, spec_json, first_seen_at) VALUES ('c0ffee000001', '{"max_num_seqs": 4}', 11.0);
        INSERT INTO engine_runs (id, engine, config_id, session_id, started_at, exited_at, exit_code, outcome)
            VALUES (1, 'chat', 'c0ffee000001', 1, 12.0, 20.0, 0, 'known_good');
        INSERT INTO actions (id, at, actor, session_id, engine, kind, to_config_id, outcome, detail_json)
            VALUES (1, 12.0, 'ana', 1, 'chat', 'start', 'c0ffee000001', 'ok', '{"why": "first"}');
        INSERT INTO metric_samples (engine, at_s, resolution_s, running, kv_cache_usage) VALUES ('chat', 13.0, 1.0, 2.0, 0.5);
    """)
    raw.close()


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_v1_file_is_upgraded_in_place(tmp_path):
    path = tmp_path / "llmconsole.db"
    _make_v1_file(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
        assert "label" not in [r[1] for r in raw.execute("PRAGMA table_info(config_versions)")]
    inode = path.stat().st_ino

    with Store.open(path) as store:
        assert store.upgraded_from == 1 and store.schema_version == SCHEMA_VERSION == 3
        assert path.stat().st_ino == inode  # the same file, not a rewritten copy
        cfg = store.config("c0ffee000001")
        assert cfg.spec == {"max_num_seqs": 4} and cfg.label is None and cfg.first_seen_at == 11.0
        run = store.runs("chat")[0]
        assert (run.id, run.outcome, run.exited_at, run.session_id) == (1, "known_good", 20.0, 1)
        act = store.actions(session_id=1)[0]
        assert (act.kind, act.actor, act.detail) == ("start", "ana", {"why": "first"})
        assert store.metric_samples("chat")[0].kv_cache_usage == 0.5
        assert store.last_known_good("chat").config_id == "c0ffee000001"
        store.set_config_label("c0ffee000001", "safe")  # the v2 column works
        assert store.config("c0ffee000001").label == "safe"

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA application_id").fetchone()[0] == migrations.APPLICATION_ID
        indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "ix_actions_session_at" in indexes
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with Store.open(path) as again:
        assert again.upgraded_from is None  # nothing left to do


def test_a_v2_file_gains_percentile_bounds_and_its_old_samples_read_as_not_recorded(tmp_path):
    """v3 adds each percentile's histogram bucket to metric_samples; the samples already there
    keep their figures and read as "bounds not recorded", shown as before."""
    path = tmp_path / "llmconsole.db"
    guard.create_private(path)
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    assert migrations.upgrade(raw, target=2) == (0, 2)
    raw.execute(
        "INSERT INTO metric_samples (engine, at_s, resolution_s, p50_e2e_s, p99_e2e_s, p99_ttft_s) "
        "VALUES ('chat', 13.0, 1.0, 0.15, 0.297, NULL)"
    )
    raw.close()

    with Store.open(path) as store:
        assert store.upgraded_from == 2 and store.schema_version == 3
        (old,) = store.metric_samples("chat")
        assert (old.p50_e2e_s, old.p99_e2e_s, old.p99_e2e_lower_s, old.p99_e2e_upper_s) == (0.15, 0.297, None, None)
        assert not old.bounds_recorded("p99_e2e_s") and old.percentile("p99_ttft_s") is None
        p = old.percentile("p99_e2e_s")
        assert (p.value_s, p.lower_s, p.upper_s) == (0.297, 0.297, 0.297)  # the bare figure, as before
        # New samples keep their bucket beside the old ones.
        store.add_metric_samples(
            [MetricSample("chat", 14.0, p99_e2e_s=0.297, p99_e2e_lower_s=0.0, p99_e2e_upper_s=0.3)]
        )
        new = store.metric_samples("chat")[-1]
        assert new.bounds_recorded("p99_e2e_s") and new.percentile("p99_e2e_s").text() == "< 300 ms"
    with sqlite3.connect(path) as raw:
        columns = [r[1] for r in raw.execute("PRAGMA table_info(metric_samples)")]
        assert {"p99_e2e_lower_s", "p99_e2e_upper_s", "p50_ttft_lower_s"} <= set(columns)
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_upgrade_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "llmconsole.db"
    _make_v1_file(path)
    broken = migrations.Migration(
        2, "broken", ("ALTER TABLE config_versions ADD COLUMN label TEXT", "CREATE INDEX nope ON no_such_table(x)")
    )
    monkeypatch.setattr(migrations, "MIGRATIONS", (migrations.MIGRATIONS[0], broken))
    with pytest.raises(StoreError, match="no_such_table"):
        Store.open(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
        assert "label" not in [r[1] for r in raw.execute("PRAGMA table_info(config_versions)")]


def test_newest_schema_matches_the_models(tmp_path):
    path = tmp_path / "llmconsole.db"
    Store.open(path).close()
    with sqlite3.connect(path) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {t.__tablename__ for t in TABLES}
        for model in TABLES:
            info = {r[1]: r for r in raw.execute(f"PRAGMA table_info({model.__tablename__})")}
            table = model.__table__
            assert list(info) == [c.name for c in table.columns], model.__tablename__
            for col in table.columns:
                if col.primary_key:
                    assert info[col.name][5] > 0, (model.__tablename__, col.name)
                elif not col.nullable:
                    assert info[col.name][3] == 1, (model.__tablename__, col.name, "should be NOT NULL")


def test_file_from_a_newer_version_is_refused_untouched(tmp_path):
    path = tmp_path / "llmconsole.db"
    with Store.open(path) as store:
        store.record_action("start", engine="chat")
    with sqlite3.connect(path, isolation_level=None) as raw:
        raw.execute("PRAGMA user_version = 7")
    raw.close()
    before, listing = _sha256(path), sorted(os.listdir(tmp_path))

    with pytest.raises(StoreError) as err:
        Store.open(path)
    msg = str(err.value)
    assert str(path) in msg and "version 7" in msg and f"up to {SCHEMA_VERSION}" in msg
    assert _sha256(path) == before
    assert sorted(os.listdir(tmp_path)) == listing  # no -wal/-shm left behind either


def test_upgrade_refuses_a_version_it_does_not_know(tmp_path):
    raw = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    with pytest.raises(ValueError):
        migrations.upgrade(raw, target=SCHEMA_VERSION + 1)
    raw.execute("PRAGMA user_version = 99")
    with pytest.raises(migrations.NewerSchemaError):
        migrations.upgrade(raw)
    raw.close()
