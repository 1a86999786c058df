"""Rewrite the key table in docs/keys.md from the bindings table: `.venv/bin/python docs/update_keys.py`."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from doc_tables import rewrite_table  # noqa: E402

from llmconsole.console.tui.screens.help import markdown_key_table  # noqa: E402

rewrite_table(ROOT / "docs" / "keys.md", "keys", markdown_key_table())
