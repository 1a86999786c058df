"""Files that are not ours, or are damaged, are refused with a useful message and never written."""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3

import pytest

from llmconsole.db import MetricSample, Store, StoreError


def _fingerprint(directory):
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in sorted(os.listdir(directory))}


def _refused(path) -> str:
    before = _fingerprint(path.parent)
    mtime = path.stat().st_mtime_ns
    with pytest.raises(StoreError) as err:
        Store.open(path)
    assert _fingerprint(path.parent) == before  # same bytes, and no -wal/-shm/-journal appeared
    assert path.stat().st_mtime_ns == mtime
    msg = str(err.value)
    assert str(path) in msg
    assert "LLMCONSOLE_HOME" in msg and "move the file aside" in msg
    return msg


def test_random_bytes_are_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    path.write_bytes(random.Random(1).randbytes(64 * 1024))
    assert "not a SQLite database" in _refused(path)


def test_a_short_text_file_is_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    path.write_text("hello\n")
    assert "not a SQLite database" in _refused(path)


def test_sqlite_header_over_garbage_is_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    path.write_bytes(b"SQLite format 3\x00" + random.Random(2).randbytes(8192))
    msg = _refused(path)
    assert "damaged" in msg or "cannot open" in msg


def test_another_applications_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    with sqlite3.connect(path) as other:
        other.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        other.execute("INSERT INTO users (name) VALUES ('x')")
    other.close()
    msg = _refused(path)
    assert "another application" in msg and "users" in msg


def test_foreign_application_id_is_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    with sqlite3.connect(path, isolation_level=None) as other:
        other.execute("PRAGMA application_id = 1598903374")  # Fossil's
        other.execute("PRAGMA journal_mode = WAL")
        other.execute("CREATE TABLE blob (rid INTEGER PRIMARY KEY)")
    other.close()
    msg = _refused(path)
    assert "another application" in msg and "0x5f4d544e" in msg


def test_damaged_file_of_ours_is_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    with Store.open(path) as store:
        store.add_metric_samples([MetricSample("e", float(i), running=i, p99_ttft_s=0.1) for i in range(20_000)])
    page = 4096
    data = bytearray(path.read_bytes())
    assert len(data) > 20 * page
    data[10 * page : 12 * page] = random.Random(3).randbytes(2 * page)  # two b-tree pages trashed
    path.write_bytes(bytes(data))
    assert "damaged" in _refused(path)


def test_a_directory_in_the_way_is_refused(tmp_path):
    path = tmp_path / "llmconsole.db"
    path.mkdir()
    with pytest.raises(StoreError, match="not a regular file"):
        Store.open(path)


def test_an_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "llmconsole.db"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    with Store.open(path) as store:
        assert store.record_action("start") == 1
