"""The directories that hold the control socket, lock, pid file, state and logs must be the
user's own: someone else's, a directory others may write to, or a symbolic link is refused
with the path and the fix, and nothing is created or followed there."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.console.tui.sources.daemon import DaemonSource
from llmconsole.daemon.main import acquire_lock
from llmconsole.paths import Paths, UnsafeDirectory, UntrustedSocket, check_private_dir, resolve
from tests.support.daemon import Cli, short_home, stop_daemon

OTHER_UID = 54321


def _paths(root: Path) -> Paths:
    return Paths(data_dir=root / "data", runtime_dir=root / "run")


def test_fresh_directories_are_created_private(tmp_path):
    p = _paths(tmp_path).ensure()
    for d in (p.data_dir, p.runtime_dir, p.logs_dir):
        assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    _paths(tmp_path).ensure()  # and found again as they are


def test_a_directory_others_may_write_is_refused_with_the_fix(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.chmod(run, 0o777)
    with pytest.raises(UnsafeDirectory) as e:
        _paths(tmp_path).ensure()
    assert str(run) in str(e.value) and "writable by others (mode 0777)" in str(e.value)
    assert f"chmod go-w {run}" in str(e.value)
    os.chmod(run, 0o770)
    with pytest.raises(UnsafeDirectory, match="mode 0770"):
        check_private_dir(run)
    os.chmod(run, 0o755)  # others may read and enter, not write: the user's own choice
    check_private_dir(run)


def test_a_symbolic_link_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(target)
    with pytest.raises(UnsafeDirectory, match="symbolic link") as e:
        _paths(tmp_path).ensure()
    assert str(tmp_path / "run") in str(e.value)
    assert list(target.iterdir()) == []
    # A dangling link (where a directory would be created) is refused too, and nothing is made.
    (tmp_path / "run").unlink()
    (tmp_path / "run").symlink_to(tmp_path / "missing")
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        _paths(tmp_path).ensure()
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another uid needs root")
def test_a_directory_of_another_user_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, OTHER_UID, -1)
    with pytest.raises(UnsafeDirectory) as e:
        _paths(tmp_path).ensure()
    assert f"{data} belongs to uid {OTHER_UID}, not to you (uid 0)" in str(e.value)
    assert "remove it" in str(e.value)


def test_the_shared_tmp_fallback_is_checked_like_any_other(tmp_path):
    p = resolve({"HOME": str(tmp_path)})  # no XDG_RUNTIME_DIR: a directory in /tmp, anyone's to create
    assert p.runtime_dir == Path(f"/tmp/llmconsole-{os.getuid()}")
    p = Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / f"llmconsole-{os.getuid()}")
    p.runtime_dir.mkdir()
    os.chmod(p.runtime_dir, 0o1777)  # as someone who made it first for everyone would
    with pytest.raises(UnsafeDirectory):
        p.ensure()


def test_clients_and_the_daemon_refuse_an_unsafe_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    with pytest.raises(UnsafeDirectory):
        DaemonClient(resolve({"LLMCONSOLE_HOME": str(home)}))
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    env.pop("XDG_RUNTIME_DIR", None)
    for argv in (
        ["-m", "llmconsole.console.cli", "status"],
        ["-m", "llmconsole.console.cli", "daemon", "start"],
        ["-m", "llmconsole.daemon.main"],
    ):
        r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert f"{home} is writable by others" in r.stderr
    assert list(home.iterdir()) == [], "nothing was created there"


def test_the_lock_file_is_never_followed(tmp_path):
    p = _paths(tmp_path).ensure()
    victim = tmp_path / "victim"
    p.lock_file.symlink_to(victim)
    with pytest.raises(OSError):
        acquire_lock(p)
    assert not victim.exists()


# --- a stand-in daemon: a socket, or the process on it, of another user -----------------------

# Root may connect anywhere, so the test runs the stand-in as `nobody`, with the system's own
# Python (the test's virtual environment is not readable by other users here). It prints
# "listening", then every byte any client sends it, so the test sees exactly what got through.
STAND_IN = r"""
import os, socket, sys
path, drop_uid = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
if drop_uid >= 0:
    os.setuid(drop_uid)  # bound as root in root's folder, but listening as another user
s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    try:
        while True:
            data = c.recv(65536)
            if not data:
                break
            sys.stdout.write("GOT " + data.decode("latin-1")); sys.stdout.flush()
            c.sendall(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}')
    except OSError:
        pass
    c.close()
"""
SYSTEM_PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(
    os.getuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="a process of another uid needs root"
)
START_WITH_KEY = (
    "POST /v1/engines/x/start HTTP/1.1\r\nHost: llmconsole\r\nContent-Type: application/json\r\n"
    'Content-Length: 28\r\n\r\n{"api_key": "sk-secret-key"}'
)


class StandIn:
    """A listening socket at `path` held by uid 65534 (nobody): from its start (`as_other`), or
    bound by root and listening as nobody (the socket file root's, only the listener not)."""

    def __init__(self, path: Path, *, as_other: bool):
        nobody = pwd.getpwnam("nobody")
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", STAND_IN, str(path), "-1" if as_other else str(nobody.pw_uid)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: (os.setgid(nobody.pw_gid), os.setuid(nobody.pw_uid))) if as_other else None,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "listening"

    def received(self) -> str:
        """Everything any client sent it (the stand-in is stopped to read it whole)."""
        self.stop()
        out, _ = self.proc.communicate(timeout=10)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _shared_base() -> Path:
    """A folder in /tmp that another user can enter (pytest's tmp_path is root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="llmc-si-", dir="/tmp"))
    os.chmod(base, 0o755)
    return base


@needs_root
def test_dial_stdio_refuses_a_folder_and_socket_made_by_another_user():
    """As over SSH with no XDG_RUNTIME_DIR: the socket's folder in /tmp was made first by another
    user, who listens there. dial-stdio sends it nothing (the request carries an API key)."""
    base = _shared_base()
    runtime = base / "llmconsole"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 65534, 65534)
    stand_in = StandIn(runtime / "control.sock", as_other=True)
    try:
        env = {"XDG_RUNTIME_DIR": str(base), "XDG_DATA_HOME": str(base / "data"), "HOME": str(base)}
        inherited = {k: v for k, v in os.environ.items() if k != "LLMCONSOLE_HOME"}
        r = subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", "daemon", "dial-stdio"],
            env={**inherited, **env},
            input=START_WITH_KEY,
            capture_output=True,
            text=True,
            timeout=60,
        )
        got = stand_in.received()
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert f"{runtime} belongs to uid 65534, not to you (uid 0)" in r.stderr
        assert got == "" and "sk-secret-key" not in r.stdout
        with pytest.raises(UnsafeDirectory):  # the local client, the same
            DaemonClient(resolve(env))
        assert not (base / "data").exists(), "no daemon was started for a folder that is not ours"
    finally:
        stand_in.stop()
        shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_a_listener_of_another_user_in_your_own_folder_is_refused_before_a_byte():
    """The folders and the socket file are this user's; only the process listening is not (the
    kernel's SO_PEERCRED says so). Every client refuses it with nothing sent."""
    base = _shared_base()
    home = base / "home"
    p = resolve({"LLMCONSOLE_HOME": str(home)}).ensure()
    stand_in = StandIn(p.socket, as_other=False)
    try:
        assert p.socket.stat().st_uid == 0
        with DaemonClient(p) as c, pytest.raises(UntrustedSocket, match="runs as uid 65534, not as you") as e:
            c.start_engine("x", api_key="sk-secret-key")
        assert "nothing was sent" in str(e.value)
        source = DaemonSource(p)
        with pytest.raises(UntrustedSocket):  # the console's source, through the same client
            source.poll()
        source.close()
        r = subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", "daemon", "dial-stdio"],
            env=dict(os.environ, LLMCONSOLE_HOME=str(home)),
            input=START_WITH_KEY,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and f"the process answering on {p.socket} runs as uid 65534" in r.stderr
        assert stand_in.received() == ""
    finally:
        stand_in.stop()
        shutil.rmtree(base, ignore_errors=True)


CLIENT_OF_ANOTHER_UID = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: llmconsole\r\nConnection: close\r\n\r\n")
out = b""
while chunk := s.recv(65536):
    out += chunk
print(out.decode())
"""


@needs_root
@pytest.mark.daemon
def test_the_daemon_answers_no_client_of_another_user():
    """Its socket loosened by hand (a chmod, a shared folder), the daemon still answers only its
    own user and root: another uid gets a 403 that says so, and the daemon's log names it."""
    home = short_home("llmc-pu-")
    try:
        cli = Cli(home)
        cli("daemon", "start")
        p = resolve({"LLMCONSOLE_HOME": str(home)})
        for d in (home, p.runtime_dir):
            os.chmod(d, 0o711)
        os.chmod(p.socket, 0o666)
        nobody = pwd.getpwnam("nobody")
        r = subprocess.run(
            [SYSTEM_PYTHON, "-c", CLIENT_OF_ANOTHER_UID, str(p.socket)],
            preexec_fn=lambda: (os.setgid(nobody.pw_gid), os.setuid(nobody.pw_uid)),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("HTTP/1.1 403"), r.stdout
        assert "answers its own user (uid 0) only, not uid 65534" in r.stdout
        assert '"engines"' not in r.stdout
        assert "refused GET /v1/status from uid 65534" in p.daemon_log.read_text()
        assert cli.status()["engines"] == []  # its own user is answered as ever
    finally:
        stop_daemon(home)
        shutil.rmtree(home, ignore_errors=True)
