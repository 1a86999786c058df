"""Every command that names an engine refuses a name the host does not know: exit 2, nothing
changed, and a message that says which name. No engine is started here."""

from __future__ import annotations

import pytest

from tests.support.daemon import daemon_home

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def with_daemon():
    with daemon_home("llmc-names-") as c:
        c("daemon", "start")
        yield c


def test_history_of_an_unknown_engine_exits_2_even_before_anything_ran(cli):
    cli("daemon", "start")  # history reads the store through the daemon
    r = cli("history", "NOPE", check=False)
    assert r.returncode == 2 and "NOPE" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["history", "NOPE"],
        ["history", "NOPE", "--json"],
        ["engine", "start", "NOPE"],
        ["engine", "restart", "NOPE"],
        ["engine", "restart", "NOPE", "--max-num-seqs", "4"],
        ["engine", "stop", "NOPE", "--yes"],
        ["engine", "rm", "NOPE", "--yes"],
        ["engine", "logs", "NOPE"],
        ["rollback", "NOPE", "--yes"],
        ["mode", "NOPE"],
        ["mode", "NOPE", "balanced"],
        ["window", "NOPE"],
        ["window", "NOPE", "--freeze"],
        ["load", "NOPE", "--concurrency", "1"],
        ["sweep", "--engine", "NOPE", "--load", "concurrency=1", "--out", "/tmp/llmc-never-written"],
        ["tune", "--engine", "NOPE", "--workload", "concurrency=1", "--budget", "1", "--dry-run"],
        ["group", "set", "g1", "NOPE"],
        ["group", "rm", "NOPE", "--yes"],
    ],
)
def test_commands_naming_an_unknown_engine_exit_2(with_daemon, args):
    r = with_daemon(*args, check=False)
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    assert "NOPE" in r.stderr, r.stderr
    assert with_daemon.status()["engines"] == []
