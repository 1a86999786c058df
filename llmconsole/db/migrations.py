"""Schema versions of the database file and the steps between them.

Each version is frozen SQL, never derived from the models in schema.py: a migration has to do
today exactly what it did when a file was first upgraded by it, whatever the models look like
later. `tests/unit/test_db_migrations.py` checks that the newest version and the models agree.

The version lives in `PRAGMA user_version` and the file's owner in `PRAGMA application_id`,
both in the 100-byte header of the file. That is why we do not use Alembic: the store must
decide whether a file is ours and how old it is from a read-only look before anything writes
(Alembic keeps its revision in a table and wants a writable connection and a script
directory), and SQLite runs our DDL and both pragmas inside one transaction, so an upgrade
either happens completely or not at all.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

# "LLMC" in ASCII: marks the file as ours for `file(1)`-style tools and for our own checks.
APPLICATION_ID = 0x4C4C4D43


@dataclass(frozen=True)
class Migration:
    version: int
    summary: str
    statements: tuple[str, ...]


_V1 = Migration(
    1,
    "sessions, config versions, runs, actions, alerts, metric samples, window trace, sweeps",
    (
        """CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            attached_at REAL NOT NULL,
            detached_at REAL,
            user TEXT NOT NULL,
            host TEXT NOT NULL,
            client TEXT NOT NULL
        )""",
        """CREATE TABLE config_versions (
            config_id TEXT PRIMARY KEY,
            spec_json TEXT NOT NULL,
            first_seen_at REAL NOT NULL
        )""",
        """CREATE TABLE engine_runs (
            id INTEGER PRIMARY KEY,
            engine TEXT NOT NULL,
            config_id TEXT NOT NULL REFERENCES config_versions(config_id),
            session_id INTEGER REFERENCES sessions(id),
            pid INTEGER,
            port INTEGER,
            started_at REAL NOT NULL,
            ready_at REAL,
            exited_at REAL,
            exit_code INTEGER,
            exit_reason TEXT,
            kv_cache_tokens INTEGER,
            max_concurrency REAL,
            outcome TEXT NOT NULL DEFAULT 'pending'
                CHECK (outcome IN ('pending', 'known_good', 'known_bad'))
        )""",
        "CREATE INDEX ix_engine_runs_engine_started ON engine_runs(engine, started_at)",
        """CREATE TABLE actions (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            session_id INTEGER REFERENCES sessions(id),
            engine TEXT,
            kind TEXT NOT NULL,
            from_config_id TEXT REFERENCES config_versions(config_id),
            to_config_id TEXT REFERENCES config_versions(config_id),
            outcome TEXT NOT NULL DEFAULT 'pending',
            automatic INTEGER NOT NULL DEFAULT 0,
            detail_json TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX ix_actions_at ON actions(at)",
        """CREATE TABLE alerts (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            engine TEXT,
            rule TEXT NOT NULL,
            severity TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('firing', 'resolved')),
            resolved_at REAL,
            detail_json TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX ix_alerts_at ON alerts(at)",
        # One wide row per engine per timestamp, clustered on (engine, at_s): a chart or a
        # compaction reads one engine's time range as one contiguous stretch of the b-tree.
        """CREATE TABLE metric_samples (
            engine TEXT NOT NULL,
            at_s REAL NOT NULL,
            resolution_s REAL NOT NULL,
            running REAL,
            waiting REAL,
            kv_cache_usage REAL,
            prompt_tok_s REAL,
            generation_tok_s REAL,
            p50_ttft_s REAL,
            p99_ttft_s REAL,
            p50_itl_s REAL,
            p99_itl_s REAL,
            p50_tpot_s REAL,
            p99_tpot_s REAL,
            p50_e2e_s REAL,
            p99_e2e_s REAL,
            gpu_memory_bytes INTEGER,
            host_memory_bytes INTEGER,
            PRIMARY KEY (engine, at_s)
        ) WITHOUT ROWID""",
        """CREATE TABLE window_trace (
            group_name TEXT NOT NULL,
            at_s REAL NOT NULL,
            target REAL,
            measured REAL,
            error REAL,
            p REAL,
            i REAL,
            d REAL,
            "window" REAL,
            PRIMARY KEY (group_name, at_s)
        ) WITHOUT ROWID""",
        """CREATE TABLE sweeps (
            id INTEGER PRIMARY KEY,
            engine TEXT NOT NULL,
            config_id TEXT REFERENCES config_versions(config_id),
            created_at REAL NOT NULL,
            finished_at REAL,
            grid_json TEXT NOT NULL,
            load_json TEXT NOT NULL,
            slo_json TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending'
        )""",
        """CREATE TABLE sweep_points (
            id INTEGER PRIMARY KEY,
            sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
            at REAL NOT NULL,
            params_json TEXT NOT NULL,
            "repeat" INTEGER NOT NULL DEFAULT 0,
            config_id TEXT,
            throughput_req_s REAL,
            throughput_tok_s REAL,
            p50_ttft_s REAL,
            p99_ttft_s REAL,
            p50_itl_s REAL,
            p99_itl_s REAL,
            p50_tpot_s REAL,
            p99_tpot_s REAL,
            p50_e2e_s REAL,
            p99_e2e_s REAL,
            peak_kv_usage REAL,
            preemptions INTEGER,
            memory_bytes INTEGER,
            compute_util REAL,
            bandwidth_util REAL,
            status TEXT NOT NULL DEFAULT 'ok',
            flags_json TEXT NOT NULL DEFAULT '[]'
        )""",
        "CREATE INDEX ix_sweep_points_sweep ON sweep_points(sweep_id)",
    ),
)

_V2 = Migration(
    2,
    "config labels (an operator's name for a config, shown in the rollback list); actions by session",
    (
        "ALTER TABLE config_versions ADD COLUMN label TEXT",
        # The export of one operator session filters actions by session and time.
        "CREATE INDEX ix_actions_session_at ON actions(session_id, at)",
    ),
)

# Each percentile's histogram bucket beside its interpolated value, as two REAL columns rather
# than one JSON text: compaction folds a minute's bounds in the same GROUP BY as the values (the
# worst bucket beside the worst p99), exports write them as plain numbers, and ADD COLUMN leaves
# every existing row in place with NULL bounds, which read as "not recorded". An upper bound is
# NULL past the last finite one (the +Inf bucket); the lower one is never NULL when the bounds
# are known, so it alone says whether they are.
_V3 = Migration(
    3,
    "metric samples keep each percentile's histogram bucket: p*_lower_s, p*_upper_s",
    (
        "ALTER TABLE metric_samples ADD COLUMN p50_ttft_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_ttft_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_ttft_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_ttft_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_itl_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_itl_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_itl_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_itl_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_tpot_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_tpot_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_tpot_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_tpot_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_e2e_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p50_e2e_upper_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_e2e_lower_s REAL",
        "ALTER TABLE metric_samples ADD COLUMN p99_e2e_upper_s REAL",
    ),
)

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3)
SCHEMA_VERSION = MIGRATIONS[-1].version


class NewerSchemaError(Exception):
    """The file was written by a newer llmconsole; `version` is the file's."""

    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


def upgrade(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> tuple[int, int]:
    """Bring the file behind `conn` to `target` in one transaction; (version before, after).

    `conn` must be in autocommit mode (isolation_level=None) so that this function owns the
    transaction. BEGIN IMMEDIATE takes the write lock first, so the version read below cannot
    change under us if another process opens the same file at the same moment.
    """
    if not 1 <= target <= SCHEMA_VERSION:
        raise ValueError(f"no schema version {target}; known: 1..{SCHEMA_VERSION}")
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = conn.execute("PRAGMA user_version").fetchone()[0]
        if before > SCHEMA_VERSION:
            raise NewerSchemaError(before)
        for m in MIGRATIONS:
            if before < m.version <= target:
                for sql in m.statements:
                    conn.execute(sql)
        after = max(before, target)
        if after != before:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {after}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return before, after
