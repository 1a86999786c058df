"""A stand-in for `vllm serve` made of real OS processes, for supervision tests that need no vLLM.

`install(dir)` writes an executable that takes vLLM's command line; the supervisor launches it as
it would vLLM (its own session, its log as stdout). What it does is read at each launch from the
file named by FAKE_ENGINE_CONTROL in its environment: `serve` answers 200 on every path (like
/health and /metrics), `hang` never listens (a load that does not finish), `exit` fails at once.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from llmconsole.engine.runtime import Runtime
from llmconsole.engine.spec import EngineSpec

CONTROL_ENV = "FAKE_ENGINE_CONTROL"

_SCRIPT = r"""
import http.server, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1]
control = os.environ.get("FAKE_ENGINE_CONTROL")
mode = open(control).read().strip() if control else "serve"
print(f"fake engine pid {os.getpid()} mode {mode} port {port}", flush=True)
if mode == "hang":
    time.sleep(3600)
    sys.exit(0)
if mode == "exit":
    print("fake engine: refusing to start", flush=True)
    sys.exit(3)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"" if self.path == "/health" else b"# fake engine\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()
"""


class FakeEngine:
    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.exe = root / "vllm"
        self.exe.write_text(f"#!{sys.executable}\n{_SCRIPT}")
        self.exe.chmod(self.exe.stat().st_mode | stat.S_IXUSR)
        self.control = root / "control"
        self.set("serve")
        self.runtime = Runtime(kind="vllm-serve", executable=str(self.exe), device="cpu")

    def set(self, mode: str) -> None:
        """What the next launch does: serve, hang or exit."""
        self.control.write_text(mode)

    def spec(self, model: str = "fake/model", **fields) -> EngineSpec:
        env = dict(fields.pop("env", {}), **{CONTROL_ENV: str(self.control)})
        return EngineSpec(model=model, runtime=self.runtime, env=env, **fields)

    def kill_all(self) -> None:
        """Kill every process still running this stand-in (engines and strangers alike)."""
        for p in psutil.process_iter(["cmdline"]):
            if str(self.exe) in (p.info["cmdline"] or []):
                try:
                    p.kill()
                except psutil.Error:
                    pass

    def stranger(self, port: int) -> subprocess.Popen[bytes]:
        """Something else answering 200 on `port`, launched by nobody's supervisor."""
        p = subprocess.Popen(
            [str(self.exe), "serve", "x", "--host", "127.0.0.1", "--port", str(port)],
            env=dict(os.environ, **{CONTROL_ENV: ""}),
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return p
            except OSError:
                time.sleep(0.05)
        p.kill()
        raise AssertionError(f"the stranger did not come up on port {port}")
