"""The README's key table is the console's: generated from the same table as the footer; and
its table of faults names tests that exist."""

import re

from llmconsole.console.tui.screens.help import markdown_key_table
from tests.support.paths import ROOT


def test_readme_key_table_matches_the_bindings():
    readme = (ROOT / "README.md").read_text()
    begin, end = readme.index("<!-- keys:begin"), readme.index("<!-- keys:end -->")
    shown = readme[begin:end].split("-->", 1)[1].strip()
    assert shown == markdown_key_table(), "run docs/update_readme_keys.py"


def test_readme_faults_table_names_tests_that_exist():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("<!-- faults:begin -->") : readme.index("<!-- faults:end -->")]
    named = set(re.findall(r"\b((?:unit|integration|tui)/test_\w+\.py)", table))
    assert len(named) >= 15
    missing = sorted(n for n in named if not (ROOT / "tests" / n).is_file())
    assert not missing, f"the README's faults table names tests that do not exist: {missing}"
