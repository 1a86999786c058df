"""The core (engine/, db/, kernels/) never imports the UI (textual, llmconsole.console) nor the
daemon (llmconsole.daemon): import-linter says so statically, this says so of what really loads."""

import pkgutil
import subprocess
import sys


def _core_modules():
    for pkg in ("engine", "db", "kernels"):
        mod = __import__(f"llmconsole.{pkg}", fromlist=["_"])
        yield f"llmconsole.{pkg}"
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"llmconsole.{pkg}."):
            yield info.name


def test_core_imports_no_ui():
    mods = [m for m in _core_modules()]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith(('textual.', 'llmconsole.console', 'llmconsole.daemon')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core modules pulled in UI modules: {out.stdout}"
    assert len(mods) >= 8, mods  # the walk really found the core
