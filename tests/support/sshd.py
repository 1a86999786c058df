"""A real OpenSSH server on a loopback port, and an ssh client set up to reach it: what tests of
several hosts stand on.

Each `Sshd` is Debian's openssh-server (`make setup` installs it) run in the foreground by the
test, never the system service: its own host key, its own config, a port of its own, and the
test's own key pair as the one authorized key. The client side is an ssh config file with the
test's key and a known_hosts file holding exactly the servers' host keys, so nothing of the
user's ~/.ssh is read or written; LLMCONSOLE_SSH_COMMAND=`ssh -F that-file` hands it to
llmconsole. `stop()` takes the host off the network as an outage would: the listener and every
open session go, the processes started through the sessions stay.

    def test_x(ssh_fleet):
        a = ssh_fleet.host("alpha")            # a running sshd, reachable as `ssh alpha`
        env = {"LLMCONSOLE_SSH_COMMAND": ssh_fleet.ssh_command}
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.support.tools import find_tool, require_tool

SSHD = find_tool("sshd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair without a passphrase; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


class Sshd:
    def __init__(self, root: Path, name: str, authorized_key: str):
        if SSHD is None:
            require_tool("sshd")
        self.root, self.name = root, name
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.host_key = root / "host_ed25519"
        self.host_public = keygen(self.host_key, f"{name}-host")
        (root / "authorized_keys").write_text(authorized_key + "\n")
        os.chmod(root / "authorized_keys", 0o600)
        self.port = free_port()
        self.user = getpass.getuser()
        self.log = root / "sshd.log"
        self.config = root / "sshd_config"
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    f"AllowUsers {self.user}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    # The test's files live under /tmp (world-writable): the ownership walk would refuse them.
                    "StrictModes no",
                    "PrintMotd no",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def known_hosts_line(self) -> str:
        kind, key = self.host_public.split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}"

    def start(self, timeout_s: float = 15.0) -> None:
        if os.geteuid() == 0:
            # sshd started by root checks for its privilege-separation directory (the Debian
            # service creates it at boot; a container that never ran the service has none).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        log = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd did not listen on {self.port}: {self.log.read_text()[-2000:]}")

    def sessions(self) -> list[psutil.Process]:
        """The sshd processes serving open connections (children of the listener)."""
        if self.proc is None:
            return []
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for p in kids:
            try:
                if p.name() == "sshd" or p.name().startswith("sshd"):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def stop(self) -> None:
        """The host goes off the network: the listener and every open session, not what the
        sessions started (a daemon in a session of its own keeps running, as on a real host)."""
        if self.proc is None:
            return
        sessions = self.sessions()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for p in sessions:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(sessions, timeout=5)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class SshFleet:
    """sshd servers by name, and the one ssh client config that reaches them all."""

    def __init__(self, root: Path):
        self.root = root
        self.client_key = root / "id_ed25519"
        self.client_public = keygen(self.client_key, "llmconsole-test")
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("")
        self.config = root / "ssh_config"
        self.servers: dict[str, Sshd] = {}
        self._write_config()

    @property
    def ssh_command(self) -> str:
        """The ssh llmconsole runs (LLMCONSOLE_SSH_COMMAND): the test's config, no other."""
        return f"ssh -F {self.config}"

    def host(self, name: str) -> Sshd:
        """A started sshd reachable as `ssh NAME` (and as ssh://USER@127.0.0.1:PORT)."""
        if name not in self.servers:
            server = Sshd(self.root / name, name, self.client_public)
            self.servers[name] = server
            self._write_config()
            server.start()
        return self.servers[name]

    def _write_config(self) -> None:
        lines = []
        for name, s in self.servers.items():
            lines += [f"Host {name}", "  HostName 127.0.0.1", f"  Port {s.port}", f"  User {s.user}", ""]
        lines += [
            "Host *",
            f"  IdentityFile {self.client_key}",
            "  IdentitiesOnly yes",
            "  IdentityAgent none",
            f"  UserKnownHostsFile {self.known_hosts}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  CheckHostIP no",
            "  ControlMaster no",
            "  ControlPath none",
            "",
        ]
        self.config.write_text("\n".join(lines))
        self.known_hosts.write_text("".join(s.known_hosts_line + "\n" for s in self.servers.values()))

    def stop_all(self) -> None:
        for s in self.servers.values():
            s.stop()


@pytest.fixture(scope="module")
def ssh_fleet():
    if SSHD is None:
        require_tool("sshd")
    root = Path(tempfile.mkdtemp(prefix="llmc-ssh-", dir="/tmp"))
    os.chmod(root, 0o700)
    fleet = SshFleet(root)
    yield fleet
    fleet.stop_all()
    shutil.rmtree(root, ignore_errors=True)


def remote_command() -> str:
    """llmconsole as the test's own interpreter runs it, with the test's import path."""
    env = ["env", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]
    if os.environ.get("PYTHONPATH"):
        env.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")
    return shlex.join([*env, sys.executable, "-m", "llmconsole.console.cli"])
