"""Keep secrets out of what the store writes and what an export carries.

A spec's public dict already leaves secrets out (engine/secrets.py says what one is), but
free-form parts (an action's detail, an alert's detail, a log line) can still hold a token
someone pasted. Any value under a key that names a secret is replaced, and so is every
occurrence of a string the caller knows is secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from llmconsole.engine.secrets import SECRET_VALUE, is_secret_name

REDACTED = SECRET_VALUE

# `api_key='sk-...'`, `"hf_token": "hf_..."`, `SECRET=xyz` inside free text such as a log line.
_KEY_VALUE_IN_TEXT = re.compile(r"""(?P<key>[\w.-]+)(?P<sep>["']?\s*[:=]\s*["']?)(?P<value>[^\s"',}\]]+)""")
# `--api-key sk-...`, `--hf-token=...` in a command line that someone logged.
_FLAG_VALUE_IN_TEXT = re.compile(r"(?P<flag>--[\w-]+)(?P<sep>\s+|=)(?P<value>[^\s-][^\s]*)")


def is_secret_key(key: str) -> bool:
    """api_key, HF_TOKEN, client_secret, password, ... but not api_key_set (a bool that says
    only whether a key exists), max_num_batched_tokens (a count) nor tokenizer_mode."""
    return is_secret_name(key)


def scrub(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of `value` (JSON-like) with secret-named keys and known secret strings redacted."""
    known = sorted({s for s in secrets if s}, key=len, reverse=True)
    return _scrub(value, known)


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Free text with known secrets and the values of secret-named keys redacted."""
    return _scrub_text(text, sorted({s for s in secrets if s}, key=len, reverse=True))


def _scrub_text(text: str, known: list[str]) -> str:
    for s in known:
        text = text.replace(s, REDACTED)
    text = _FLAG_VALUE_IN_TEXT.sub(
        lambda m: f"{m['flag']}{m['sep']}{REDACTED}" if is_secret_key(m["flag"].lstrip("-")) else m[0], text
    )

    def _value(m: re.Match[str]) -> str:
        if not is_secret_key(m["key"]) or m["value"] in ("None", "null", "True", "False", REDACTED):
            return m[0]
        return f"{m['key']}{m['sep']}{REDACTED}"

    return _KEY_VALUE_IN_TEXT.sub(_value, text)


def _scrub(value: Any, known: list[str]) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and is_secret_key(k) and v is not None and not isinstance(v, bool):
                out[k] = REDACTED
            else:
                out[k] = _scrub(v, known)
        return out
    if isinstance(value, (list, tuple)):
        return [_scrub(v, known) for v in value]
    if isinstance(value, str):
        return _scrub_text(value, known)
    return value


def scrub_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's public dict as the store keeps it: verbatim, save that a secret can never be in it.

    `EngineSpec.public_dict()` already holds no secret; this is the guard for any other caller.
    Only values that are secrets are replaced (an API key, the value of a secret-named env var),
    so extra args such as `--tokenizer-mode=auto` and counts of tokens stay as they ran.
    """
    out = dict(spec)
    if out.get("api_key") is not None:
        out["api_key"] = REDACTED
    env = out.get("env")
    if isinstance(env, Mapping):
        out["env"] = {k: (REDACTED if is_secret_name(str(k)) else v) for k, v in env.items()}
    return out
