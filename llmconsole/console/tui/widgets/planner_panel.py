"""The planner beside the start-engine form: does the config fit, and what KV will it have.

It re-plans on every change of the form, so it must be cheap: the arithmetic reads the model's
config.json and nothing else, and the host's memory is read once per panel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import Static

from llmconsole.engine.plan.recommend import Workload, recommend
from llmconsole.engine.plan.validate import HostMemory, Verdict, host_memory, validate
from llmconsole.engine.spec import EngineSpec


def planner_lines(spec: EngineSpec | None, mem: HostMemory | None) -> list[tuple[str, str]]:
    """(style, text) lines for `spec` on this host; a pure function so tests need no app."""
    if spec is None:
        return [("dim", "planner: fill in a valid config to see whether it fits")]
    verdict: Verdict = validate(spec, mem)
    head = f"planner  {Path(spec.model).name} on {verdict.device}"
    lines = [("bold", head + ("  (exact)" if verdict.exact else "  (estimate)" if verdict.checked else ""))]
    if not verdict.checked:
        return lines + [("dim", n) for n in verdict.notes]
    cap = verdict.capacity
    if cap is not None:
        lines.append(
            (
                "",
                f"KV {cap.num_blocks:,} blocks = {cap.tokens:,} tokens, "
                f"{cap.max_concurrency:.2f} requests of {cap.max_model_len:,}",
            )
        )
    if verdict.ok:
        lines.append(("green", f"fits: needs {verdict.needed_bytes or 0:,} B of {verdict.available_bytes or 0:,} B"))
    else:
        lines.append(
            ("red", f"DOES NOT FIT: needs {verdict.needed_bytes or 0:,} B, has {verdict.available_bytes or 0:,} B")
        )
        if verdict.nearest:
            nearest = ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in verdict.nearest.items())
            lines.append(("yellow", f"nearest that fits: {nearest}"))
    batch = recommend(Workload(), kv_capacity=cap)[0]
    lines.append(("dim", f"suggest max_num_seqs {batch.value}: {batch.rule}"))
    return lines


class PlannerPanel(Static):
    DEFAULT_CSS = """
    PlannerPanel { height: auto; padding: 0 1; border-top: solid $accent-darken-2; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._mem: dict[str, HostMemory] = {}

    def show(self, spec_fields: dict[str, Any] | None) -> None:
        """Re-plan for the form's validated fields (None: the form has errors or no model)."""
        spec = None
        if spec_fields and spec_fields.get("model"):
            try:
                spec = EngineSpec(**spec_fields)
            except Exception:
                spec = None
        mem = None
        if spec is not None:
            key = spec.runtime.device if spec.runtime else "local"
            if key not in self._mem:
                self._mem[key] = host_memory(spec)
            mem = self._mem[key]
        text = Text()
        for i, (style, line) in enumerate(planner_lines(spec, mem)):
            text.append(("\n" if i else "") + line, style=style or None)
        self.update(text)
