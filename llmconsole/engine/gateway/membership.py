"""Which engines share a group at the gateway: the operator's named groups, and a group of its
own for every engine named in none.

A group is what one admission window and one controller apply to, and what one route serves
(/g/<group>/v1/...): a high-batch group and a low-latency group can sit behind one front door.
Membership is an immutable value; every change returns a new one, checked against the fleet's
engine names first, so a bad request changes nothing. The daemon keeps it in gateway.json.

A member may be an engine of another host, named ENGINE@HOST (engine names hold no '@', so the
two never meet). Such a member is known only while the daemon holds its address (remote.py):
it is checked against those names, and it never gets a group of its own here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmconsole.engine.fleet import UnknownEngine
from llmconsole.engine.spec_checks import check_name


class GroupError(ValueError):
    """A group change that cannot be made; nothing was changed."""


class UnknownGroup(UnknownEngine):
    def __str__(self) -> str:
        return f"no engine group named {self.args[0]!r}"


def check_group_name(name: str) -> str:
    """Group names follow engine names' rules: they are a path segment of the group's route."""
    try:
        return check_name(name)
    except ValueError as e:
        raise GroupError(str(e).replace("engine name", "group name")) from None


@dataclass(frozen=True)
class Membership:
    """Named groups -> their engines, in the order the operator gave them."""

    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    # --- reading --------------------------------------------------------------------------

    def group_of(self, engine: str) -> str:
        """The group an engine is served in: its named group, else its own."""
        for name, members in self.groups.items():
            if engine in members:
                return name
        return engine

    def layout(self, engines: Iterable[str], remote: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
        """Every group the gateway serves now: named groups (with the engines the fleet holds and
        the `remote` members whose address is known) and one per engine in no named group. An
        engine that was created later under a named group's name has no route of its own until
        one of the two is renamed or removed."""
        engines = list(engines)
        known = {*engines, *remote}
        out = {name: tuple(e for e in members if e in known) for name, members in self.groups.items()}
        out = {name: members for name, members in out.items() if members}
        grouped = {e for members in out.values() for e in members}
        for e in engines:
            if e not in grouped and e not in out:
                out[e] = (e,)
        return out

    def to_json(self) -> dict[str, list[str]]:
        return {name: list(members) for name, members in self.groups.items()}

    @classmethod
    def from_json(cls, data: Any) -> Membership:
        """Read what to_json wrote; anything malformed is left out rather than trusted."""
        if not isinstance(data, dict):
            return cls()
        groups: dict[str, tuple[str, ...]] = {}
        seen: set[str] = set()
        for name, members in data.items():
            if not isinstance(name, str) or not isinstance(members, list):
                continue
            kept = tuple(m for m in members if isinstance(m, str) and m not in seen)
            seen.update(kept)
            if kept:
                groups[name] = kept
        return cls(groups)

    # --- changes --------------------------------------------------------------------------

    def with_group(
        self, name: str, members: Iterable[str], engines: Iterable[str], remote: Iterable[str] = ()
    ) -> Membership:
        """Form group `name` of `members` (or set the engines of an existing one). Engines it
        held before and that are not named again go back to groups of their own. `remote`: the
        members of other hosts whose address is known."""
        check_group_name(name)
        members = list(members)
        remote = set(remote)
        local = set(engines)
        engines = local | remote
        problems = []
        if not members:
            problems.append(f"group {name} needs at least one engine")
        twice = sorted({m for m in members if members.count(m) > 1})
        if twice:
            problems.append(f"engines named more than once: {', '.join(twice)}")
        for m in dict.fromkeys(members):
            if m not in engines and "@" in m:
                problems.append(f"no address known for {m} (`llmconsole group set` asks its host for it)")
                continue
            if m not in engines:
                problems.append(f"no engine named {m!r}")
                continue
            other = self.group_of(m)
            if other != m and other != name:
                problems.append(f"engine {m} is already in group {other} (change or remove that group first)")
        if name in local and name not in members:
            problems.append(
                f"the name {name!r} is taken by an engine outside the group: its own group "
                f"has that route; choose another name or include {name}"
            )
        if problems:
            raise GroupError("; ".join(problems))
        groups = dict(self.groups)
        groups[name] = tuple(dict.fromkeys(members))
        return Membership(groups)

    def without_group(self, name: str) -> Membership:
        """Dissolve a named group; its engines go back to groups of their own."""
        if name not in self.groups:
            raise UnknownGroup(name)
        return Membership({n: m for n, m in self.groups.items() if n != name})

    def pruned(self, engines: Iterable[str], remote: Iterable[str] = ()) -> Membership:
        """Engines that left the fleet (and members of other hosts whose address is no longer
        known) leave their group; a group left empty disappears."""
        engines = {*engines, *remote}
        groups = {n: tuple(e for e in m if e in engines) for n, m in self.groups.items()}
        groups = {n: m for n, m in groups.items() if m}
        return self if groups == dict(self.groups) else Membership(groups)
