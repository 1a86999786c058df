"""What a command is, and what came of it, in words: the console's notifications.

Every command used to end in `<command>: done`, so freezing the controller and setting the
window by hand read the same. Each now says what was asked and, from the daemon's answer, what
happened: `window t1: controller frozen at 8`, `window t1: set to 9 by hand (f resumes the
controller)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmconsole.console.tui.sources.daemon import Command


def asked(c: Command) -> str:
    """The command as sent: `window t1: freeze the controller`."""
    spec = c.spec or {}
    if c.verb == "window":
        if "set" in spec:
            return f"window {c.engine}: set to {spec['set']} by hand"
        return f"window {c.engine}: {'freeze' if spec.get('freeze') else 'resume'} the controller"
    if c.verb == "mode":
        return f"mode {c.engine}: switch to {spec.get('mode')}"
    if c.verb == "rollback":
        return f"rollback {c.engine} to config {spec.get('to')}"
    if c.verb == "undo":
        return f"undo response #{spec.get('action_id')}"
    return str(c)


def done(c: Command, reply: Mapping[str, Any]) -> str:
    """What the daemon's answer says came of it."""
    spec = c.spec or {}
    if c.verb == "window":  # the daemon answers with the window's state; say what was asked where it does not
        window = reply.get("window", spec.get("set"))
        at = f" at {window}" if window is not None else ""
        if "set" in spec:
            return f"window {c.engine}: set to {window} by hand; the controller is frozen (f resumes it)"
        if reply.get("frozen", spec.get("freeze")):
            return f"window {c.engine}: controller frozen{at} (+/- set it by hand, f resumes)"
        return f"window {c.engine}: controller resumed" + (f" from {window}" if window is not None else "")
    if c.verb == "mode":
        applied = reply.get("applied") or {}
        took = applied.get("took_s")
        how = f" in {took:.0f} s" if isinstance(took, (int, float)) else ""
        if spec.get("mode") == "auto":
            return f"mode {c.engine}: the auto policy picks it from now on (now {reply.get('mode')})"
        return f"mode {c.engine}: now {reply.get('mode')}{how}, config {applied.get('to_config_id', '?')}"
    if c.verb == "stop_all":
        stopped, missed = reply.get("stopped") or [], reply.get("missed") or []
        text = f"stopped {', '.join(stopped)}" if stopped else "no engine was running"
        return text + (f"; not reached: {', '.join(missed)}" if missed else "")  # hosts that did not answer
    if c.verb == "start":
        return f"start {c.engine}: launched; its start shows on the dashboard"
    if c.verb == "restart":
        return f"restart {c.engine}: restarting on config {reply.get('config_id', '?')}"
    if c.verb == "stop":
        return f"stop {c.engine}: {reply.get('state', 'stopped')}"
    if c.verb == "rollback":
        return f"rollback {c.engine}: restarting on config {spec.get('to') or reply.get('config_id', '?')}"
    if c.verb == "undo":
        return f"response #{spec.get('action_id')} undone"
    return f"{c}: done"
