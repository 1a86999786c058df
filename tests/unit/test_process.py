"""Process groups and adoption checks, on plain OS processes (no engine involved)."""

import asyncio
import os
import sys

import psutil

from llmconsole.engine.process import EngineProcess, ProcessRecord, engine_environ
from tests.support.waiting import wait_until

# A leader with two children, all in the leader's new session, like vLLM's server/core/worker.
TREE = [
    sys.executable,
    "-c",
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']) for _ in range(2)]\n"
    "print('up', flush=True)\n"
    "time.sleep(300)\n",
    "--port",
    "18999",
]


def _launch(tmp_path):
    proc = EngineProcess.launch(TREE, {}, tmp_path / "tree.log", 18999)
    wait_until(proc.group_members, 20, 0.05, "the leader and its two children", ok=lambda members: len(members) >= 3)
    return proc


def test_terminate_takes_the_whole_group(tmp_path):
    proc = _launch(tmp_path)
    members = proc.group_members()
    assert len(members) == 3 and proc.pid in members
    assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    asyncio.run(proc.terminate(drain_timeout_s=5))
    assert proc.group_members() == []
    assert proc.poll() is not None


def test_kill_group_after_the_leader_died_leaves_no_orphans(tmp_path):
    proc = _launch(tmp_path)
    children = [p for p in proc.group_members() if p != proc.pid]
    os.kill(proc.pid, 9)
    wait_until(lambda: proc.poll() is not None, 30, 0.05, "the killed leader's exit")
    assert proc.poll() == -9
    assert all(psutil.pid_exists(c) for c in children), "children outlive their leader until cleaned up"
    asyncio.run(proc.kill_group())
    assert proc.group_members() == []


def test_adopt_checks_create_time_argv_and_port(tmp_path):
    proc = _launch(tmp_path)
    try:
        rec = proc.record
        adopted = EngineProcess.adopt(rec)
        assert adopted is not None and adopted.adopted and adopted.poll() is None
        assert EngineProcess.adopt(ProcessRecord(rec.pid, rec.create_time - 100, rec.port, rec.argv)) is None
        assert EngineProcess.adopt(ProcessRecord(rec.pid, rec.create_time, rec.port, rec.argv + ("x",))) is None
        assert EngineProcess.adopt(ProcessRecord(rec.pid, rec.create_time, 19000, rec.argv)) is None
        assert EngineProcess.adopt(ProcessRecord(2**22 + 7, rec.create_time, rec.port, rec.argv)) is None
    finally:
        asyncio.run(proc.terminate(drain_timeout_s=5))
    assert adopted.poll() == -1, "an adopted process's exit is seen, its code unknowable"


def test_a_script_run_through_its_shebang_line_is_adopted(tmp_path):
    # `vllm serve` is such a script: its process shows the interpreter before the script's path.
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(300)\n")
    script.chmod(0o755)
    proc = EngineProcess.launch([str(script), "serve", "m", "--port", "18998"], {}, tmp_path / "s.log", 18998)
    try:
        # Read once the exec is done: just after the fork the child's command line is empty.
        cmdline = wait_until(
            lambda: psutil.Process(proc.pid).cmdline(), 30, 0.05, "the script's exec", ok=lambda c: str(script) in c
        )
        assert cmdline[0] != str(script)
        adopted = EngineProcess.adopt(proc.record)
        assert adopted is not None and adopted.poll() is None
        assert (
            EngineProcess.adopt(
                ProcessRecord(
                    proc.pid, proc.record.create_time, 18998, (str(script), "serve", "other", "--port", "18998")
                )
            )
            is None
        )
    finally:
        asyncio.run(proc.terminate(drain_timeout_s=5))


def test_an_engine_gets_the_daemons_environment_less_llmconsoles_own_secrets_and_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCONSOLE_GATEWAY_KEY", "gw-key-never-in-an-engine")
    monkeypatch.setenv("LLMCONSOLE_MODE_POLICY", "auto")
    monkeypatch.setenv("LLMCONSOLE_KERNEL", "custom")  # only the spec asks an engine for the kernel
    monkeypatch.setenv("LLMCONSOLE_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("HOME_LIKE_SETTING", "kept")
    proc = EngineProcess.launch(
        TREE, {"HF_TOKEN": "hf_from_the_spec"}, tmp_path / "env.log", 18999, base_env=dict(os.environ)
    )
    try:
        # Read once the exec is done: until then /proc shows the environment the forking process
        # itself started with, not the one the engine is given.
        wait_until(lambda: psutil.Process(proc.pid).cmdline(), 30, 0.05, "the exec", ok=lambda c: c[-1:] == ["18999"])
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            env = dict(e.decode().split("=", 1) for e in f.read().split(b"\0") if b"=" in e)
    finally:
        asyncio.run(proc.kill_group())
    assert not {k for k in env if k.startswith("LLMCONSOLE_")} - {"LLMCONSOLE_KERNEL_CACHE"}
    assert env["LLMCONSOLE_KERNEL_CACHE"] == str(tmp_path / "kernels")
    assert env["HOME_LIKE_SETTING"] == "kept" and env["HF_TOKEN"] == "hf_from_the_spec"


def test_the_engine_environment_is_the_daemons_less_llmconsoles_plus_the_specs():
    daemon = {"PATH": "/bin", "LLMCONSOLE_GATEWAY_KEY": "k", "LLMCONSOLE_HOME": "/h", "LLMCONSOLE_KERNEL": "custom"}
    assert engine_environ(daemon, {"LLMCONSOLE_KERNEL": "custom", "OMP_NUM_THREADS": "1"}) == {
        "PATH": "/bin",
        "LLMCONSOLE_KERNEL": "custom",
        "OMP_NUM_THREADS": "1",
    }
    assert engine_environ(daemon, {}) == {"PATH": "/bin"}
