"""`llmconsole daemon install --user`: the daemon as a systemd user service.

The unit runs the daemon in the foreground under the user's service manager, so it (and with it
the supervision of the engines) comes back after a crash or a reboot. KillMode=process: stopping
or restarting the unit stops the daemon only, and the engines keep serving until the next daemon
adopts them, exactly as when a daemon started by a console is stopped. With lingering enabled
(`loginctl enable-linger USER`) the user's manager, and the daemon, start at boot without a login.

Nothing here runs systemctl: the commands to run are printed, so installing changes only the
one file and the operator decides when the service starts.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from llmconsole.atomic import write_atomic

UNIT_NAME = "llmconsole.service"


def unit_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / "systemd" / "user" / UNIT_NAME


def daemon_command() -> list[str]:
    """How the unit starts the daemon: this installation's `llmconsole`, in the foreground."""
    beside = Path(sys.executable).parent / "llmconsole"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), "daemon", "start", "--foreground"]
    found = shutil.which("llmconsole")
    if found:
        return [str(Path(found).absolute()), "daemon", "start", "--foreground"]
    return [sys.executable, "-m", "llmconsole.console.cli", "daemon", "start", "--foreground"]


def _systemd_quote(arg: str) -> str:
    """An ExecStart word: systemd splits on spaces and honours quotes; '%' and '$' are its own."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if not escaped or any(c.isspace() or c in "\"'\\;" for c in escaped):
        return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


def render_unit(command: list[str], env: Mapping[str, str] | None = None) -> str:
    """The unit's text. The environment that chooses where state lives (LLMCONSOLE_HOME) and
    which code runs (PYTHONPATH) is carried over from the installing shell, so the service is the
    daemon the operator's consoles talk to."""
    env = os.environ if env is None else env
    keep = [
        k
        for k in (
            "LLMCONSOLE_HOME",
            "LLMCONSOLE_METRICS_PORT",
            "LLMCONSOLE_METRICS_BIND",
            "LLMCONSOLE_CPU_KV_BUDGET_BYTES",
            "PYTHONPATH",
        )
        if env.get(k)
    ]
    lines = [
        "[Unit]",
        "Description=llmconsole daemon: supervises this host's vLLM engines",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_quote(a) for a in command),
        "Restart=on-failure",
        "RestartSec=5",
        # Another daemon already serving this data dir (started by a console) is not a failure
        # to retry forever: stop that one, then start the unit.
        "RestartPreventExitStatus=3",
        # The engines are the daemon's children but outlive it: stopping the unit stops the
        # daemon alone; the next daemon adopts the engines.
        "KillMode=process",
        "TimeoutStopSec=60",
    ]
    lines += [f"Environment={_systemd_quote(f'{k}={env[k]}')}" for k in keep]
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def install(env: Mapping[str, str] | None = None, force: bool = False) -> tuple[Path, bool]:
    """Write the unit; (its path, whether an existing different unit was replaced).
    FileExistsError when a different unit is there and `force` is not given."""
    path = unit_path(env)
    text = render_unit(daemon_command(), env)
    replaced = False
    if path.exists():
        if path.read_text() == text:
            return path, False
        if not force:
            raise FileExistsError(str(path))
        replaced = True
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=0o644)
    return path, replaced


def next_steps(user: str | None = None) -> list[str]:
    user = user or os.environ.get("USER") or "$USER"
    return [
        "systemctl --user daemon-reload",
        "llmconsole daemon stop            # if a daemon started by a console runs now (engines keep serving)",
        f"systemctl --user enable --now {UNIT_NAME}",
        f"loginctl enable-linger {shlex.quote(user)}   # start at boot, without a login",
    ]


def uninstall(env: Mapping[str, str] | None = None) -> Path | None:
    """Remove the unit file; its path, or None when there was none."""
    path = unit_path(env)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
