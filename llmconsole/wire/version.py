"""The wire's schema version, and how a client says that a daemon speaks another one."""

from __future__ import annotations

WIRE_VERSION = 2  # bump when a field changes meaning or is removed; adding one needs no bump
UNVERSIONED = 1  # what an answer that names no version is: the untyped shape before the models
WIRE_HEADER = "X-Llmconsole-Wire"  # on every answer of the control API


def version_note(host: str, wire_version: int, llmconsole_version: str | None) -> str | None:
    """One line naming a daemon whose wire differs from this client's, or None when they agree.

    The client goes on all the same: its models keep what they know of the answer."""
    if wire_version == WIRE_VERSION:
        return None
    runs = f"llmconsole {llmconsole_version}" if llmconsole_version else "an llmconsole"
    side = "newer" if wire_version > WIRE_VERSION else "older"
    return (
        f"{host} runs {runs} (wire v{wire_version}), {side} than this client's (wire v{WIRE_VERSION}): "
        "showing what both know"
    )
