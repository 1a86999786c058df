"""Every key of the console in one table, and the user's remapping of it.

The table is the single source for the App's and each screen's BINDINGS, so the footer, the
command palette and the help screen can never disagree about what a key does. Users remap by
id in console.toml:

    [keys]
    stop = "x"

An id the console does not know, a section it does not read, or two actions on one key where
both are live at once is refused with a message naming the file, before the console starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding, BindingType

# Where each binding lives. Bindings of "app" stay live on the dashboard, detail and log screens
# (which add "screen"); the modal screens see only their own.
CONTEXTS = ("app", "dashboard", "screen", "history", "confirm", "form", "help", "mode", "alerts", "run")
_LIVE_TOGETHER = (
    ("app", "screen", "history"),
    ("app", "dashboard"),
    ("confirm",),
    ("form",),
    ("help",),
    ("mode",),
    ("alerts",),
    ("app", "run"),
)


@dataclass(frozen=True)
class KeySpec:
    id: str
    key: str
    action: str
    description: str
    contexts: tuple[str, ...] = ("app",)
    show: bool = True
    priority: bool = False
    palette: bool = True  # listed in the command palette
    key_display: str | None = None
    title: str = ""  # the longer name the palette and the help use
    where: str = ""  # where it acts, when narrower than its context (the help and docs/keys.md say)

    @property
    def long_name(self) -> str:
        return self.title or self.description


KEYS: tuple[KeySpec, ...] = (
    KeySpec("start", "s", "start_engine", "Start", title="Start engine"),
    KeySpec("stop", "k", "stop_engine", "Stop", title="Stop engine"),
    KeySpec("restart", "r", "restart_engine", "Restart", title="Restart engine"),
    KeySpec("logs", "l", "show_logs", "Logs", title="Engine log"),
    KeySpec("detail", "d", "show_detail", "Detail", title="Engine detail"),
    KeySpec("history", "h", "show_history", "History", title="Config history and rollback"),
    KeySpec("new_engine", "n", "new_engine", "New", title="New engine"),
    KeySpec("stop_all", "K", "stop_all", "Stop all", key_display="K", title="Stop all engines"),
    KeySpec(
        "window_freeze", "f", "toggle_window_freeze", "Freeze", title="Freeze or resume the batch-window controller"
    ),
    KeySpec(
        "window_up",
        "plus",
        "nudge_window(1)",
        "Window",
        key_display="+",
        title="Batch window one larger, by hand (freezes the controller)",
    ),
    KeySpec(
        "window_down",
        "minus",
        "nudge_window(-1)",
        "Window",
        key_display="-",
        title="Batch window one smaller, by hand (freezes the controller)",
    ),
    KeySpec("mode", "m", "choose_mode", "Mode", title="Memory mode: performance, balanced, aggressive or auto"),
    KeySpec("alerts", "A", "show_alerts", "Alerts", key_display="A", title="Alerts and automated responses (undo one)"),
    KeySpec(
        "sweep",
        "S",
        "sweep_engine",
        "Sweep",
        key_display="S",
        title="Mini sweep of the selected engine: configs x loads, live table, picks",
    ),
    KeySpec(
        "tune",
        "T",
        "tune_engine",
        "Tune",
        key_display="T",
        title="Auto-tune the selected engine: trials, best so far, recommendation",
    ),
    KeySpec(
        "chart_range", "t", "cycle_range", "Range", title="Charts: the last 5, 15 or 60 minutes", where="the dashboard"
    ),
    KeySpec(
        "chart_pick",
        "g",
        "switch_chart",
        "Chart",
        title="Charts: the PID trace, or KV cache, queue and tok/s (where one fits at a time)",
        where="the dashboard",
    ),
    KeySpec(
        "full_log",
        "v",
        "toggle_full_log",
        "Full log",
        title="Log: the engine's own lines, or every line (requests, health and metrics polls)",
        where="the dashboard and the log screen",
    ),
    KeySpec(
        "search_log",
        "slash",
        "search_log",
        "Search",
        key_display="/",
        title="Search the log",
        where="the dashboard and the log screen",
    ),
    KeySpec("help", "question_mark", "show_help", "Help", key_display="?", title="Help: every key"),
    KeySpec(
        "palette",
        "ctrl+p",
        "command_palette",
        "palette",
        priority=True,
        palette=False,
        show=False,
        title="Command palette",
    ),
    KeySpec("quit", "q", "quit", "Quit", title="Quit (engines keep serving)"),
    KeySpec(
        "clear_search",
        "escape",
        "clear_search",
        "Clear search",
        contexts=("dashboard",),
        palette=False,
        title="Clear the log pane's search",
    ),
    KeySpec("back", "escape", "back", "Back", contexts=("screen", "help", "run"), palette=False),
    KeySpec(
        "rollback",
        "b",
        "app.rollback_selected",
        "Roll back",
        contexts=("history",),
        title="Roll back to the selected version",
    ),
    KeySpec("yes", "y", "answer(True)", "Yes", contexts=("confirm",), palette=False),
    KeySpec("no", "n,escape", "answer(False)", "No", contexts=("confirm",), palette=False),
    KeySpec("submit", "ctrl+s", "submit", "Start engine", contexts=("form",), palette=False),
    KeySpec("cancel", "escape", "cancel", "Cancel", contexts=("form",), palette=False),
    # Priority: the app moves the focus as the key arrives. Otherwise the field under the cursor
    # sees Tab first and passes it up, and keys typed right after it land in that field.
    KeySpec(
        "next_field", "tab", "next_field", "Next field", contexts=("form",), palette=False, show=False, priority=True
    ),
    KeySpec(
        "previous_field",
        "shift+tab",
        "previous_field",
        "Previous field",
        contexts=("form",),
        palette=False,
        show=False,
        priority=True,
    ),
    KeySpec("performance", "p", "pick('performance')", "Performance", contexts=("mode",), palette=False),
    KeySpec("balanced", "b", "pick('balanced')", "Balanced", contexts=("mode",), palette=False),
    KeySpec("aggressive", "a", "pick('aggressive')", "Aggressive", contexts=("mode",), palette=False),
    KeySpec("auto", "u", "pick('auto')", "Auto", contexts=("mode",), palette=False),
    KeySpec("mode_cancel", "escape", "cancel_mode", "Cancel", contexts=("mode",), palette=False),
    KeySpec("undo_response", "u", "undo_selected", "Undo", contexts=("alerts",), palette=False),
    KeySpec("alerts_close", "escape", "close_alerts", "Close", contexts=("alerts",), palette=False),
    KeySpec(
        "run_start",
        "ctrl+s",
        "start_run",
        "Run",
        contexts=("run",),
        palette=False,
        title="Run the sweep or tune the form describes (asks first)",
    ),
    KeySpec(
        "run_cancel",
        "c",
        "cancel_run",
        "Cancel run",
        contexts=("run",),
        palette=False,
        title="Cancel: the run under way stops and the engine's config is put back",
    ),
    KeySpec(
        "apply_winner",
        "a",
        "apply_winner",
        "Apply winner",
        contexts=("run",),
        palette=False,
        title="Apply the tune's recommended config through the guarded apply (asks first)",
    ),
    KeySpec(
        "next_knob",
        "o",
        "next_knob",
        "Next knob",
        contexts=("run",),
        palette=False,
        title="The tune's knob chart: the next knob against goodput",
    ),
)

BY_ID: Mapping[str, KeySpec] = {k.id: k for k in KEYS}

CONTEXT_TITLES = {
    "app": "dashboard, detail, log and history screens",
    "dashboard": "the dashboard",
    "screen": "detail, log and history screens",
    "history": "the history screen",
    "confirm": "questions",
    "form": "the new-engine form",
    "help": "this help",
    "mode": "the mode menu",
    "alerts": "the alerts screen",
    "run": "the sweep and tune screens",
}


class KeymapError(ValueError):
    """console.toml asks for something the console cannot do; the message says what to fix."""


def bindings_for(context: str) -> list[BindingType]:
    return [
        Binding(k.key, k.action, k.description, show=k.show, key_display=k.key_display, priority=k.priority, id=k.id)
        for k in KEYS
        if context in k.contexts
    ]


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("LLMCONSOLE_HOME"):
        return Path(env["LLMCONSOLE_HOME"]).expanduser() / "console.toml"
    base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "llmconsole" / "console.toml"


def _normalize(key: str) -> str:
    from textual.keys import _character_to_key

    return _character_to_key(key) if len(key) == 1 else key


def check_keymap(keymap: Mapping[str, object], source: str = "keymap") -> dict[str, str]:
    """The keymap as {id: key}, or KeymapError naming the first problem."""
    out: dict[str, str] = {}
    for kid, key in keymap.items():
        if kid not in BY_ID:
            known = ", ".join(sorted(BY_ID))
            raise KeymapError(f"{source}: [keys] has an unknown key id {kid!r}; known ids: {known}")
        if not isinstance(key, str) or not key.strip() or any(c.isspace() for c in key):
            raise KeymapError(f'{source}: [keys] {kid} must be a key such as "x" or "ctrl+x", got {key!r}')
        out[kid] = key
    for together in _LIVE_TOGETHER:
        owner: dict[str, str] = {}
        for spec in KEYS:
            if not set(spec.contexts) & set(together):
                continue
            for key in out.get(spec.id, spec.key).split(","):
                key = _normalize(key.strip())
                other = owner.get(key)
                if other is not None and other != spec.id:
                    raise KeymapError(
                        f"{source}: key {key!r} would do both {other} and {spec.id}; "
                        "give one of them another key in [keys]"
                    )
                owner[key] = spec.id
    return out


def load_keymap(path: Path | None = None) -> dict[str, str]:
    """The [keys] table of console.toml ({} when there is no file)."""
    path = config_path() if path is None else path
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise KeymapError(f"{path}: cannot be read ({e})") from None
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise KeymapError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(data) - {"keys"})
    if unknown:
        raise KeymapError(f"{path}: unknown section(s) {', '.join(unknown)}; the console reads only [keys]")
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise KeymapError(f"{path}: keys must be a table ([keys])")
    return check_keymap(keys, str(path))


def effective_key(spec: KeySpec, keymap: Mapping[str, str]) -> str:
    return keymap.get(spec.id, spec.key)
