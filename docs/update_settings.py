"""Rewrite the settings table in docs/settings.md from llmconsole/settings: `.venv/bin/python docs/update_settings.py`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmconsole.settings.table import markdown_table  # noqa: E402

page = ROOT / "docs" / "settings.md"
text = page.read_text()
new, n = re.subn(
    r"(<!-- settings:begin[^\n]*-->\n).*?(\n<!-- settings:end -->)",
    lambda m: m.group(1) + markdown_table() + m.group(2),
    text,
    flags=re.S,
)
if n != 1:
    sys.exit("docs/settings.md has no settings:begin/settings:end markers")
page.write_text(new)
print("docs/settings.md settings table updated")
