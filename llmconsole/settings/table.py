"""Settings as rows: for `llmconsole config show` (values and their sources) and for the table in
docs/settings.md (types, defaults, help), both from the declarations in fields.py."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from llmconsole.settings.fields import env_name, field_of, is_env_only, is_secret, leaf_keys
from llmconsole.settings.load import Resolved


def _plain(value: Any) -> Any:
    """A value as JSON and people read it: paths as text, nothing of a secret."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, SecretStr):
        return None
    return value


def shown(value: Any) -> str:
    if value is None:
        return "unset"
    return str(_plain(value))


def type_text(info: FieldInfo) -> str:
    """The type in words: "positive number", "port (1-65535)", "supported | unsupported"..."""
    ann: Any = info.annotation
    args = typing.get_args(ann)
    optional = isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union
    if optional:
        ann = next(a for a in args if a is not type(None))
    metadata = list(info.metadata)
    if typing.get_origin(ann) is typing.Annotated:  # Port | None keeps Port's bounds inside
        ann, *extra = typing.get_args(ann)
        metadata += [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
    if typing.get_origin(ann) is typing.Literal:
        text = " | ".join(str(a) for a in typing.get_args(ann))
    else:
        base = {int: "whole number", float: "number", str: "text", Path: "path", SecretStr: "secret text"}
        text = base.get(ann, getattr(ann, "__name__", str(ann)))
        bounds = {type(m): m for m in metadata}
        if Ge in bounds and Le in bounds:
            text = f"{text} ({bounds[Ge].ge}-{bounds[Le].le})"
        elif Gt in bounds and bounds[Gt].gt == 0:
            text = f"positive {text}"
    return f"{text}, optional" if optional else text


@dataclass(frozen=True)
class Row:
    key: str
    value: str  # as shown: "set" for a secret that is set, never the secret
    origin: str
    secret: bool
    raw: Any  # for --json; None for a secret

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "from": self.origin, "env": env_name(self.key)}
        if self.secret:
            out["set"] = self.value == "set"
        else:
            out["value"] = self.raw
        return out


def rows(resolved: Resolved) -> list[Row]:
    out = []
    for key in leaf_keys():
        value = resolved.value(key)
        secret = is_secret(key)
        text = ("set" if value is not None else "unset") if secret else shown(value)
        out.append(Row(key, text, str(resolved.origin(key)), secret, None if secret else _plain(value)))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """docs/settings.md's table (docs/update_settings.py writes it; a test keeps them equal)."""
    lines = [
        "| setting | environment | type | default | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in leaf_keys():
        info = field_of(key)
        default = info.get_default(call_default_factory=True)
        env = f"`{env_name(key)}`" + (" (JSON object)" if "." in key else "")
        if is_env_only(key):
            env += ", only"
        what = info.description or ""
        if is_secret(key):
            what += " (a secret: never shown, never a flag)"
        lines.append(f"| `{key}` | {env} | {_cell(type_text(info))} | {_cell(shown(default))} | {_cell(what)} |")
    return "\n".join(lines)
