"""Engine groups at the gateway: who is served with whom, and the changes that are refused."""

from __future__ import annotations

import pytest

from llmconsole.engine.gateway.membership import GroupError, Membership, UnknownGroup

ENGINES = ["a", "b", "c", "d"]


def test_engines_in_no_named_group_are_groups_of_their_own():
    m = Membership()
    assert m.layout(ENGINES) == {"a": ("a",), "b": ("b",), "c": ("c",), "d": ("d",)}
    m = m.with_group("fast", ["a", "b"], ENGINES)
    assert m.layout(ENGINES) == {"fast": ("a", "b"), "c": ("c",), "d": ("d",)}
    assert (m.group_of("a"), m.group_of("b"), m.group_of("c")) == ("fast", "fast", "c")


def test_a_group_may_take_the_name_of_one_of_its_engines():
    m = Membership().with_group("a", ["a", "b"], ENGINES)
    assert m.layout(ENGINES) == {"a": ("a", "b"), "c": ("c",), "d": ("d",)}


def test_set_again_changes_the_engines_and_rm_gives_them_back():
    m = Membership().with_group("fast", ["a", "b"], ENGINES).with_group("fast", ["b", "c"], ENGINES)
    assert m.layout(ENGINES) == {"fast": ("b", "c"), "a": ("a",), "d": ("d",)}
    m2 = m.without_group("fast")
    assert m2.layout(ENGINES) == {e: (e,) for e in ENGINES}
    assert m.groups == {"fast": ("b", "c")}  # values: the old one is unchanged
    with pytest.raises(UnknownGroup, match="no engine group named 'fast'"):
        m2.without_group("fast")


@pytest.mark.parametrize(
    ("name", "members", "message"),
    [
        ("x", ["a", "nope"], "no engine named 'nope'"),
        ("x", ["c"], "engine c is already in group batch"),
        ("d", ["a"], "the name 'd' is taken by an engine outside the group"),
        ("x", [], "needs at least one engine"),
        ("x", ["a", "a"], "named more than once: a"),
        ("bad/name", ["a"], "group name 'bad/name' is not valid"),
    ],
)
def test_bad_changes_are_refused_and_change_nothing(name, members, message):
    m = Membership().with_group("batch", ["c", "d"], ENGINES)
    before = m.layout(ENGINES)
    with pytest.raises(GroupError, match=message):
        m.with_group(name, members, ENGINES)
    assert m.layout(ENGINES) == before


def test_engines_that_leave_the_fleet_leave_their_group_and_an_empty_group_goes():
    m = Membership().with_group("fast", ["a", "b"], ENGINES).with_group("solo", ["c"], ENGINES)
    m = m.pruned(["a", "c", "d"])
    assert m.groups == {"fast": ("a",), "solo": ("c",)}
    m = m.pruned(["a", "d"])
    assert m.groups == {"fast": ("a",)}
    assert m.pruned(["a", "d"]) is m  # nothing to change: the same value (no needless save)


def test_an_engine_created_later_under_a_groups_name_gets_no_route_of_its_own():
    m = Membership().with_group("fast", ["a", "b"], ENGINES)
    assert m.layout([*ENGINES, "fast"]) == {"fast": ("a", "b"), "c": ("c",), "d": ("d",)}


def test_json_round_trip_and_malformed_files():
    m = Membership().with_group("fast", ["a", "b"], ENGINES)
    assert Membership.from_json(m.to_json()) == m
    assert Membership.from_json(None).groups == {}
    assert Membership.from_json({"x": "a", "y": [], "z": ["a", 3, "b"], "w": ["b", "c"]}).groups == {
        "z": ("a", "b"),
        "w": ("c",),
    }  # an engine is in one group at most, even in a hand-edited file


def test_group_ls_shows_a_removed_group_still_finishing_without_a_route():
    from llmconsole.console.commands.group import format_groups
    from llmconsole.wire.gateway import GroupInfo

    row = {"engines": ["a", "b"], "window": 2, "frozen": True, "in_flight": 2, "queued": 3}
    text = format_groups(
        [
            GroupInfo.model_validate(g)
            for g in (
                {**row, "group": "a", "named": False, "retired": False, "gateway_url": "http://127.0.0.1:1/g/a"},
                {**row, "group": "fast", "named": False, "retired": True, "gateway_url": None},
            )
        ]
    )
    lines = text.splitlines()
    assert lines[1].split()[:2] == ["a", "(own)"]
    assert lines[2].split() == ["fast", "(retired,", "finishing)", "a,b", "2", "(frozen)", "2", "3", "-"]
