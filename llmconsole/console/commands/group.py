"""`llmconsole group`: engine groups at the gateway. A group's engines share one route
(/g/NAME/v1/...), one admission window and one controller; each request goes to the group's
ready engine with the fewest requests outstanding. An engine in no named group is a group of
its own, under its own name.

  llmconsole group ls [--json]                 every group served, named or an engine's own, and
                                               a removed group still finishing its requests
  llmconsole group set fast e1 e2              form group "fast" of e1 and e2 (or change it)
  llmconsole group set fast e1 e2@gpu1         ... with an engine of another host: its daemon is
                                               asked (over ssh) where it listens and for its
                                               key, and the gateway here sends it requests
  llmconsole group rm fast                     dissolve it (asks first); e1 and e2 go back to
                                               groups of their own
"""

from __future__ import annotations

import argparse
import json
import sys

from llmconsole.console.cli_common import EXIT_USAGE, CliError, confirm, current_host, daemon_client, na
from llmconsole.console.client import DaemonError
from llmconsole.console.hosts import HostCatalog
from llmconsole.wire.gateway import GroupInfo, GroupsAnswer


def format_groups(groups: list[GroupInfo]) -> str:
    if not groups:
        return "no engine groups (no engines)"
    rows = [("GROUP", "ENGINES", "WINDOW", "IN FLIGHT", "QUEUED", "GATEWAY URL")]
    for g in groups:
        window = f"{na(g.window)}{' (frozen)' if g.frozen else ''}"
        name = g.group if g.named else f"{g.group} ({'retired, finishing' if g.retired else 'own'})"
        down = {n for n, m in g.members.items() if m.remote and not m.ready}
        engines = ",".join(f"{e} (down)" if e in down else e for e in g.engines)
        rows.append((name, engines, window, na(g.in_flight), na(g.queued), g.gateway_url or "-"))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _fail(e: DaemonError) -> CliError:
    return CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1)


def cmd_ls(ns: argparse.Namespace) -> int:
    with daemon_client() as client:
        groups = GroupsAnswer.model_validate({"groups": client.groups()}).groups
    print(json.dumps([g.to_wire() for g in groups], indent=1) if ns.json else format_groups(groups))
    return 0


def cmd_set(ns: argparse.Namespace) -> int:
    from llmconsole.engine.gateway.membership import GroupError, check_group_name

    try:
        check_group_name(ns.name)  # before it becomes part of a URL
    except GroupError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    from llmconsole.console.members import resolve_members

    catalog = getattr(ns, "catalog", None) or HostCatalog()
    names, remote = resolve_members(catalog, current_host(), ns.engines)  # before anything changes
    with daemon_client() as client:
        try:
            g = GroupInfo.model_validate(client.set_group(ns.name, names, {m.name: m.body() for m in remote}))
        except DaemonError as e:
            raise _fail(e) from None
    if ns.json:
        print(json.dumps(g.to_wire(), indent=1))
        return 0
    print(f"group {g.group}: {', '.join(g.engines)}; window {na(g.window)}; clients use {g.gateway_url}/v1/...")
    for m in remote:
        seen = g.members.get(m.name)
        reason = (seen.health or {}).get("reason") if seen is not None else None
        ready = seen is not None and seen.ready
        now = "answering" if ready else f"not answering yet ({reason or 'not checked'})"
        key = "its API key kept by the gateway's daemon" if m.api_key else "no API key"
        print(f"  {m.name} at {m.url}: {now}; {key}")
        if m.api_key is None and "//127.0.0.1:" not in m.url and "//[::1]:" not in m.url:
            print(f"  note: {m.name} has no API key: whatever reaches {m.url} reaches it", file=sys.stderr)
    return 0


def cmd_rm(ns: argparse.Namespace) -> int:
    with daemon_client() as client:
        answer = GroupsAnswer.model_validate({"groups": client.groups()})
        groups = {g.group: g for g in answer.groups if g.named}
        if ns.name not in groups:
            raise CliError(f"no engine group named {ns.name!r}", EXIT_USAGE)
        engines = ", ".join(groups[ns.name].engines)
        confirm(
            f"Remove engine group {ns.name}? Its engines ({engines}) go back to groups of their own, "
            f"and {groups[ns.name].gateway_url} stops answering.",
            ns.yes,
        )
        try:
            done = client.remove_group(ns.name)
        except DaemonError as e:
            raise _fail(e) from None
    print(f"removed group {done['removed']}; {', '.join(done['engines'])} each serve on a group of their own")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("group", help="engine groups at the gateway: several engines behind one route and window")
    gs = g.add_subparsers(dest="group_cmd", required=True)
    ls = gs.add_parser("ls", help="every group the gateway serves")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    st = gs.add_parser("set", help="form a named group of engines, or change its engines")
    st.add_argument("name")
    st.add_argument(
        "engines",
        nargs="+",
        metavar="ENGINE",
        help="an engine of this host, or ENGINE@HOST: one of another host, bound to an address this host reaches",
    )
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_set)
    rm = gs.add_parser("rm", help="dissolve a named group; its engines go back to groups of their own")
    rm.add_argument("name")
    rm.add_argument("--yes", action="store_true", help="do not ask")
    rm.set_defaults(func=cmd_rm)
