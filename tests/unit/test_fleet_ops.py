"""Running a fleet: the daemon as a systemd user service, engines that span nodes through vLLM's
own parallelism, and Prometheus and Grafana over every host (targets, scrape config, dashboard)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmconsole.console.cli import format_status, parallel_text
from llmconsole.console.service_unit import render_unit
from llmconsole.console.spec_flags import add_spec_flags, spec_overrides
from llmconsole.engine.runtime import Runtime
from llmconsole.engine.spec import EngineSpec
from llmconsole.wire.status import EngineInfo, StatusAnswer
from tests.support.paths import ROOT  # noqa: E402
from tests.support.tools import needs_tool

PROM = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "llmconsole-fleet.json"

# --- the daemon as a service -----------------------------------------------------------------


def test_daemon_install_writes_a_user_unit_and_uninstall_removes_it(cli, tmp_path):
    cli.env["HOME"] = str(tmp_path)
    cli.env.pop("XDG_CONFIG_HOME", None)
    unit = tmp_path / ".config" / "systemd" / "user" / "llmconsole.service"
    r = cli("daemon", "install", "--user")
    assert f"wrote {unit}" in r.stdout
    assert "loginctl enable-linger" in r.stdout and "systemctl --user enable --now llmconsole.service" in r.stdout
    text = unit.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(" daemon start --foreground")
    for line in (
        "Restart=on-failure",
        "KillMode=process",
        "WantedBy=default.target",
        "Type=simple",
        f"Environment=LLMCONSOLE_HOME={cli.home}",
    ):
        assert line in text.splitlines(), line
    # The same unit again changes nothing; a different one is refused without --force.
    assert "wrote" in cli("daemon", "install", "--user").stdout
    unit.write_text(text.replace("RestartSec=5", "RestartSec=9"))
    r = cli("daemon", "install", "--user", check=False)
    assert r.returncode == 2 and "--force" in r.stderr
    assert "replaced" in cli("daemon", "install", "--user", "--force").stdout
    assert unit.read_text() == text
    r = cli("daemon", "uninstall")
    assert f"removed {unit}" in r.stdout and not unit.exists()
    assert "nothing to remove" in cli("daemon", "uninstall").stdout
    assert cli("daemon", "install", check=False).returncode == 2  # only --user is offered


def test_unit_quotes_what_systemd_would_split_or_expand():
    text = render_unit(
        ["/opt/my env/bin/llmconsole", "daemon", "start", "--foreground"], {"LLMCONSOLE_HOME": "/srv/100%"}
    )
    assert 'ExecStart="/opt/my env/bin/llmconsole" daemon start --foreground' in text
    assert "Environment=LLMCONSOLE_HOME=/srv/100%%" in text


# Characters that systemd and sh would otherwise take as quoting, expansion or escapes.
GATEWAY_KEY = 'gw-k3y$HOME"q`x`\\end %s'
SETTINGS = {
    "LLMCONSOLE_GATEWAY_KEY": GATEWAY_KEY,
    "LLMCONSOLE_GATEWAY_PORT": "18555",
    "LLMCONSOLE_GATEWAY_HOST": "0.0.0.0",
    "LLMCONSOLE_SUPERVISION": "max_restarts=5",
    "LLMCONSOLE_MODE_POLICY": "auto",
}


def test_the_unit_reads_the_daemons_settings_and_key_from_a_private_file(cli, tmp_path):
    """After a reboot the service is the daemon the operator configured: its key (the door stays
    closed) and its settings come from a 0600 environment file; the unit itself holds no key."""
    cli.env["HOME"] = str(tmp_path)
    cli.env.pop("XDG_CONFIG_HOME", None)
    for k in [k for k in cli.env if k.startswith("LLMCONSOLE_") and k != "LLMCONSOLE_HOME"]:
        del cli.env[k]  # only what this test sets
    cli.env.update(SETTINGS)
    r = cli("daemon", "install", "--user")
    unit = tmp_path / ".config" / "systemd" / "user" / "llmconsole.service"
    env_file = tmp_path / ".config" / "llmconsole" / "daemon.env"
    assert f"wrote {env_file} (0600)" in r.stdout and GATEWAY_KEY not in r.stdout
    text = unit.read_text()
    assert f"EnvironmentFile={env_file}" in text.splitlines()
    assert "gw-k3y" not in text and "LLMCONSOLE_GATEWAY_KEY" not in text
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(env_file.parent.stat().st_mode) == 0o700
    # The file says exactly what was set, as systemd reads it (sh reads double quotes alike).
    shown = subprocess.run(
        ["sh", "-c", f'set -a; . "{env_file}"; env -0'], env={}, capture_output=True, check=True
    ).stdout
    read = dict(e.decode().split("=", 1) for e in shown.split(b"\0") if e.startswith(b"LLMCONSOLE_"))
    assert read == SETTINGS
    if shutil.which("systemd-analyze"):
        v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert v.returncode == 0, v.stderr
    # Uninstalling takes the key away with the unit.
    cli("daemon", "uninstall")
    assert not unit.exists() and not env_file.exists()


def test_a_setting_the_environment_file_cannot_carry_writes_nothing(cli, tmp_path):
    cli.env["HOME"] = str(tmp_path)
    cli.env.pop("XDG_CONFIG_HOME", None)
    cli.env["LLMCONSOLE_GATEWAY_KEY"] = "two\nlines"
    r = cli("daemon", "install", "--user", check=False)
    assert r.returncode == 2 and "LLMCONSOLE_GATEWAY_KEY holds a line break" in r.stderr
    assert not (tmp_path / ".config" / "systemd").exists() and not (tmp_path / ".config" / "llmconsole").exists()


def test_xdg_config_home_moves_the_unit(cli, tmp_path):
    cli.env["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    cli("daemon", "install", "--user")
    assert (tmp_path / "cfg" / "systemd" / "user" / "llmconsole.service").is_file()


# --- engines that span nodes: vLLM's own tp x pp, Ray's executor ----------------------------


def test_tensor_and_pipeline_parallel_and_ray_pass_through_to_vllm(tiny_model):
    p = argparse.ArgumentParser()
    add_spec_flags(p)
    ns = p.parse_args(
        [
            "--model",
            str(tiny_model),
            "--tensor-parallel-size",
            "8",
            "--pipeline-parallel-size",
            "2",
            "--distributed-executor-backend",
            "ray",
        ]
    )
    spec = EngineSpec(**spec_overrides(ns))
    argv = spec.argv(Runtime(kind="vllm-serve", executable="/usr/bin/vllm", device="cuda"), 8000)
    for flag, value in (
        ("--tensor-parallel-size", "8"),
        ("--pipeline-parallel-size", "2"),
        ("--distributed-executor-backend", "ray"),
    ):
        assert argv[argv.index(flag) + 1] == value
    with pytest.raises(SystemExit):  # only vLLM's own executors
        p.parse_args(["--model", str(tiny_model), "--distributed-executor-backend", "slurm"])


def test_status_shows_nodes_when_reported_else_tp_by_pp():
    def engine(name: str, spec: dict, **kw: object) -> EngineInfo:
        return EngineInfo.model_validate(
            {
                "name": name,
                "state": "ready",
                "pid": 1,
                "port": 8000,
                "config_id": "c" * 12,
                "restarts": 0,
                "kv_cache_usage": None,
                "num_requests_running": None,
                "num_requests_waiting": None,
                "generation_tok_s": None,
                "p99_ttft_s": None,
                "spec": spec,
                **kw,
            }
        )

    one = engine("small", {})
    big = engine("big", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "distributed_executor_backend": "ray"})
    told = engine("told", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, nodes=2)
    assert parallel_text(one) == "1"
    assert parallel_text(big) == "tp8xpp2 ray"
    assert parallel_text(told) == "2 nodes"
    assert "PARALLEL" not in format_status(StatusAnswer(engines=[one]))  # a single-worker fleet reads as before
    table = format_status(StatusAnswer(engines=[one, big, told])).splitlines()
    assert table[0].split()[:4] == ["NAME", "STATE", "PID", "PARALLEL"]
    assert "tp8xpp2 ray" in table[2] and "2 nodes" in table[3]


# --- Prometheus: targets from the hosts file, the shipped scrape config ---------------------

needs_promtool = needs_tool("promtool")


def _write_fleet_hosts(home: Path) -> None:
    (home / "hosts.toml").write_text(
        '[hosts.gpu1]\ndestination = "ops@gpu1"\nmetrics = "10.0.0.11:9400"\n\n'
        '[hosts.gpu2]\ndestination = "ssh://nobody@127.0.0.1:1"\nmetrics = "127.0.0.1:19402"\n\n'
        '[hosts.gpu3]\ndestination = "ssh://nobody@127.0.0.1:1"\n'
    )


@needs_promtool
def test_prometheus_targets_from_the_hosts_file_pass_promtool(cli, home, tmp_path):
    _write_fleet_hosts(home)
    cli.env["LLMCONSOLE_SSH_COMMAND"] = "ssh -F /dev/null -o StrictHostKeyChecking=no"
    cli("daemon", "start")  # this host's exporter, found through its daemon
    prom = tmp_path / "prometheus"
    shutil.copytree(PROM, prom)
    r = cli("hosts", "prometheus-targets", "--out", str(prom / "targets"), "--local-name", "head")
    exporters = json.loads((prom / "targets" / "llmconsole.json").read_text())
    by_host = {t["labels"]["host"]: t["targets"] for t in exporters}
    port = json.loads(cli("daemon", "status", "--json").stdout)
    assert by_host["gpu1"] == ["10.0.0.11:9400"]  # the hosts file's address, no ssh needed
    assert by_host["gpu2"] == ["127.0.0.1:19402"]  # e.g. an SSH tunnel's local end
    assert "gpu3" not in by_host and "gpu3: unreachable: ssh: connect to host" in r.stderr
    assert by_host["head"][0].startswith("127.0.0.1:"), port
    assert json.loads((prom / "targets" / "vllm.json").read_text()) == []  # no engines yet
    check = subprocess.run(
        ["promtool", "check", "config", str(prom / "prometheus.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout + check.stderr


@needs_promtool
def test_scrape_config_jobs_read_the_files_the_command_writes():
    import yaml

    from llmconsole.console.commands.hosts import ENGINES_FILE, EXPORTER_FILE

    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    files = {job["job_name"]: job["file_sd_configs"][0]["files"] for job in config["scrape_configs"]}
    assert files == {"llmconsole": [f"targets/{EXPORTER_FILE}"], "vllm": [f"targets/{ENGINES_FILE}"]}
    assert config["rule_files"] == ["llmconsole-rules.yml"]


def test_exporter_binds_loopback_unless_told(monkeypatch, tmp_path):
    from llmconsole.daemon.services.exporter import Exporter

    BIND_ENV = "LLMCONSOLE_METRICS_BIND"  # read through llmconsole/settings, as before

    class Nothing:
        def collect(self):  # noqa: ANN202 - a collector with no series
            return iter(())

    monkeypatch.delenv(BIND_ENV, raising=False)
    assert Exporter(Nothing(), tmp_path, port=9400).url == "http://127.0.0.1:9400/metrics"
    monkeypatch.setenv(BIND_ENV, "10.0.0.11")
    assert Exporter(Nothing(), tmp_path, port=9400).url == "http://10.0.0.11:9400/metrics"


# --- Grafana ---------------------------------------------------------------------------------


def test_dashboard_is_the_generator_output():
    sys.path.insert(0, str(DASHBOARD.parent))
    try:
        import make_dashboard
    finally:
        sys.path.pop(0)
    assert DASHBOARD.read_text() == make_dashboard.render(), "run python deploy/grafana/make_dashboard.py"


def test_dashboard_loads_as_a_grafana_dashboard_model():
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("host", "engine", "group"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}" and v["multi"] and v["includeAll"]
    panels = [p for p in d["panels"] if p["type"] != "row"]
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ["Fleet", "KV cache", "Queue and throughput", "Batch window", "SLO", "Restarts and health"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        for t in p["targets"]:
            assert t["expr"] and t["refId"], p["title"]
            assert "$host" in t["expr"], f"{p['title']}: every panel follows the host selection"
    # What the issue asks to see, per host, engine and group.
    titles = " ".join(p["title"] for p in panels)
    for words in (
        "KV cache usage",
        "Requests waiting",
        "Gateway queue",
        "Window",
        "Latency vs target",
        "SLO attainment",
        "Restarts",
    ):
        assert words in titles


def _exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] if p["type"] != "row" for t in p["targets"]]
    return exprs + [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]


def test_dashboard_queries_only_series_that_exist():
    """llmconsole_* names are the exporter's (counters with _total, info with _info); vllm:*
    names are vLLM's (docs and VLLM_NOTES)."""
    source = (ROOT / "llmconsole" / "daemon" / "services" / "exporter.py").read_text()
    vllm = {
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
    }
    seen = set()
    for expr in _exprs():
        names_only = re.sub(r"by \([^)]*\)", "", re.sub(r"\{[^}]*\}", "", expr))  # no label names
        for name in re.findall(r"\b(llmconsole_[a-z0-9_]+|vllm:[a-z0-9_]+)", names_only):
            seen.add(name)
            if name.startswith("vllm:"):
                assert name in vllm, name
            else:
                base = re.sub(r"_(total|info)$", "", name).removeprefix("llmconsole_")
                assert f'"llmconsole_{base}"' in source or f'("{base}"' in source, name
    assert any(n.startswith("vllm:") for n in seen) and any(n.startswith("llmconsole_") for n in seen)


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path):
    """Every query, its variables given values, as a recording rule that promtool parses."""
    import yaml

    rules = []
    for i, expr in enumerate(_exprs()):
        if expr.startswith("label_values("):
            continue
        concrete = (
            expr.replace("$__rate_interval", "1m")
            .replace("$host", ".*")
            .replace("$engine", ".*")
            .replace("$group", ".*")
        )
        rules.append({"record": f"dashboard:query_{i}", "expr": concrete})
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
