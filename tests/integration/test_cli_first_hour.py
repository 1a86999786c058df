"""The CLI against a real daemon with no engine yet, as a new user first meets it."""

from __future__ import annotations


def test_status_name_window_bounds_and_daemon_stop_say_what_is_true(cli):
    cli("daemon", "start")
    r = cli("status", "t9", check=False)  # an engine name is accepted, and an unknown one refused
    assert r.returncode == 2 and "no engine named 't9' (engines: none)" in r.stderr
    r = cli("window", "t9", "--min", "40", "--max", "8", check=False)
    assert r.returncode == 2
    assert "--min 40 is above --max 8: min must not exceed max; nothing was changed" in r.stderr
    r = cli("daemon", "stop")
    assert r.stdout.strip() == "daemon stopped; no engine was running"  # not "engines keep serving"
