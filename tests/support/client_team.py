"""Background clients for tests that send load while something else happens (a restart, a switch)."""

from __future__ import annotations

import threading


class ClientTeam:
    """`clients` threads running `_run` until the `with` block ends; `_run` loops until `stop`."""

    def __init__(self, clients: int = 3):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
