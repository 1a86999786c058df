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


def test_a_cli_call_starts_without_the_heavy_libraries():
    """Every CLI call imports the parsers of every command: aiohttp, optuna (and numpy), textual
    and vLLM are imported only by the commands that use them, where they run. Together they were
    a third of a second of every `llmconsole status`."""
    code = (
        "import sys\n"
        "import llmconsole.console.cli\n"
        "heavy = ('aiohttp', 'optuna', 'numpy', 'textual', 'vllm', 'torch')\n"
        "print(','.join(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the CLI's start imports {out.stdout.strip()}"
