"""The layers, lowest first: built-in defaults < config.toml < environment (LLMCONSOLE_*) <
command-line flags (`--set KEY=VALUE`), and where each value came from.

config.toml lives in the config folder (paths.config_dir: LLMCONSOLE_HOME when set, else
$XDG_CONFIG_HOME/llmconsole); nothing creates it, and a missing one is no error. A file that is
not TOML, a key that is no setting, or a value of the wrong type is refused with the file (and
line) or the variable or flag that said it, before anything starts: a daemon must not come up on
a half-understood configuration.

Secrets (the gateway's key) are never taken from a flag (anyone on the host can read a process's
arguments), nor from a config.toml others may read; they are never shown, only whether they are
set and by what.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import pydantic_settings
from pydantic import ValidationError

from llmconsole.paths import config_dir
from llmconsole.settings.fields import (
    GROUPS,
    Settings,
    env_name,
    is_env_only,
    is_secret,
    leaf_keys,
)

CONFIG_NAME = "config.toml"


class SettingsError(ValueError):
    """A setting that cannot be used, with the file:line, variable or flag that gave it."""


@dataclass(frozen=True)
class Origin:
    kind: Literal["default", "config", "env", "flag"]
    where: str = ""  # config: path[:line]; env: the variable; flag: the --set key

    def __str__(self) -> str:
        if self.kind == "default":
            return "default"
        if self.kind == "config":
            return self.where
        if self.kind == "env":
            return f"env {self.where}"
        return f"flag --set {self.where}"


DEFAULT = Origin("default")


@dataclass(frozen=True)
class Layer:
    """What one source says: values (groups as nested dicts) and the origin of each key given."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    """The settings in force and, for every setting, the layer it came from."""

    settings: Settings
    origins: Mapping[str, Origin]
    config_file: Path
    config_found: bool

    def value(self, key: str) -> Any:
        name, _, sub = key.partition(".")
        value = getattr(self.settings, name)
        return getattr(value, sub) if sub else value

    def origin(self, key: str) -> Origin:
        return self.origins.get(key, DEFAULT)


def default_config_file(env: Mapping[str, str] | None = None) -> Path:
    return config_dir(env) / CONFIG_NAME


def load(flags: Iterable[str] = (), config_file: Path | None = None) -> Resolved:
    """The settings from every layer (see the module's docstring); SettingsError says what is
    wrong and where. The environment is this process's."""
    path = config_file if config_file is not None else default_config_file()
    layers = [read_config(path), read_env(), read_flags(flags)]
    values: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    for layer in layers:
        for key, value in layer.values.items():
            if key in GROUPS and isinstance(value, dict) and isinstance(values.get(key), dict):
                values[key] = {**values[key], **value}  # a group: field by field
            else:
                values[key] = value
        origins.update(layer.origins)
    try:
        settings = Settings(**values)
    except ValidationError as e:
        raise SettingsError("\n".join(_explain(err, origins) for err in e.errors())) from None
    known = MappingProxyType({k: origins.get(k, DEFAULT) for k in leaf_keys()})
    return Resolved(settings, known, path, path.is_file())


# --- the layers ------------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"' ]+?)\s*=")


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line each key of a TOML text is on (tomllib does not say): enough for the flat and
    one-table layout config.toml has."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for n, line in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(line):
            table = tuple(p.strip().strip("\"'") for p in m.group(1).split("."))
            lines.setdefault(table, n)
        elif m := _KEY.match(line):
            lines.setdefault(table + tuple(p.strip().strip("\"'") for p in m.group(1).split(".")), n)
    return lines


def read_config(path: Path) -> Layer:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Layer()
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None
    lines = _key_lines(text)

    def at(*key: str) -> Origin:
        line = lines.get(key) or lines.get(key[:1])
        return Origin("config", f"{path}:{line}" if line else str(path))

    known = set(Settings.model_fields)
    origins: dict[str, Origin] = {}
    for key, value in data.items():
        if key not in known:
            raise SettingsError(f"{at(key)}: {key!r} is not a setting (known: {', '.join(sorted(known))})")
        if is_env_only(key):
            raise SettingsError(
                f"{at(key)}: {key} is read from the environment only ({env_name(key)}): "
                f"it is needed before config.toml is found, or by processes that read no config file"
            )
        if is_secret(key):
            _check_private(path, key)
        if key in GROUPS:
            if not isinstance(value, dict):
                raise SettingsError(f"{at(key)}: {key} must be a table ([{key}]) of its fields")
            origins.update({f"{key}.{sub}": at(key, sub) for sub in value})
        else:
            origins[key] = at(key)
    return Layer(dict(data), origins)


def _check_private(path: Path, key: str) -> None:
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise SettingsError(
            f"{path}: holds the secret {key} but others may read it (mode {mode:04o}); run `chmod 600 {path}`"
        )


def read_env() -> Layer:
    """LLMCONSOLE_* as pydantic-settings reads them: a group's variable is a JSON object."""
    try:
        raw = pydantic_settings.EnvSettingsSource(Settings)()
    except pydantic_settings.SettingsError as e:
        name = re.search(r'field "(\w+)"', str(e))
        var = env_name(name.group(1)) if name else "an LLMCONSOLE_ variable"
        raise SettingsError(f"env {var}: not JSON ({e.__cause__ or e})") from None
    origins: dict[str, Origin] = {}
    for key, value in raw.items():
        if key in GROUPS:
            if not isinstance(value, dict):
                raise SettingsError(
                    f"env {env_name(key)}: must be a JSON object of {key} fields, "
                    f"e.g. '{{\"{next(iter(GROUPS[key].model_fields))}\": ...}}'"
                )
            origins.update({f"{key}.{sub}": Origin("env", env_name(key)) for sub in value})
        else:
            origins[key] = Origin("env", env_name(key))
    return Layer(dict(raw), origins)


def read_flags(flags: Iterable[str]) -> Layer:
    """`KEY=VALUE` pairs (`--set gateway_port=8000`, `--set supervision.start_timeout_s=1800`)."""
    values: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    leaves = set(leaf_keys())
    for text in flags:
        key, eq, value = text.partition("=")
        key = key.strip()
        if not eq or not key:
            raise SettingsError(f"--set {text!r}: expected KEY=VALUE, e.g. --set gateway_port=8000")
        if key not in leaves:
            raise SettingsError(f"--set {key}: not a setting (see `llmconsole config show`)")
        if is_secret(key):
            raise SettingsError(
                f"--set {key}: a secret is never taken on the command line (anyone on the host can read a "
                f"process's arguments); set {env_name(key)} or put it in a 0600 config.toml"
            )
        if is_env_only(key):
            raise SettingsError(f"--set {key}: read from the environment only; set {env_name(key)}")
        name, _, sub = key.partition(".")
        if sub:
            values.setdefault(name, {})[sub] = value
        else:
            values[name] = value
        origins[key] = Origin("flag", key)
    return Layer(values, origins)


def _explain(err: Any, origins: Mapping[str, Origin]) -> str:
    """One line per validation error: where the value came from, which setting, what is wrong,
    and the value itself unless it is a secret."""
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc[:2])
    where = origins.get(key)
    if where is None:  # a group's own check (mode_policy's thresholds): whoever set its fields
        given = sorted({str(o) for k, o in origins.items() if k.startswith(f"{key}.")})
        where_text = ", ".join(given) or "default"
    else:
        where_text = str(where)
    msg = str(err["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's own words
    if err["type"] == "extra_forbidden" and loc[0] in GROUPS:
        msg = f"not a field of {loc[0]} (known: {', '.join(GROUPS[loc[0]].model_fields)})"
    elif not is_secret(loc[0]) and err["type"] not in ("value_error",):
        msg = f"{msg} (got {err['input']!r})"
    return f"{where_text}: {key}: {msg}"
