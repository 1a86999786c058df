"""The start-engine form: the spec's fields, checked with EngineSpec itself as the user types.

The form never keeps rules of its own beyond turning text into numbers: what is valid is what
EngineSpec accepts, and its messages (validation_messages) appear under the field they name.
Errors show for fields the user has touched, and for all of them on submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from llmconsole.console.sizes import parse_size_bytes
from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.planner_panel import PlannerPanel
from llmconsole.engine.spec import EngineSpec, validation_messages
from llmconsole.engine.spec_checks import check_name


@dataclass(frozen=True)
class FormField:
    name: str
    label: str
    kind: str  # text | int | bytes | float | bool | tristate
    placeholder: str = ""


FIELDS = (
    FormField("name", "engine name", "text", "e.g. demo"),
    FormField("model", "model", "text", "directory or Hugging Face name"),
    FormField("served_model_name", "served model name", "text", "default: the model's name"),
    FormField("max_num_seqs", "max_num_seqs", "int", "vLLM default"),
    FormField("max_model_len", "max_model_len", "int", "the model's own"),
    FormField("max_num_batched_tokens", "max_num_batched_tokens", "int", "vLLM default"),
    FormField("kv_cache_memory_bytes", "kv_cache_memory_bytes", "bytes", "e.g. 268435456 or 256MiB"),
    FormField("num_gpu_blocks_override", "num_gpu_blocks_override", "int", "vLLM default"),
    FormField("gpu_memory_utilization", "gpu_memory_utilization", "float", "0 < x <= 1"),
    FormField("cpu_threads_bind", "cpu_threads_bind", "text", "CPU engines: 0-3, nobind"),
    FormField("enforce_eager", "enforce_eager", "bool"),
    FormField("enable_prefix_caching", "enable_prefix_caching", "tristate"),
)
_BY_NAME = {f.name: f for f in FIELDS}


def _parse(field: FormField, raw: Any) -> Any:
    """The typed value of one field, None for 'not given'; ValueError says what is wrong."""
    if field.kind == "bool":
        return bool(raw)
    if field.kind == "tristate":
        return {"on": True, "off": False}.get(raw)
    text = (raw or "").strip()
    if not text:
        return None
    if field.kind == "int":
        try:
            return int(text.replace("_", "").replace(",", ""))
        except ValueError:
            raise ValueError("must be a whole number") from None
    if field.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError("must be a number such as 0.9") from None
    if field.kind == "bytes":
        return parse_size_bytes(text)
    return text


def validate_form(
    raw: dict[str, Any], remote: bool = False
) -> tuple[str | None, dict[str, Any] | None, dict[str, list[str]]]:
    """(engine name, spec fields for the daemon, errors by field; "" holds the spec-wide ones).
    `remote`: the engine starts on another host, whose daemon checks the model where it is."""
    errors: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    for field in FIELDS:
        try:
            value = _parse(field, raw.get(field.name))
        except ValueError as e:
            errors.setdefault(field.name, []).append(str(e))
            continue
        if value is not None:
            values[field.name] = value
    name = values.pop("name", None)
    if name is None:
        errors.setdefault("name", []).append("give the engine a name")
    else:
        try:
            check_name(name)
        except ValueError as e:
            errors.setdefault("name", []).append(str(e))
    missing_model = "model" not in values
    if missing_model:
        errors.setdefault("model", []).append("give a model directory or Hugging Face name")
    if values.get("enforce_eager") is False:
        values.pop("enforce_eager")
    # Without a model the other fields are still checked, against a stand-in hub name.
    fields = {k: v for k, v in values.items() if k not in errors}
    model = fields.pop("model", None) if remote else None
    fields.setdefault("model", "stand-in/model")
    try:
        spec = EngineSpec(**fields)
    except ValidationError as e:
        for line in validation_messages(e):
            loc, _, msg = line.partition(": ")
            key = loc if loc in _BY_NAME else ""
            errors.setdefault(key, []).append(msg if key else line.removeprefix("spec: "))
        return name, None, errors
    if errors:
        return name, None, errors
    # The validated values (a model path made absolute here, where the user typed it), only
    # for the fields given: the daemon fills the rest with its own defaults.
    dumped = spec.model_dump(mode="json", exclude_unset=True)
    return name, dumped if model is None else {**dumped, "model": model}, errors


class EngineFormScreen(ModalScreen[tuple[str, dict[str, Any]] | None]):
    BINDINGS = bindings_for("form")

    def __init__(self, host: str | None = None, remote: bool = False) -> None:
        super().__init__()
        self.host = host  # over several hosts: where the engine starts
        self.remote = remote  # another host: its daemon checks the model, and the planner (this host's) is left out
        self._touched: set[str] = set()

    def compose(self) -> ComposeResult:
        blink = getattr(self.app, "cursor_blink", True)
        with Vertical(id="form-box"):
            with VerticalScroll(id="form-fields"):
                for f in FIELDS:
                    with Horizontal(classes="form-row"):
                        yield Label(f.label, classes="form-label")
                        if f.kind == "bool":
                            yield Checkbox("on", value=False, id=f"f-{f.name}", compact=True)
                        elif f.kind == "tristate":
                            yield Select(
                                [("vLLM default", "default"), ("on", "on"), ("off", "off")],
                                value="default",
                                allow_blank=False,
                                compact=True,
                                id=f"f-{f.name}",
                            )
                        else:
                            inp = Input(placeholder=f.placeholder, compact=True, id=f"f-{f.name}")
                            inp.cursor_blink = blink
                            yield inp
                    yield Static("", classes="form-error", id=f"e-{f.name}")
                yield Static("", classes="form-error", id="e-")
            yield PlannerPanel(id="form-planner")
            with Horizontal(id="form-buttons"):
                yield Button("Start (ctrl+s)", variant="success", id="form-submit", compact=True)
                yield Button("Cancel (esc)", id="form-cancel", compact=True)
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.query_one("#form-box").border_title = "start an engine" + (f" on {self.host}" if self.host else "")
        self.query_one("#f-name", Input).focus()
        self.query_one(PlannerPanel).display = not self.remote
        self.query_one(PlannerPanel).show(None)

    def _raw(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in FIELDS:
            w = self.query_one(f"#f-{f.name}")
            assert isinstance(w, (Input, Checkbox, Select)), w  # what compose() put there
            out[f.name] = w.value
        return out

    def _show_errors(self, errors: dict[str, list[str]], every: bool) -> None:
        for key in [f.name for f in FIELDS] + [""]:
            visible = every or key in self._touched or (key == "" and bool(self._touched))
            shown = errors.get(key, []) if visible else []
            w = self.query_one(f"#e-{key}", Static)
            w.update("\n".join(shown))
            w.set_class(bool(shown), "-shown")

    def _changed(self, widget_id: str | None) -> None:
        if widget_id and widget_id.startswith("f-"):
            self._touched.add(widget_id[2:])
        _name, spec, errors = validate_form(self._raw(), self.remote)
        self._show_errors(errors, every=False)
        if not self.remote:
            self.query_one(PlannerPanel).show(spec)

    def on_input_changed(self, event: Input.Changed) -> None:
        self._changed(event.input.id)

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        self._changed(event.checkbox.id)

    def on_select_changed(self, event: Select.Changed) -> None:
        self._changed(event.select.id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.focus_next()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "form-submit":
            self.action_submit()
        else:
            self.action_cancel()

    def action_submit(self) -> None:
        name, spec, errors = validate_form(self._raw(), self.remote)
        self._show_errors(errors, every=True)
        if errors or spec is None or name is None:
            self.app.notify("the form has errors: see the marked fields", severity="warning")
            return
        self.dismiss((name, spec))

    def action_next_field(self) -> None:
        self.focus_next()

    def action_previous_field(self) -> None:
        self.focus_previous()

    def action_cancel(self) -> None:
        self.dismiss(None)
