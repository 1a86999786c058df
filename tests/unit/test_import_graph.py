"""No two modules of llmconsole import each other, directly or through others: a circle makes the
import order matter, hides which module a name belongs to, and turns any change in one module of
the circle into a change of all of them.

The graph is import-linter's (grimp), built from the source as lint-imports sees it: imports
inside functions and under TYPE_CHECKING count, as they do for its contracts.
"""

from __future__ import annotations

import grimp
import pytest


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("llmconsole")


def circles(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Each module that is in a circle, and the modules it imports that lead back to it."""
    out: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in graph.modules and graph.chain_exists(importer=imported, imported=module):
                out.setdefault(module, set()).add(imported)
    return out


def test_no_module_of_llmconsole_is_in_an_import_circle(graph):
    found = {m: sorted(back) for m, back in circles(graph).items()}
    assert not found, "import circles (module: the imports that lead back to it):\n" + "\n".join(
        f"  {m}: {', '.join(back)}" for m, back in sorted(found.items())
    )


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("llmconsole.console.tui.app", "llmconsole.console.tui.screens.dashboard"),
        ("llmconsole.db.export", "llmconsole.db.report"),
        ("llmconsole.engine.tune.select", "llmconsole.engine.tune.space"),
        ("llmconsole.console.commands.runs", "llmconsole.console.commands.sweep"),
        ("llmconsole.console.commands.runs", "llmconsole.console.commands.tune"),
    ],
)
def test_circles_broken_before_stay_broken(graph, one, other):
    """Circles there were: the TUI's screens named the app that opens them (now a Protocol,
    console_state.py), the export's report named the exporter's snapshot (now export_snapshot.py),
    the tuner's search space re-exported the selection that names its outcomes, and `runs attach`
    handed a run to the sweep and tune commands, which followed their runs through runs.py (now
    run_follow.py)."""
    assert not (graph.chain_exists(importer=one, imported=other) and graph.chain_exists(importer=other, imported=one))


def test_the_check_finds_a_circle(graph):
    """The check itself: an import added from the report back to the exporter is a circle."""
    graph.add_import(importer="llmconsole.db.report", imported="llmconsole.db.export")
    try:
        assert "llmconsole.db.report" in circles(graph)
    finally:
        graph.remove_import(importer="llmconsole.db.report", imported="llmconsole.db.export")
