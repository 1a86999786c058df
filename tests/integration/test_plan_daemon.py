"""The planner's fit check on the daemon's start and restart path: a config that cannot hold one
request is refused before anything starts, by the CLI and the API alike; `force` lets it through.

The restart check needs an engine to restart: a real vLLM engine is started (and stopped again at
once), so the test is marked `engine`."""

from __future__ import annotations

import time

import pytest

from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.paths import resolve

pytestmark = pytest.mark.engine

BAD = ["--max-model-len", "2048", "--kv-cache-memory-bytes", "100000"]


@pytest.mark.needs_cpu_vllm  # the figures are a CPU engine's (blocks of 128 tokens)
def test_daemon_refuses_configs_that_cannot_fit_on_start_and_restart(cli, tiny_model, home, monkeypatch):
    # The CLI: exit 2, the numbers, the nearest fit, and nothing created.
    r = cli("engine", "start", "bad", "--model", str(tiny_model), *BAD, "--enforce-eager", check=False)
    assert r.returncode == 2, r.stderr
    assert "cannot hold one request of max_model_len 2,048" in r.stderr
    assert "needed: 1,114,112 bytes" in r.stderr and "available: 100,000 bytes" in r.stderr
    assert "nearest config that fits: kv_cache_memory_bytes=1,114,112" in r.stderr
    assert cli.engine("bad") is None
    monkeypatch.setenv("LLMCONSOLE_HOME", str(home))
    bad = {"max_model_len": 2048, "kv_cache_memory_bytes": 100_000}
    with DaemonClient(resolve()) as c:
        # The API: a 400 with the numbers as details, timed at the socket: well under a second.
        t0 = time.perf_counter()
        with pytest.raises(DaemonError) as e:
            c.start_engine("bad", spec={"model": str(tiny_model), **bad})
        assert time.perf_counter() - t0 < 1.0
        assert e.value.status == 400 and any(d.startswith("needed: ") for d in e.value.details)
        # A restart into a misfit is refused the same way and leaves the engine as it was.
        ok = c.start_engine(
            "ok",
            spec={
                "model": str(tiny_model),
                "max_model_len": 512,
                "enforce_eager": True,
                "kv_cache_memory_bytes": 10_000_000,
                "cpu_threads_bind": "nobind",
            },
        )
        with pytest.raises(DaemonError) as e:
            c.restart_engine("ok", overrides=bad)
        assert e.value.status == 400 and any(d.startswith("nearest config that fits") for d in e.value.details)
        assert c.engine("ok")["config_id"] == ok["config_id"]
        # force takes it past the check: the daemon accepts it and vLLM will decide.
        forced = c.restart_engine("ok", overrides=bad, force=True)
        assert forced["config_id"] != ok["config_id"]
        c.stop_engine("ok", 0)
