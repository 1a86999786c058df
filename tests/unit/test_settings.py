"""The settings layers: defaults < config.toml < LLMCONSOLE_* < --set, each value's source, the
errors that name where a bad value came from, secrets never shown, and the env names of before
working as they did."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from llmconsole.engine.modes.policy import PolicySettings
from llmconsole.engine.supervision_policy import SupervisionPolicy
from llmconsole.settings import Settings, SettingsError, leaf_keys, load
from llmconsole.settings.fields import ModePolicy, Supervision
from llmconsole.settings.table import markdown_table, rows

SECRET = "gw-secret-never-shown-3f9a"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No LLMCONSOLE_ setting of the shell running the tests, and a home with no config.toml."""
    for k in list(os.environ):
        if k.startswith("LLMCONSOLE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("LLMCONSOLE_HOME", str(tmp_path))


def _toml(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "config.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_without_a_file_or_variables_every_setting_is_its_default(tmp_path):
    r = load()
    assert r.config_file == tmp_path / "config.toml" and not r.config_found
    assert not (tmp_path / "config.toml").exists()  # a missing file is fine, and is not created
    assert all(str(r.origin(k)) == "default" for k in leaf_keys() if k != "home")
    assert str(r.origin("home")) == "env LLMCONSOLE_HOME"
    assert r.settings.supervision_policy() == SupervisionPolicy()
    assert r.settings.mode_policy_settings() == PolicySettings()
    assert r.settings.gateway_host == "127.0.0.1" and r.settings.metrics_bind == "127.0.0.1"


def test_each_layer_overrides_the_one_below_field_by_field(tmp_path, monkeypatch):
    path = _toml(
        tmp_path,
        'log_level = "warning"\ngateway_port = 8001\n\n[supervision]\nstart_timeout_s = 100\ncrash_loop_count = 5\n',
    )
    monkeypatch.setenv("LLMCONSOLE_GATEWAY_PORT", "8002")
    monkeypatch.setenv("LLMCONSOLE_SUPERVISION", '{"start_timeout_s": 200}')
    r = load(["gateway_port=8003", "supervision.backoff_max_s=7"])
    assert r.settings.gateway_port == 8003 and str(r.origin("gateway_port")) == "flag --set gateway_port"
    sup = r.settings.supervision_policy()
    assert sup.start_timeout_s == 200 and str(r.origin("supervision.start_timeout_s")) == "env LLMCONSOLE_SUPERVISION"
    assert sup.crash_loop_count == 5 and str(r.origin("supervision.crash_loop_count")) == f"{path}:6"
    assert (
        sup.backoff_max_s == 7 and str(r.origin("supervision.backoff_max_s")) == "flag --set supervision.backoff_max_s"
    )
    assert sup.drain_timeout_s == SupervisionPolicy().drain_timeout_s
    assert str(r.origin("supervision.drain_timeout_s")) == "default"
    assert r.settings.log_level == "WARNING" and str(r.origin("log_level")) == f"{path}:1"
    # One layer fewer each time: the one below shows through.
    r = load()
    assert r.settings.gateway_port == 8002 and str(r.origin("gateway_port")) == "env LLMCONSOLE_GATEWAY_PORT"
    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT")
    monkeypatch.delenv("LLMCONSOLE_SUPERVISION")
    r = load()
    assert r.settings.gateway_port == 8001 and str(r.origin("gateway_port")) == f"{path}:2"
    assert r.settings.supervision.start_timeout_s == 100 and str(r.origin("supervision.start_timeout_s")) == f"{path}:5"


def test_the_policy_variables_of_before_work_as_they_did(monkeypatch):
    monkeypatch.setenv("LLMCONSOLE_SUPERVISION", '{"start_timeout_s": 1800, "crash_loop_count": 2}')
    monkeypatch.setenv("LLMCONSOLE_MODE_POLICY", '{"balanced_above": 0.7, "min_switch_interval_s": 0}')
    s = load().settings
    p = s.supervision_policy()
    assert p.start_timeout_s == 1800.0 and p.crash_loop_count == 2 and isinstance(p.crash_loop_count, int)
    m = s.mode_policy_settings()
    assert (m.balanced_above, m.aggressive_above, m.min_switch_interval_s) == (0.7, 0.80, 0.0)
    for raw, why in (
        ('{"start_timeout": 5}', "not a field of supervision"),
        ('{"crash_loop_count": 0}', "greater than 0"),
        ('{"crash_loop_count": true}', "not true or false"),
        ("[1]", "JSON object"),
        ("{", "not JSON"),
    ):
        monkeypatch.setenv("LLMCONSOLE_SUPERVISION", raw)
        with pytest.raises(SettingsError, match=f"env LLMCONSOLE_SUPERVISION: .*{why}"):
            load()
    monkeypatch.delenv("LLMCONSOLE_SUPERVISION")
    for raw, why in (
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"turbo": 1}', "not a field of mode_policy"),
        ('{"hysteresis": "x"}', "valid number"),
        ('{"balanced_above": 0.9}', "0 < balanced_above < aggressive_above < 1"),
    ):
        monkeypatch.setenv("LLMCONSOLE_MODE_POLICY", raw)
        with pytest.raises(SettingsError, match=f"env LLMCONSOLE_MODE_POLICY: .*{why}"):
            load()


def test_the_plain_variables_of_before_work_as_they_did(monkeypatch):
    given = {
        "LLMCONSOLE_LOG_LEVEL": "debug",
        "LLMCONSOLE_GATEWAY_HOST": "0.0.0.0",
        "LLMCONSOLE_GATEWAY_PORT": "18555",
        "LLMCONSOLE_GATEWAY_KEY": f" {SECRET}\n",
        "LLMCONSOLE_METRICS_BIND": " 10.0.0.5 ",
        "LLMCONSOLE_METRICS_PORT": "9100",
        "LLMCONSOLE_CPU_KV_BUDGET_BYTES": str(32 << 20),
        "LLMCONSOLE_FP8_KV": " Supported",
        "LLMCONSOLE_SSH_COMMAND": "ssh -F /dev/null",
        "LLMCONSOLE_KERNEL_CACHE": "/tmp/kernels",
    }
    for k, v in given.items():
        monkeypatch.setenv(k, v)
    s = load().settings
    assert (s.log_level, s.gateway_host, s.gateway_port, s.metrics_bind, s.metrics_port) == (
        "DEBUG",
        "0.0.0.0",
        18555,
        "10.0.0.5",
        9100,
    )
    assert s.gateway_key is not None and s.gateway_key.get_secret_value() == SECRET
    assert (s.cpu_kv_budget_bytes, s.fp8_kv, s.ssh_command, str(s.kernel_cache)) == (
        32 << 20,
        "supported",
        "ssh -F /dev/null",
        "/tmp/kernels",
    )
    monkeypatch.setenv("LLMCONSOLE_GATEWAY_PORT", "0")  # a free port at every start, as before
    assert load().settings.gateway_port == 0
    # An empty variable is an unset one, as before.
    for k in given:
        monkeypatch.setenv(k, "")
    r = load()
    assert all(str(r.origin(k)) == "default" for k in leaf_keys() if k != "home")
    assert r.settings.model_copy(update={"home": None}) == Settings()


@pytest.mark.parametrize(
    "var, value, why",
    [
        ("LLMCONSOLE_GATEWAY_PORT", "http", "valid integer"),
        ("LLMCONSOLE_METRICS_PORT", "70000", "less than or equal to 65535"),
        ("LLMCONSOLE_CPU_KV_BUDGET_BYTES", "lots", "valid integer"),
        ("LLMCONSOLE_FP8_KV", "maybe", "'supported' or 'unsupported'"),
        ("LLMCONSOLE_LOG_LEVEL", "chatty", "DEBUG"),
    ],
)
def test_a_bad_variable_is_named_with_its_value(monkeypatch, var, value, why):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=f"env {var}: .*{why}") as e:
        load()
    assert repr(value) in str(e.value) or repr(value.upper()) in str(e.value)


def test_a_bad_config_file_is_named_with_its_line(tmp_path):
    path = _toml(tmp_path, 'gateway_host = "127.0.0.1"\ngateway_port = "eighty"\n')
    with pytest.raises(SettingsError, match=f"^{path}:2: gateway_port: .*valid integer"):
        load()
    path = _toml(tmp_path, "[supervision]\n\nstart_timeout_s = -1\n")
    with pytest.raises(SettingsError, match=f"^{path}:3: supervision.start_timeout_s: .*greater than 0"):
        load()
    path = _toml(tmp_path, "gateway_port = 8000\ngateway_prot = 8001\n")
    with pytest.raises(SettingsError, match=f"^{path}:2: 'gateway_prot' is not a setting"):
        load()
    path = _toml(tmp_path, "gateway_port = 8000\n[supervision\n")
    with pytest.raises(SettingsError, match=rf"^{path}: not valid TOML: .*line 2"):
        load()
    path = _toml(tmp_path, 'home = "/elsewhere"\n')
    with pytest.raises(SettingsError, match="environment only"):
        load()
    path = _toml(tmp_path, "supervision = 5\n")
    with pytest.raises(SettingsError, match=r"must be a table \(\[supervision\]\)"):
        load()


def test_a_secret_is_taken_only_from_a_private_file_and_never_from_a_flag(tmp_path):
    path = _toml(tmp_path, f'gateway_key = "{SECRET}"\n', mode=0o644)
    with pytest.raises(SettingsError, match=f"{path}: holds the secret gateway_key but others may read it") as e:
        load()
    assert SECRET not in str(e.value)
    path.chmod(0o600)
    r = load()
    assert r.settings.gateway_key.get_secret_value() == SECRET and str(r.origin("gateway_key")) == f"{path}:1"
    with pytest.raises(SettingsError, match="never taken on the command line") as e:
        load([f"gateway_key={SECRET}"])
    assert SECRET not in str(e.value)


def test_bad_flags_are_refused():
    for flag, why in (
        ("gateway_port", "expected KEY=VALUE"),
        ("gatway_port=1", "not a setting"),
        ("supervision=1", "not a setting"),
        ("home=/x", "environment only"),
        ("gateway_port=x", "flag --set gateway_port: gateway_port: .*valid integer"),
    ):
        with pytest.raises(SettingsError, match=why):
            load([flag])


def test_a_wrong_type_for_a_secret_does_not_echo_it(monkeypatch, tmp_path):
    _toml(tmp_path, "gateway_key = 12345678\n")
    with pytest.raises(SettingsError, match="gateway_key") as e:
        load()
    assert "12345678" not in str(e.value)


def test_the_groups_are_the_engines_policies_field_for_field():
    """A field added to SupervisionPolicy or PolicySettings is a setting too, with its default."""
    for group, policy in ((Supervision, SupervisionPolicy()), (ModePolicy, PolicySettings())):
        assert list(group.model_fields) == [f.name for f in dataclasses.fields(policy)]
        assert group().model_dump() == dataclasses.asdict(policy)
    for key in leaf_keys():
        from llmconsole.settings import field_of

        assert field_of(key).description, f"{key} has no help"


def test_rows_hide_secrets(monkeypatch):
    monkeypatch.setenv("LLMCONSOLE_GATEWAY_KEY", SECRET)
    table = {r.key: r for r in rows(load())}
    assert table["gateway_key"].value == "set" and table["gateway_key"].origin == "env LLMCONSOLE_GATEWAY_KEY"
    assert SECRET not in json.dumps([r.as_json() for r in table.values()])
    assert table["gateway_key"].as_json()["set"] is True


def test_the_doc_table_is_the_settings_own():
    from tests.support.paths import ROOT

    doc = (ROOT / "docs" / "settings.md").read_text()
    begin, end = doc.index("<!-- settings:begin"), doc.index("<!-- settings:end -->")
    assert doc[begin:end].split("-->", 1)[1].strip() == markdown_table(), "run docs/update_settings.py"


# --- the CLI and the daemon, as separate processes -----------------------------------------------


def _run(args, env, tmp_path):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.fixture
def env(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMCONSOLE_")}
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return dict(base, LLMCONSOLE_HOME=str(home))


def test_config_show_prints_each_value_and_its_source_and_hides_secrets(env, tmp_path):
    cfg = _toml(tmp_path / "home", "metrics_port = 9109\n\n[mode_policy]\nhysteresis = 0.1\n")
    env.update(LLMCONSOLE_GATEWAY_KEY=SECRET, LLMCONSOLE_GATEWAY_PORT="18555")
    r = _run(
        ["-m", "llmconsole.console.cli", "config", "show", "--set", "supervision.start_timeout_s=60"], env, tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout + r.stderr
    lines = {line.split()[0]: line.split(None, 2)[1:] for line in r.stdout.splitlines()[2:]}
    assert lines["gateway_key"] == ["set", "env LLMCONSOLE_GATEWAY_KEY"]
    assert lines["gateway_port"] == ["18555", "env LLMCONSOLE_GATEWAY_PORT"]
    assert lines["metrics_port"] == ["9109", f"{cfg}:1"]
    assert lines["mode_policy.hysteresis"] == ["0.1", f"{cfg}:4"]
    assert lines["supervision.start_timeout_s"] == ["60.0", "flag --set supervision.start_timeout_s"]
    assert lines["gateway_host"] == ["127.0.0.1", "default"]
    assert set(lines) == set(leaf_keys())
    j = _run(["-m", "llmconsole.console.cli", "config", "show", "--json"], env, tmp_path)
    assert j.returncode == 0 and SECRET not in j.stdout
    doc = json.loads(j.stdout)
    by_key = {s["key"]: s for s in doc["settings"]}
    assert doc["config_file"] == str(cfg) and doc["config_found"] is True
    assert by_key["gateway_key"] == {
        "key": "gateway_key",
        "from": "env LLMCONSOLE_GATEWAY_KEY",
        "env": "LLMCONSOLE_GATEWAY_KEY",
        "set": True,
    }
    assert by_key["metrics_port"]["value"] == 9109 and by_key["metrics_port"]["from"] == f"{cfg}:1"


def test_config_show_refuses_a_bad_value_naming_its_source(env, tmp_path):
    env["LLMCONSOLE_METRICS_PORT"] = "lots"
    r = _run(["-m", "llmconsole.console.cli", "config", "show"], env, tmp_path)
    assert r.returncode == 2 and "env LLMCONSOLE_METRICS_PORT: metrics_port" in r.stderr and not r.stdout
    del env["LLMCONSOLE_METRICS_PORT"]
    cfg = _toml(tmp_path / "home", "[supervision]\ncrash_loop_count = 1.5\n")
    r = _run(["-m", "llmconsole.console.cli", "config", "show", "--json"], env, tmp_path)
    assert r.returncode == 2 and f"{cfg}:2: supervision.crash_loop_count" in r.stderr


def test_a_daemon_with_a_bad_setting_starts_nothing(env, tmp_path):
    home = tmp_path / "home"
    cfg = _toml(home, "gateway_port = -1\n")
    r = _run(["-m", "llmconsole.daemon.main"], env, tmp_path)
    assert r.returncode == 2 and f"{cfg}:1: gateway_port" in r.stderr
    r = _run(["-m", "llmconsole.console.cli", "daemon", "start", "--set", "metrics_port=x"], env, tmp_path)
    assert r.returncode == 2 and "flag --set metrics_port" in r.stderr
    assert sorted(p.name for p in home.iterdir()) == ["config.toml"]  # no run/, no logs, no database


def test_a_daemon_given_a_bad_variable_exits_2_and_creates_nothing(env, tmp_path):
    """Before, LLMCONSOLE_GATEWAY_PORT=abc passed the checks, the daemon created its database and
    died on int() with a traceback (exit 1); LLMCONSOLE_LOG_LEVEL=chatty died in logging."""
    home = tmp_path / "home"
    for var, value in (("LLMCONSOLE_GATEWAY_PORT", "abc"), ("LLMCONSOLE_LOG_LEVEL", "chatty")):
        r = _run(["-m", "llmconsole.daemon.main"], dict(env, **{var: value}), tmp_path)
        assert r.returncode == 2 and f"env {var}:" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert list(home.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_flag_reaches_the_daemon_it_starts(env, tmp_path):
    """`daemon start --set` is the layer above the environment for the daemon it starts: here the
    exporter's port, which the daemon records in exporter.json once it listens there."""
    from tests.support.daemon import stop_daemon

    home = tmp_path / "home"
    env["LLMCONSOLE_METRICS_PORT"] = str(_free_port())
    port = _free_port()
    try:
        r = _run(["-m", "llmconsole.console.cli", "daemon", "start", "--set", f"metrics_port={port}"], env, tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads((home / "exporter.json").read_text()) == {"port": port}
        assert stat.S_IMODE((home / "exporter.json").stat().st_mode) == 0o600
    finally:
        stop_daemon(home)
