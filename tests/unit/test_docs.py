"""The README and docs/: the README fits a screen or two, every link between them resolves, the key
table is the console's own (generated from the table the footer uses), and the faults table names
tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

from llmconsole.console.tui.screens.help import markdown_key_table
from tests.support.paths import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
# [text](target): the target up to its closing parenthesis; images the same.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = _FENCE.sub("", page.read_text())
    heads = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def _links(page: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", page.read_text()))


def test_the_readme_fits_a_screen_or_two():
    assert (ROOT / "README.md").stat().st_size <= 10_500


def test_every_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in _links(page):
            if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked offline
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_maps_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    unlinked = [d.name for d in DOCS if f"docs/{d.name}" not in readme]
    assert not unlinked, f"docs/ pages the README's map does not name: {unlinked}"


def test_the_key_table_matches_the_bindings():
    keys = (ROOT / "docs" / "keys.md").read_text()
    begin, end = keys.index("<!-- keys:begin"), keys.index("<!-- keys:end -->")
    shown = keys[begin:end].split("-->", 1)[1].strip()
    assert shown == markdown_key_table(), "run docs/update_keys.py"


def test_the_faults_table_names_tests_that_exist():
    testing = (ROOT / "docs" / "testing.md").read_text()
    table = testing[testing.index("<!-- faults:begin -->") : testing.index("<!-- faults:end -->")]
    named = set(re.findall(r"\b((?:unit|integration|tui)/test_\w+\.py)", table))
    assert len(named) >= 15
    missing = sorted(n for n in named if not (ROOT / "tests" / n).is_file())
    assert not missing, f"the faults table names tests that do not exist: {missing}"
