"""Clients that keep streamed completions going through a gateway while a test restarts or rolls
back the engine behind it: every answer read to its end, every failure kept."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx


def stream_body(model: str, max_tokens: int = 96) -> dict[str, Any]:
    """A streamed completion of a fixed length, with its usage in the last event."""
    return {
        "model": model,
        "prompt": "a live stream",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream_completion(url: str, body: dict[str, Any], timeout_s: float = 300) -> tuple[int, list[dict], bool]:
    """A streamed answer read to its end: (status, events, whether it ended with [DONE])."""
    events, done = [], False
    with httpx.Client(timeout=timeout_s) as c, c.stream("POST", url, json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return r.status_code, events, done


class LiveStreams:
    """`clients` threads, each streaming one completion after another until the block ends."""

    def __init__(self, url: str, body: dict[str, Any], clients: int = 4) -> None:
        self.results: list[tuple[int, list[dict], bool]] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(url, body)) for _ in range(clients)]

    def _client(self, url: str, body: dict[str, Any]) -> None:
        while not self._stop.is_set():
            try:
                self.results.append(stream_completion(url, body))
            except BaseException as err:  # noqa: BLE001 - any failure is what the tests look for
                self.failures.append(err)

    def __enter__(self) -> LiveStreams:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(300)
