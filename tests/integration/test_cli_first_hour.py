"""The CLI against a real daemon with no engine yet, as a new user first meets it."""

from __future__ import annotations

import pytest

from tests.support.daemon import daemon_home

pytestmark = pytest.mark.daemon  # one daemon, no engine, shared by the module


@pytest.fixture(scope="module")
def bare():
    with daemon_home("llmc-fh-") as c:
        c("daemon", "start")
        yield c


def test_status_takes_an_engine_name_and_refuses_an_unknown_one(bare):
    r = bare("status", "t9", check=False)
    assert r.returncode == 2 and "no engine named 't9' (engines: none)" in r.stderr


def test_window_min_above_max_is_refused_in_the_flags_words(bare):
    r = bare("window", "t9", "--min", "40", "--max", "8", check=False)
    assert r.returncode == 2
    assert "--min 40 is above --max 8: min must not exceed max; nothing was changed" in r.stderr


def test_daemon_stop_with_no_engine_says_so(bare):  # last: it stops the module's daemon
    r = bare("daemon", "stop")
    assert r.stdout.strip() == "daemon stopped; no engine was running"  # not "engines keep serving"
