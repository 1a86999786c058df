"""The store stays a core module: importing all of llmconsole.db pulls in no UI and no supervisor."""

import pkgutil
import subprocess
import sys

import llmconsole.db


def test_db_imports_no_ui_and_no_supervisor():
    mods = ["llmconsole.db"] + [i.name for i in pkgutil.walk_packages(llmconsole.db.__path__, "llmconsole.db.")]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith("
        "('textual.', 'llmconsole.console', 'llmconsole.engine.supervisor', 'matplotlib')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    assert {"llmconsole.db.store", "llmconsole.db.export", "llmconsole.db.migrations"} <= set(mods)
