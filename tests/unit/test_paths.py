"""The directories that hold the control socket, lock, pid file, state and logs must be the
user's own: someone else's, a directory others may write to, or a symbolic link is refused
with the path and the fix, and nothing is created or followed there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.daemon.main import acquire_lock
from llmconsole.paths import Paths, UnsafeDirectory, check_private_dir, resolve

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
