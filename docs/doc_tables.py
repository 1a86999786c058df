"""Rewrite a generated table in a docs page: what stands between `<!-- NAME:begin ... -->` and
`<!-- NAME:end -->` is replaced by the table the code makes (update_keys.py, update_settings.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def rewrite_table(page: Path, name: str, table: str) -> None:
    text = page.read_text()
    new, n = re.subn(
        rf"(<!-- {name}:begin[^\n]*-->\n).*?(\n<!-- {name}:end -->)",
        lambda m: m.group(1) + table + m.group(2),
        text,
        flags=re.S,
    )
    if n != 1:
        sys.exit(f"{page.name} has no {name}:begin/{name}:end markers")
    page.write_text(new)
    print(f"{page.name}: the {name} table updated")
