"""Byte sizes as people type them (`268435456`, `256MiB`, `1GiB`, `1.5G`), for the start-engine
form and the CLI's `--*-bytes` flags alike, so one accepts what the other does."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?)?b?\s*$", re.IGNORECASE)
HINT = "a size in bytes, such as 268435456, 256MiB or 1GiB"


def parse_size_bytes(text: str) -> int:
    """The size in bytes; ValueError says what a size looks like."""
    m = _SIZE.match(text.replace("_", "").replace(",", ""))
    if not m:
        raise ValueError(f"must be {HINT}")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
