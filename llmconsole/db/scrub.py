"""Keep secrets out of what the store writes and what an export carries.

A spec's public dict already leaves the API key out, but free-form parts (`env`, an action's
detail, an alert's detail) can still hold a token someone pasted. Any value under a key that
names a secret is replaced, and so is every occurrence of a string the caller knows is secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "<redacted>"

# api_key, API_KEY, hf_token, HF_TOKEN, client_secret, password, ... but not "api_key_set"
# (a bool that says only whether a key exists) nor "max_num_batched_tokens" (a count).
_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|passw(or)?d|authorization)", re.IGNORECASE)
_NOT_SECRET_KEYS = {"api_key_set"}

# `api_key='sk-...'`, `"hf_token": "hf_..."`, `SECRET=xyz` inside free text such as a log line.
_KEY_VALUE_IN_TEXT = re.compile(r"""(?P<key>[\w.-]+)(?P<sep>["']?\s*[:=]\s*["']?)(?P<value>[^\s"',}\]]+)""")
# `--api-key sk-...`, `--hf-token=...` in a command line that someone logged.
_FLAG_VALUE_IN_TEXT = re.compile(r"(?P<flag>--[\w-]+)(?P<sep>\s+|=)(?P<value>[^\s-][^\s]*)")


def is_secret_key(key: str) -> bool:
    if key in _NOT_SECRET_KEYS:
        return False
    if "tokens" in key.lower():
        return False  # max_num_batched_tokens, kv_cache_tokens: counts; credentials are a "token"
    return bool(_SECRET_KEY.search(key))


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
        lambda m: f"{m['flag']}{m['sep']}{REDACTED}" if is_secret_key(m["flag"].lstrip("-")) else m[0], text)

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
