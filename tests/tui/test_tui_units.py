"""The console's parts that need no screen: keymaps, the form's checks, views, histories, sources."""

from __future__ import annotations

import json

import pytest

from llmconsole.console.client import DaemonNotRunning
from llmconsole.console.tui import Command, RecordedSource
from llmconsole.console.tui.charts.series import SeriesHistory
from llmconsole.console.tui.farewell import goodbye
from llmconsole.console.tui.keys import KEYS, KeymapError, check_keymap, config_path, load_keymap
from llmconsole.console.tui.run import run_console
from llmconsole.console.tui.screens.form import validate_form
from llmconsole.console.tui.views.config_memory import SpecMemory, spec_diff
from llmconsole.console.tui.views.status import EngineView, Snapshot, fmt_bytes, fmt_ms, fmt_uptime
from tests.support.daemon import Cli
from tests.support.paths import ROOT
from tests.support.recorded import lost_frame, stream_frames

TUI_DIR = ROOT / "llmconsole" / "console" / "tui"


# --- keys -------------------------------------------------------------------------------------


def test_keymap_is_read_from_llmconsole_home(tmp_path):
    (tmp_path / "console.toml").write_text('[keys]\nstop = "x"\nhelp = "H"\n')
    path = config_path({"LLMCONSOLE_HOME": str(tmp_path)})
    assert path == tmp_path / "console.toml"
    assert load_keymap(path) == {"stop": "x", "help": "H"}


def test_keymap_falls_back_to_the_user_config_dir(tmp_path):
    assert config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "llmconsole" / "console.toml"
    assert load_keymap(tmp_path / "missing.toml") == {}


@pytest.mark.parametrize(
    "text, message",
    [
        ('[keys]\nstpo = "x"\n', "unknown key id 'stpo'"),
        ('[colours]\nstop = "x"\n', "unknown section(s) colours"),
        ("[keys]\nstop = 3\n", "stop must be a key"),
        ('[keys]\nstop = "s"\n', "key 's' would do both start and stop"),
        ("[keys\n", "not valid TOML"),
    ],
)
def test_bad_keymaps_are_refused_with_a_clear_message(tmp_path, text, message):
    p = tmp_path / "console.toml"
    p.write_text(text)
    with pytest.raises(KeymapError) as e:
        load_keymap(p)
    assert message in str(e.value) and str(p) in str(e.value)


def test_the_same_key_on_different_screens_is_no_clash():
    # "n" is new-engine on the dashboard and "no" in a question; only one is live at a time.
    assert check_keymap({}) == {}
    assert check_keymap({"yes": "n", "no": "y"}) == {"yes": "n", "no": "y"}


def test_every_key_id_is_unique():
    ids = [k.id for k in KEYS]
    assert len(ids) == len(set(ids))


def test_a_bad_keymap_stops_the_console_before_it_starts(tmp_path, monkeypatch, capsys):
    (tmp_path / "console.toml").write_text('[keys]\nnope = "x"\n')
    monkeypatch.setenv("LLMCONSOLE_HOME", str(tmp_path))
    assert run_console() == 2
    assert "unknown key id 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # no daemon was started


def test_without_a_terminal_the_bare_command_still_prints_status(home):
    r = Cli(home)(check=False)
    assert r.returncode == 3 and "no llmconsole daemon is running" in r.stderr


# --- the form ----------------------------------------------------------------------------------


def _form(**kw):
    raw = {"name": "t2", "model": "Qwen/Qwen3-0.6B", "enforce_eager": False, "enable_prefix_caching": "default"}
    raw.update(kw)
    return validate_form(raw)


def test_form_gives_the_fields_that_were_filled_in():
    name, spec, errors = _form(
        max_num_seqs="8",
        kv_cache_memory_bytes="256MiB",
        gpu_memory_utilization="0.5",
        enable_prefix_caching="off",
        enforce_eager=True,
    )
    assert errors == {} and name == "t2"
    assert spec == {
        "model": "Qwen/Qwen3-0.6B",
        "max_num_seqs": 8,
        "kv_cache_memory_bytes": 256 << 20,
        "gpu_memory_utilization": 0.5,
        "enable_prefix_caching": False,
        "enforce_eager": True,
    }


def test_form_errors_name_their_field():
    _, spec, errors = _form(name="bad name", max_num_seqs="0", max_model_len="abc", gpu_memory_utilization="2")
    assert spec is None
    assert "not valid" in errors["name"][0]
    assert errors["max_num_seqs"] == ["Input should be greater than or equal to 1"]
    assert errors["max_model_len"] == ["must be a whole number"]
    assert "less than or equal to 1" in errors["gpu_memory_utilization"][0]


def test_form_reports_spec_wide_errors_apart():
    _, spec, errors = _form(max_num_seqs="8", max_num_batched_tokens="4")
    assert spec is None
    assert "must be at least max_num_seqs" in errors[""][0]


def test_form_checks_other_fields_before_a_model_is_given():
    _, _, errors = _form(model="", max_num_seqs="0")
    assert "model" in errors and "max_num_seqs" in errors


def test_form_makes_a_model_path_absolute_where_it_was_typed(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    _, spec, errors = _form(model="./m")
    assert errors == {} and spec["model"] == str(tmp_path / "m")
    _, spec, errors = _form(model="./nowhere")
    assert spec is None and "has no config.json" in errors["model"][0]


# --- views and histories ----------------------------------------------------------------------


def test_views_never_raise_on_odd_input():
    snap = Snapshot.parse(
        {
            "engines": [{"name": 3, "metrics": [], "process": "x", "spec": {"kernel": "paged-v2"}}],
            "host": {"gpus": [{"index": "0"}]},
        }
    )
    e = snap.engines[0]
    assert (e.name, e.state, e.model, e.config_id, e.kernel) == ("?", "unknown", "N/A", "N/A", "paged-v2")
    assert e.metric("running") is None and e.rss_bytes is None
    assert snap.host.gpu_memory == (None, None)
    assert Snapshot.parse(None).engines == ()


def test_formats():
    assert fmt_ms(None) == "N/A" and fmt_ms(0.0052) == "5.2 ms" and fmt_ms(0.2414) == "241 ms"
    assert fmt_bytes(2044854272) == "1.9 GiB" and fmt_bytes(None) == "N/A"
    assert [fmt_uptime(s) for s in (None, 6.4, 75, 4299, 90000)] == ["N/A", "6s", "1m15s", "1h11m", "1d01h"]


def test_goodbye_names_what_keeps_serving(frames):
    snap = Snapshot.parse(frames[-1]["status"])
    # The URL clients should use is the gateway's; the engine's own port is beside it.
    assert goodbye(snap).startswith("engines keep serving: t1 (ready, clients use http://127.0.0.1:33971/g/t1/v1;")
    assert "as last seen" in goodbye(snap, daemon_lost=True)
    assert goodbye(Snapshot()) == "no engines were running; nothing was stopped"


def test_history_adds_a_point_per_new_scrape_on_the_daemons_clock():
    fs = stream_frames()
    h = SeriesHistory()
    for f in fs + fs[-1:] * 3:  # the last frame repeated: no new scrape, no new point
        h.add(Snapshot.parse(f["status"]))
    scrapes = {f["status"]["engines"][0]["metrics"]["taken_at_s"] for f in fs}
    t, kv = h.series("t1", "kv_cache_usage")
    assert len(t) == len(scrapes) and t == sorted(t)
    assert t[-1] == fs[-1]["status"]["daemon"]["time_s"] == h.now_s  # the daemon's clock, not the console's
    assert h.series("bad", "kv_cache_usage") == ([], [])  # a failed engine has no figures
    steps, windows = h.series("t1", "window")
    assert len(steps) >= 60 and all(w is not None for w in windows)  # the controller's steps, each once


def test_history_is_bounded_to_an_hour():
    from llmconsole.console.tui.charts.series import SPAN_S

    h = SeriesHistory()
    status = stream_frames()[-1]["status"]
    for i in range(5):
        s = dict(status, daemon=dict(status["daemon"], time_s=1000.0 + i * SPAN_S / 2))
        s["engines"] = [dict(e, metrics=dict(e["metrics"] or {}, taken_at_s=float(i))) for e in s["engines"]]
        h.add(Snapshot.parse(s))
    t, _ = h.series("t1", "kv_cache_usage")
    assert t == [1000.0 + i * SPAN_S / 2 for i in (2, 3, 4)]  # the last hour, its first second included


def test_spec_memory_keeps_the_version_before_a_restart(frames):
    mem = SpecMemory()
    fs = frames
    mem.add(Snapshot.parse(fs[0]["status"]))
    assert mem.previous("t1") is None
    for f in fs:
        mem.add(Snapshot.parse(f["status"]))
    prev = mem.previous("t1")
    now = Snapshot.parse(fs[-1]["status"]).engine("t1")
    assert prev.config_id != now.config_id
    assert spec_diff(prev.spec, now.spec) == [("max_num_seqs", 8, 4)]


def test_engine_states_decide_what_may_be_done():
    e = lambda s: EngineView(name="e", state=s, model="m", config_id="c")  # noqa: E731
    assert e("failed").can("start") and e("stopped").can("start") and not e("ready").can("start")
    assert e("ready").can("stop") and e("crashed").can("stop") and not e("stopped").can("stop")
    assert not e("stopping").can("restart")


# --- sources ----------------------------------------------------------------------------------


def test_recorded_source_replays_then_holds_and_records_commands(frames):
    fs = frames
    src = RecordedSource(fs[:2] + [lost_frame("gone")])
    assert src.poll() == fs[0]["status"]
    tail = src.logs("t1", max_bytes=100)
    assert len(tail["text"].encode()) <= 100 and tail["offset"] == tail["size"]
    assert src.logs("t1", offset=0, max_bytes=10)["offset"] == 10
    assert src.poll() == fs[1]["status"]
    with pytest.raises(DaemonNotRunning, match="gone"):
        src.poll()
    with pytest.raises(DaemonNotRunning):
        src.poll()  # the last frame holds
    assert src.send(Command("stop", "t1"))["accepted"] is True
    assert src.commands == [Command("stop", "t1")]


def test_daemon_source_against_a_real_daemon(home, monkeypatch):
    from llmconsole.console.client import DaemonError, ensure_daemon
    from llmconsole.console.tui import DaemonSource
    from llmconsole.paths import resolve

    monkeypatch.setenv("LLMCONSOLE_HOME", str(home))  # the daemon it spawns reads it too
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    paths = resolve()
    assert paths.data_dir == home.resolve()
    client, started = ensure_daemon(paths)
    client.close()
    source = DaemonSource(paths)
    try:
        status = source.poll()
        assert status["engines"] == [] and "host" in status
        with pytest.raises(DaemonError) as e:
            source.send(Command("stop", "nope"))
        assert e.value.status == 404
        assert source.send(Command("stop_all")) == {"stopped": []}
        name, dial = source.dialer("t9")  # the sweep and tune screens' own clients of the daemon
        with dial(5.0) as c:
            assert name == "t9" and c.runs("t9") == []
        Cli(home)("daemon", "stop")
        with pytest.raises(DaemonNotRunning):
            source.poll()
    finally:
        source.close()


def test_the_fixture_was_recorded_from_a_real_engine(frames):
    fs = frames
    assert len(fs) >= 10
    t1 = [next(e for e in f["status"]["engines"] if e["name"] == "t1") for f in fs]
    assert all(e["state"] == "ready" for e in t1)
    assert any((e["metrics"] or {}).get("generation_tok_s") for e in t1)  # it was under load
    assert len({e["config_id"] for e in t1}) == 2  # and restarted on a changed spec
    assert json.dumps(fs[-1]["status"]["host"]["gpus"]) == "[]"


def test_console_modules_stay_small():
    for p in TUI_DIR.rglob("*.py"):
        assert len(p.read_text().splitlines()) <= 350, p
