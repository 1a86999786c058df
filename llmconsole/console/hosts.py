"""Hosts: where the daemons a console talks to run.

The local host is one host among them: its daemon answers on the Unix socket of this user. Every
other host is reached with the operator's own OpenSSH client, as `docker -H ssh://` does, so
their ssh config, agent, known_hosts and jump hosts apply unchanged; on the far side
`llmconsole daemon dial-stdio` bridges the SSH channel to that host's control socket, and the
control API is the same HTTP either way. llmconsole stores no key and no password.

A host is named on the command line (`--host DEST`, DEST as ssh takes it: `gpu1`, `ops@gpu1`,
`ssh://ops@gpu1:2222`, or the name of an entry of the hosts file) or in the hosts file,
`hosts.toml` in the config dir:

    [hosts.gpu1]
    destination = "ops@gpu1.example.com"       # required: what `ssh` is given
    command = "/opt/llmconsole/bin/llmconsole"  # optional: llmconsole on that host (default: llmconsole)
    data_dir = "/srv/llmconsole"                # optional: its LLMCONSOLE_HOME
    metrics = "10.0.0.11:9400"                  # optional: its exporter, as Prometheus reaches it
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmconsole.console.client import DaemonClient
from llmconsole.console.ssh import Backoff, SshTransport, ssh_argv
from llmconsole.paths import resolve

LOCAL = "local"
HOSTS_FILE = "hosts.toml"
DEFAULT_COMMAND = "llmconsole"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
# A host name, an ssh config alias, an IPv4 address or an IPv6 one (with a zone): never an option.
_HOSTNAME = re.compile(r"^[A-Za-z0-9_:][A-Za-z0-9._:%-]{0,252}$")
_ENTRY_KEYS = {"destination", "command", "data_dir", "metrics"}


class HostsError(ValueError):
    """A destination or a hosts file that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Destination:
    """An ssh destination as the operator wrote it; given to ssh unchanged (it reads both forms)."""

    text: str
    hostname: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> Destination:
        raw = text.strip()
        if not raw:
            raise HostsError("an ssh destination is empty")
        if raw.startswith("-") or any(c.isspace() or c in "'\"`$;&|<>()\\*?!{}" for c in raw):
            raise HostsError(f"ssh destination {text!r} is not valid: give [user@]host or ssh://[user@]host[:port]")
        if raw.startswith("ssh://"):
            return cls._parse_uri(raw)
        if "://" in raw:
            raise HostsError(f"ssh destination {text!r}: only ssh:// URIs are understood")
        user, at, host = raw.rpartition("@")
        if host.count(":") == 1:
            raise HostsError(
                f"ssh destination {text!r}: ssh reads {host!r} as a host name; give a port as ssh://[user@]host:port"
            )
        return cls(text=raw, hostname=cls._check_host(host, text), user=cls._check_user(user, text) if at else None)

    @classmethod
    def _parse_uri(cls, raw: str) -> Destination:
        try:
            u = urlsplit(raw)
            port = u.port
        except ValueError as e:
            raise HostsError(f"ssh destination {raw!r}: {e}") from None
        if u.path not in ("", "/") or u.query or u.fragment or u.password is not None:
            raise HostsError(f"ssh destination {raw!r}: give ssh://[user@]host[:port] and nothing more")
        if not u.hostname:
            raise HostsError(f"ssh destination {raw!r} names no host")
        host = u.netloc.rpartition("@")[2]
        if port is not None:
            host = host.rsplit(":", 1)[0]
        host = host.strip("[]")
        return cls(
            text=raw.rstrip("/"),
            hostname=cls._check_host(host, raw),
            user=cls._check_user(u.username, raw) if u.username is not None else None,
            port=port,
        )

    @staticmethod
    def _check_host(host: str, text: str) -> str:
        if not _HOSTNAME.match(host):
            raise HostsError(f"ssh destination {text!r}: {host!r} is not a host name or address")
        return host

    @staticmethod
    def _check_user(user: str, text: str) -> str:
        if not _USER.match(user):
            raise HostsError(f"ssh destination {text!r}: {user!r} is not a user name")
        return user

    @property
    def short(self) -> str:
        """How the host reads in a table when the operator gave no name: the destination."""
        return self.text.removeprefix("ssh://")

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Host:
    """One host of the console: this one (no destination), or one reached over SSH."""

    name: str
    destination: Destination | None = None
    command: str = DEFAULT_COMMAND
    data_dir: str | None = None
    metrics: str | None = None
    from_file: bool = field(default=False, compare=False)

    @property
    def is_local(self) -> bool:
        return self.destination is None

    @property
    def label(self) -> str:
        """The name, and where it points when the name does not already say so."""
        if self.destination is None:
            return f"{self.name} (this host)"
        if self.name == self.destination.short:
            return self.name
        return f"{self.name} ({self.destination.short})"

    def remote_command(self, *args: str) -> str:
        """The command line the remote user's shell runs: llmconsole there, on its data dir.

        ssh hands the remote side one string, run by the login shell; `command` is the
        operator's own (a path, or `env ... /path/python -m llmconsole.console.cli`), the
        arguments are quoted here."""
        parts = []
        if self.data_dir:
            parts.append(f"env LLMCONSOLE_HOME={quote_path(self.data_dir)}")
        parts.append(self.command)
        parts.extend(shlex.quote(a) for a in args)
        return " ".join(parts)


LOCAL_HOST = Host(name=LOCAL)


def quote_path(path: str) -> str:
    """A path for the remote shell; a leading ~ stays the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def hosts_file(env: Mapping[str, str] | None = None) -> Path:
    """Where the hosts file is: beside everything else under LLMCONSOLE_HOME when that is set,
    else in the XDG config dir ($XDG_CONFIG_HOME/llmconsole, ~/.config/llmconsole)."""
    env = os.environ if env is None else env
    home = env.get("LLMCONSOLE_HOME")
    if home:
        return Path(home).expanduser() / HOSTS_FILE
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "llmconsole" / HOSTS_FILE


def _check_metrics(value: str, where: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in value):
        raise HostsError(f"{where}: metrics {value!r} is not HOST:PORT")
    return value


def _check_text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise HostsError(f"{where}: {key} must be a non-empty string on one line")
    return value.strip()


def parse_hosts(text: str, source: str = HOSTS_FILE) -> list[Host]:
    """The hosts of a hosts file's text, in file order; HostsError says what is wrong and where."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HostsError(f"{source}: not valid TOML ({e})") from None
    unknown = set(data) - {"hosts"}
    if unknown:
        raise HostsError(
            f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}; hosts are tables named [hosts.NAME]"
        )
    table = data.get("hosts", {})
    if not isinstance(table, dict):
        raise HostsError(f"{source}: `hosts` must be a table of [hosts.NAME] tables")
    out = []
    for name, entry in table.items():
        where = f"{source}: [hosts.{name}]"
        if not _NAME.match(name):
            raise HostsError(
                f"{where}: the name is not valid: use letters, digits, '.', '_' or '-' "
                "(at most 63, starting with a letter or digit)"
            )
        if name == LOCAL:
            raise HostsError(f"{where}: {LOCAL!r} is this host's own name; pick another")
        if not isinstance(entry, dict):
            raise HostsError(f"{where}: must be a table with at least `destination`")
        extra = set(entry) - _ENTRY_KEYS
        if extra:
            raise HostsError(
                f"{where}: unknown key(s) {', '.join(sorted(extra))} (known: {', '.join(sorted(_ENTRY_KEYS))})"
            )
        if "destination" not in entry:
            raise HostsError(f"{where}: `destination` is required (what you would give ssh)")
        try:
            dest = Destination.parse(_check_text(entry["destination"], "destination", where))
        except HostsError as e:
            raise HostsError(f"{where}: {e}") from None
        command = _check_text(entry.get("command", DEFAULT_COMMAND), "command", where)
        data_dir = _check_text(entry["data_dir"], "data_dir", where) if "data_dir" in entry else None
        if data_dir is not None and not (data_dir.startswith("/") or data_dir == "~" or data_dir.startswith("~/")):
            raise HostsError(f"{where}: data_dir {data_dir!r} must be absolute (or start with ~/)")
        metrics = _check_metrics(_check_text(entry["metrics"], "metrics", where), where) if "metrics" in entry else None
        out.append(
            Host(name=name, destination=dest, command=command, data_dir=data_dir, metrics=metrics, from_file=True)
        )
    return out


def load_hosts(path: Path) -> list[Host]:
    """The hosts of the file at `path`; none when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise HostsError(f"{path}: {e.strerror}") from None
    return parse_hosts(text, str(path))


def split_engine(text: str) -> tuple[str, str | None]:
    """`engine@host` -> (engine, host); a bare name -> (name, None). Engine names hold no '@'."""
    name, at, host = text.partition("@")
    if at and (not name or not host):
        raise HostsError(f"{text!r}: write ENGINE@HOST")
    return name, (host if at else None)


class HostCatalog:
    """The hosts this invocation knows: the local one, the hosts file's, and destinations named
    on the command line (with the command line's remote command and data dir, if given)."""

    def __init__(self, path: Path | None = None, *, command: str | None = None, data_dir: str | None = None):
        self.path = path or hosts_file()
        self.command = command
        self.data_dir = data_dir
        self._file: list[Host] | None = None

    @property
    def file_hosts(self) -> list[Host]:
        if self._file is None:
            self._file = load_hosts(self.path)
        return self._file

    def lookup(self, text: str) -> Host:
        """A host by the hosts file's name, `local`, or an ssh destination."""
        if text == LOCAL:
            return LOCAL_HOST
        for h in self.file_hosts:
            if h.name == text:
                return h
        dest = Destination.parse(text)
        if self.data_dir is not None and not (self.data_dir.startswith(("/", "~/")) or self.data_dir == "~"):
            raise HostsError(f"--remote-data-dir {self.data_dir!r} must be absolute (or start with ~/)")
        return Host(name=dest.short, destination=dest, command=self.command or DEFAULT_COMMAND, data_dir=self.data_dir)

    def all_hosts(self) -> list[Host]:
        """This host first, then every host of the hosts file."""
        return [LOCAL_HOST, *self.file_hosts]


def client_for(
    host: Host, *, timeout_s: float = 120.0, start_daemon: bool = False, backoff: Backoff | None = None
) -> DaemonClient:
    """A client of the host's daemon. Over SSH, `start_daemon` has dial-stdio start one there if
    none runs (as a local `engine start` does here); without it a host with no daemon answers
    DaemonNotRunning. Locally the daemon is started by ensure_daemon, not here."""
    if host.destination is None:
        return DaemonClient(resolve(), timeout_s)
    args = ["daemon", "dial-stdio"] if start_daemon else ["daemon", "dial-stdio", "--no-start"]
    argv = ssh_argv(str(host.destination), host.remote_command(*args))
    return DaemonClient(timeout_s=timeout_s, transport=SshTransport(argv, host.name, backoff=backoff), where=host.name)
