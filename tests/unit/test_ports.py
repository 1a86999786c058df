"""Ports the daemon picks for itself lie below the kernel's ephemeral range, so that no client
connection on the host can take one while the daemon that keeps it is down (a kill -9, a crash):
the daemon then came back with "the gateway port ... is taken" and exit 5."""

from __future__ import annotations

import asyncio
import random
import socket

from llmconsole.engine.gateway.proxy import Gateway
from llmconsole.engine.ports import PICK_FLOOR, ephemeral_range, pick_port, pick_range
from llmconsole.engine.supervisor import free_port


def test_the_range_is_read_from_the_kernel(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert ephemeral_range(f) == (40000, 60999)
    assert pick_range(f) == (PICK_FLOOR, 39999)
    f.write_text("not a range")
    assert ephemeral_range(f) == (32768, 60999)  # the kernel's default


def test_a_picked_port_is_below_the_ephemeral_range_and_free():
    low, _ = ephemeral_range()
    rng = random.Random(7)
    for _ in range(20):
        port = pick_port("127.0.0.1", rng=rng)
        assert PICK_FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: the pick holds nothing


def test_a_taken_pick_is_passed_over(tmp_path):
    f = tmp_path / "range"
    f.write_text("21000 60999")  # the gap is PICK_FLOOR..20999
    first = random.Random(0).randint(PICK_FLOOR, 20999)  # what the same generator picks first
    with socket.socket() as blocker:
        try:
            blocker.bind(("127.0.0.1", first))
        except OSError:
            pass  # already someone's: passed over all the same
        assert pick_port("127.0.0.1", path=f, rng=random.Random(0)) != first


def test_no_room_below_the_range_leaves_the_choice_to_the_kernel(tmp_path):
    f = tmp_path / "range"
    f.write_text("20500 60999")
    assert pick_range(f) is None
    port = pick_port("127.0.0.1", path=f)
    assert port > 0


def test_engines_and_the_gateway_get_ports_below_the_ephemeral_range():
    low, _ = ephemeral_range()
    assert PICK_FLOOR <= free_port("127.0.0.1") < low

    async def go() -> int:
        gw = Gateway("127.0.0.1", 0)
        await gw.start()
        try:
            return gw.port
        finally:
            await gw.close()

    assert PICK_FLOOR <= asyncio.run(go()) < low
