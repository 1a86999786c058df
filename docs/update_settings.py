"""Rewrite the settings table in docs/settings.md from llmconsole/settings: `.venv/bin/python docs/update_settings.py`."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from doc_tables import rewrite_table  # noqa: E402

from llmconsole.settings.table import markdown_table  # noqa: E402

rewrite_table(ROOT / "docs" / "settings.md", "settings", markdown_table())
