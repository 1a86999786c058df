"""What crosses the control socket: one set of typed, versioned models shared by the daemon and
every client (docs/architecture.md, "The wire").

The daemon builds its answers from these models and dumps them (`model_dump(mode="json")`);
clients read them back with `model_validate`. Every model ignores fields it does not know and
defaults the ones it misses, so a client shows what it can of a newer or older daemon's answer.
`WIRE_VERSION` is the schema's number: fields may be added freely, and it goes up when a field
changes meaning or goes away. Every answer carries it in the `X-Llmconsole-Wire` header; the
status and daemon answers carry it in their body too. An answer without it is version 1 (the
untyped dicts of the daemons before this package).

This package imports neither the daemon, nor the console, nor Textual (an import-linter contract).
"""

from __future__ import annotations

from llmconsole.wire.version import UNVERSIONED, WIRE_HEADER, WIRE_VERSION, version_note

__all__ = ["UNVERSIONED", "WIRE_HEADER", "WIRE_VERSION", "version_note"]
