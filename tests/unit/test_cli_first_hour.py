"""What a new user met in their first hour with the CLI: sizes as the form takes them, a log that
starts at a line, and a sweep question in plain words."""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stdout

import pytest

from llmconsole.console.cli import _follow_logs
from llmconsole.console.sizes import parse_size_bytes
from llmconsole.console.spec_flags import add_spec_flags, spec_overrides
from llmconsole.console.tui.screens.form import FIELDS, _parse
from llmconsole.console.tui.views.estimate import sweep_size_text
from llmconsole.console.tui.views.sweep import confirm_question
from llmconsole.engine.sweep.plan import LoadLevel, SweepPlan


def _flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_spec_flags(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(("given", "size"), [("256MiB", 256 << 20), ("1GiB", 1 << 30), ("268435456", 268435456)])
def test_the_cli_takes_the_sizes_the_form_takes(given, size):
    kv = next(f for f in FIELDS if f.name == "kv_cache_memory_bytes")
    assert spec_overrides(_flags("--kv-cache-memory-bytes", given))["kv_cache_memory_bytes"] == size
    assert _parse(kv, given) == size == parse_size_bytes(given)


def test_a_size_that_is_none_is_refused_saying_what_a_size_looks_like(capsys):
    with pytest.raises(SystemExit):
        _flags("--kv-cache-memory-bytes", "lots")
    assert "such as 268435456, 256MiB or 1GiB" in capsys.readouterr().err


class _LogOf:
    """GET /v1/engines/{name}/logs over a log text, sliced as the daemon slices the file."""

    def __init__(self, text: str) -> None:
        self.data = text.encode()

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 65536) -> dict:
        size = len(self.data)
        start = max(0, size - max_bytes) if offset is None else min(offset, size)
        piece = self.data[start : start + max_bytes]
        return {"text": piece.decode(errors="replace"), "offset": start + len(piece), "size": size}


def _printed(text: str, max_bytes: int) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        _follow_logs(_LogOf(text), argparse.Namespace(name="e1", bytes=max_bytes, follow=False))  # type: ignore[arg-type]
    return out.getvalue()


def test_engine_logs_starts_at_a_line_boundary():
    log = "".join(f"INFO line {i:03d} of the engine's log\n" for i in range(100))
    shown = _printed(log, 200)
    assert shown and log.endswith(shown)
    assert shown.startswith("INFO line ")  # not the end of a line cut in two
    assert _printed(log, 1 << 20) == log  # the whole log: its first line is whole already


def test_the_sweep_question_says_its_size_in_plain_words():
    plan = SweepPlan(
        "e1",
        {"max_num_seqs": (4, 8)},
        (LoadLevel("concurrency", 2), LoadLevel("concurrency", 8)),
        repeats=1,
        num_requests=16,
    )
    assert sweep_size_text(plan) == "2 configs x 2 loads = 4 load runs of 16 requests"
    assert confirm_question("e1", plan, {"max_num_seqs": 4}).startswith(
        "Sweep engine e1: 2 configs x 2 loads = 4 load runs of 16 requests. "
    )
    one = SweepPlan("e1", {"max_num_seqs": (4,)}, (LoadLevel("concurrency", 2),), repeats=3, num_requests=16)
    assert sweep_size_text(one) == "1 config x 1 load x 3 repeats = 3 load runs of 16 requests"


def test_status_name_across_hosts_keeps_that_engine_on_each_host():
    from llmconsole.console.cli import _only_engine_across
    from llmconsole.console.host_status import HostReport
    from llmconsole.console.hosts import LOCAL_HOST
    from llmconsole.wire.status import StatusAnswer

    status = StatusAnswer.model_validate({"engines": [{"name": "chat"}, {"name": "batch"}], "daemon": {}})
    reports = [HostReport(LOCAL_HOST, status=status), HostReport(LOCAL_HOST, error="unreachable", reachable=False)]
    narrowed = _only_engine_across(reports, "chat")
    assert [e.name for e in narrowed[0].engines] == ["chat"] and narrowed[1] == reports[1]
    assert _only_engine_across(reports, None) == reports
