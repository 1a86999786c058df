"""The README's key table is the console's: generated from the same table as the footer."""

from llmconsole.console.tui.screens.help import markdown_key_table
from tests.support.paths import ROOT


def test_readme_key_table_matches_the_bindings():
    readme = (ROOT / "README.md").read_text()
    begin, end = readme.index("<!-- keys:begin"), readme.index("<!-- keys:end -->")
    shown = readme[begin:end].split("-->", 1)[1].strip()
    assert shown == markdown_key_table(), "run docs/update_readme_keys.py"
