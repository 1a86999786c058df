"""`llmconsole daemon install --user`: the daemon as a systemd user service.

The unit runs the daemon in the foreground under the user's service manager, so it (and with it
the supervision of the engines) comes back after a crash or a reboot. KillMode=process: stopping
or restarting the unit stops the daemon only, and the engines keep serving until the next daemon
adopts them, exactly as when a daemon started by a console is stopped. With lingering enabled
(`loginctl enable-linger USER`) the user's manager, and the daemon, start at boot without a login.

The daemon's settings come with it: every LLMCONSOLE_* variable of the installing shell (the
gateway key, supervision, memory-mode policy, gateway and metrics ports and hosts, ...) is
written to an environment file, 0600 in the user's llmconsole config folder, that the unit reads
(EnvironmentFile=). Without it a reboot would bring the daemon back with the defaults: an open
gateway door where the operator had set a key. The key is never in the unit file itself, which
systemd shows to anyone who asks (`systemctl show`).

Nothing here runs systemctl: the commands to run are printed, so installing changes only these
two files and the operator decides when the service starts.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from llmconsole.atomic import write_atomic
from llmconsole.paths import check_private_dir

UNIT_NAME = "llmconsole.service"
ENV_FILE_NAME = "daemon.env"


def unit_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / "systemd" / "user" / UNIT_NAME


def env_file_path(env: Mapping[str, str] | None = None) -> Path:
    """The unit's environment file: in the user's llmconsole config folder, beside hosts.toml."""
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / "llmconsole" / ENV_FILE_NAME


def daemon_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The daemon's settings from `env`: every LLMCONSOLE_* variable but LLMCONSOLE_HOME (which the
    unit names itself: it says which daemon this is, and is no secret)."""
    return {k: v for k, v in sorted(env.items()) if k.startswith("LLMCONSOLE_") and k != "LLMCONSOLE_HOME" and v}


def render_env_file(settings: Mapping[str, str]) -> str:
    """KEY="VALUE" lines as systemd's EnvironmentFile= (and sh) read them: inside double quotes a
    backslash keeps the next of \\ " $ ` as it is. A value with a line break is refused."""
    lines = ["# llmconsole daemon settings, read by llmconsole.service (EnvironmentFile=). Secret: keep 0600."]
    for k, v in settings.items():
        if "\n" in v or "\r" in v or "\0" in v:
            raise ValueError(f"{k} holds a line break; the service's environment file cannot carry it")
        escaped = "".join("\\" + c if c in '\\"$`' else c for c in v)
        lines.append(f'{k}="{escaped}"')
    return "\n".join(lines) + "\n"


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


def render_unit(command: list[str], env: Mapping[str, str] | None = None, env_file: Path | None = None) -> str:
    """The unit's text. The environment that chooses where state lives (LLMCONSOLE_HOME) and
    which code runs (PYTHONPATH) is carried over from the installing shell, so the service is the
    daemon the operator's consoles talk to; the daemon's other settings, its key among them, are
    read from `env_file` (never written here)."""
    env = os.environ if env is None else env
    keep = [k for k in ("LLMCONSOLE_HOME", "PYTHONPATH") if env.get(k)]
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
    if env_file is not None:
        lines.append("EnvironmentFile=" + str(env_file).replace("%", "%%"))
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def install(env: Mapping[str, str] | None = None, force: bool = False) -> tuple[Path, bool]:
    """Write the environment file (0600) and the unit; (the unit's path, whether an existing
    different unit was replaced). FileExistsError when a different unit is there and `force` is
    not given; ValueError (nothing written) when a setting cannot go in the environment file or
    its folder is not safely the user's own."""
    env = os.environ if env is None else env
    path = unit_path(env)
    env_path = env_file_path(env)
    env_text = render_env_file(daemon_settings(env))
    text = render_unit(daemon_command(), env, env_path)
    replaced = False
    if path.exists() and path.read_text() != text:
        if not force:
            raise FileExistsError(str(path))
        replaced = True
    check_private_dir(env_path.parent, "remove it, or point XDG_CONFIG_HOME at a folder of yours")
    env_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private_dir(env_path.parent, "remove it, or point XDG_CONFIG_HOME at a folder of yours")
    write_atomic(env_path, env_text, mode=0o600)
    if path.exists() and path.read_text() == text:
        return path, False
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
    """Remove the unit file and its environment file; the unit's path, or None when there was none."""
    with contextlib.suppress(FileNotFoundError):
        env_file_path(env).unlink()
    path = unit_path(env)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
