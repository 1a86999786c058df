"""Rewrite the key table in docs/keys.md from the bindings table: `.venv/bin/python docs/update_keys.py`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmconsole.console.tui.screens.help import markdown_key_table  # noqa: E402

keys_md = ROOT / "docs" / "keys.md"
text = keys_md.read_text()
new, n = re.subn(
    r"(<!-- keys:begin[^\n]*-->\n).*?(\n<!-- keys:end -->)",
    lambda m: m.group(1) + markdown_key_table() + m.group(2),
    text,
    flags=re.S,
)
if n != 1:
    sys.exit("docs/keys.md has no keys:begin/keys:end markers")
keys_md.write_text(new)
print("docs/keys.md key table updated")
