"""Rewrite the README's key table from the bindings table: `.venv/bin/python docs/update_readme_keys.py`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmconsole.console.tui.screens.help import markdown_key_table  # noqa: E402

readme = ROOT / "README.md"
text = readme.read_text()
new, n = re.subn(
    r"(<!-- keys:begin[^\n]*-->\n).*?(\n<!-- keys:end -->)",
    lambda m: m.group(1) + markdown_key_table() + m.group(2),
    text,
    flags=re.S,
)
if n != 1:
    sys.exit("README.md has no keys:begin/keys:end markers")
readme.write_text(new)
print("README key table updated")
