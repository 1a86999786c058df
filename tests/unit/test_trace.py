"""Request traces: the three CSV layouts read, bad files refused with the line and the reason,
the shipped day's shape, and a replay's arrivals at the stated time scale (against the load
generator's stub server, whose delays are known)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

import pytest

from llmconsole.console.cli import EXIT_USAGE, main
from llmconsole.engine.load.generator import run_trace, trace_plan
from llmconsole.engine.load.trace import (
    TraceError,
    TraceRequest,
    fit_to_context,
    parse_trace,
    read_trace,
    write_trace,
)
from llmconsole.engine.load.trace_gen import DayShape, diurnal_day, relative_rate
from llmconsole.engine.load.workload import load_tokenizer
from tests.support.paths import ROOT

STUB = ROOT / "bench" / "bench_loadgen_stub.py"


def test_llmconsole_layout_round_trips_with_stream_and_priority(tmp_path):
    reqs = (TraceRequest(0.0, 10, 5), TraceRequest(1.25, 300, 7, stream=False, priority=2))
    write_trace(tmp_path / "t.csv", reqs)
    assert read_trace(tmp_path / "t.csv") == reqs


def test_optional_columns_default_to_a_stream_of_priority_zero():
    got = parse_trace(["arrival_s,input_tokens,output_tokens", "5.5,12,3", "2.5,8,4"])
    # Sorted by arrival, the first at 0 s.
    assert got == (TraceRequest(0.0, 8, 4), TraceRequest(3.0, 12, 3))


def test_azure_llm_inference_trace_layout():
    got = parse_trace(
        [
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,396,109",
            "2023-11-16 18:16:01.0000000,0,0",
        ]
    )
    assert [r.input_tokens for r in got] == [374, 396, 1]  # 0 tokens: kept as 1
    assert [r.output_tokens for r in got] == [44, 109, 1]
    assert got[0].arrival_s == 0.0
    assert got[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert got[2].arrival_s == pytest.approx(14.31942, abs=1e-5)


def test_burstgpt_layout():
    got = parse_trace(
        [
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
            "5,ChatGPT,472,18,490,Conversation log",
            "45,GPT-4,1087,230,1317,API log",
        ]
    )
    assert got == (TraceRequest(0.0, 472, 18), TraceRequest(40.0, 1087, 230))


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ([], "is empty"),
        (["when,prompt,answer", "1,2,3"], "none of the trace formats read"),
        (["arrival_s,input_tokens,output_tokens"], "no requests"),
        (["arrival_s,input_tokens,output_tokens", "0,1,1", "soon,3,4"], "line 3"),
        (["arrival_s,input_tokens,output_tokens", "0,-4,1"], "input tokens must be at least 0"),
        (["arrival_s,input_tokens,output_tokens", "0,4"], "2 fields where the header has 3"),
        (["arrival_s,input_tokens,output_tokens,stream", "0,4,4,maybe"], "stream 'maybe'"),
        (["arrival_s,input_tokens,output_tokens", "nan,4,4"], "finite"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "yesterday,4,4"], "line 2"),
    ],
)
def test_bad_traces_are_refused_with_the_line_and_the_reason(lines, says):
    with pytest.raises(TraceError, match=says):
        parse_trace(lines, "t.csv")


def test_unreadable_files_are_trace_errors(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "missing.csv")
    (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(TraceError, match="not a text"):
        read_trace(tmp_path / "b.csv")


def test_the_cli_refuses_a_bad_trace_before_sending_anything(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0,1,x\n")
    assert main(["load", "e1", "--trace", str(bad), "--time-scale", "10"]) == EXIT_USAGE
    assert "line 2: output tokens 'x' is not a number of tokens" in capsys.readouterr().err
    good = tmp_path / "good.csv"
    write_trace(good, (TraceRequest(0.0, 4, 4),))
    assert main(["load", "e1", "--trace", str(good), "--time-scale", "0"]) == EXIT_USAGE
    assert "--time-scale must be a number above 0" in capsys.readouterr().err
    assert main(["load", "e1", "--rate", "1", "--time-scale", "3"]) == EXIT_USAGE
    assert "--time-scale applies to --trace only" in capsys.readouterr().err


def test_fit_to_context_keeps_arrivals_and_shortens_prompts():
    reqs = (TraceRequest(0.0, 100, 50), TraceRequest(1.0, 2000, 300), TraceRequest(2.0, 30, 900))
    got = fit_to_context(reqs, 512)
    assert [r.arrival_s for r in got] == [0.0, 1.0, 2.0]
    assert got[0] == reqs[0]
    assert (got[1].input_tokens, got[1].output_tokens) == (256, 256)
    assert (got[2].input_tokens, got[2].output_tokens) == (30, 256)
    assert all(r.input_tokens + r.output_tokens <= 512 for r in got)


def test_the_day_has_a_quiet_night_a_morning_ramp_an_evening_peak_and_long_prompt_bursts():
    shape = DayShape()
    day = diurnal_day(shape, seed=1)
    assert day == diurnal_day(shape, seed=1)  # the same seed, the same day
    assert relative_rate(20.0) == pytest.approx(3.0 * relative_rate(15.0))
    per_hour = Counter(int(r.arrival_s // 3600) for r in day if r.input_tokens < 400)
    night = sum(per_hour[h] for h in range(0, 5))
    morning = sum(per_hour[h] for h in range(9, 12))
    evening = sum(per_hour[h] for h in range(19, 22))
    assert night / 5 < morning / 3 / 2.5  # the night is quiet
    assert per_hour[6] < per_hour[8] < per_hour[10]  # the morning ramp
    assert evening / 3 > 1.8 * per_hour[15]  # the evening peak over the afternoon trough
    long = [r for r in day if r.input_tokens > 4 * shape.input_median]
    burst_hours = Counter(int(r.arrival_s // 3600) for r in long)
    assert sum(burst_hours[int(h)] for h in shape.bursts) > 0.8 * len(long)
    assert len(day) == pytest.approx(shape.requests, rel=0.1)


def test_the_shipped_traces_are_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "bench" / "make_traces.py"), "--out", str(tmp_path)], check=True)
    for f in tmp_path.glob("*.csv"):
        assert f.read_bytes() == (ROOT / "bench" / "traces" / f.name).read_bytes(), f.name


def test_a_replay_plan_has_exact_lengths_and_scaled_arrivals(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    reqs = (TraceRequest(0.0, 20, 3), TraceRequest(30.0, 40, 5, stream=False, priority=1), TraceRequest(90.0, 9, 2))
    wl, plan, offsets = trace_plan(reqs, 30.0, tok, warmup=1)
    assert offsets == [0.0, 1.0, 3.0]
    assert [p.warmup for p in plan] == [True, False, False, False]
    measured = plan[1:]
    assert [len(tok.encode(p.prompt)) for p in measured] == [20, 40, 9]
    assert [(p.max_tokens, p.stream, p.priority) for p in measured] == [(3, True, 0), (5, False, 1), (2, True, 0)]
    assert wl.num_requests == 3
    with pytest.raises(ValueError, match="time scale"):
        trace_plan(reqs, 0.0, tok)


@pytest.fixture(scope="module")
def stub():
    p = subprocess.Popen(
        [sys.executable, str(STUB), "--port", "0", "--first-delay-ms", "20", "--gap-ms", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    port = int(p.stdout.readline().split()[-1])
    yield f"http://127.0.0.1:{port}"
    p.kill()
    p.wait()


def test_a_replay_sends_each_request_no_sooner_than_its_scaled_arrival(stub, tiny_model):
    reqs = tuple(TraceRequest(t, 8, 4) for t in (0.0, 10.0, 20.0, 40.0))
    result = asyncio.run(run_trace(stub, "m", reqs, 20.0, tokenizer_source=str(tiny_model)))
    s = result.summary
    assert (s.requests, s.completed, s.failed) == (4, 4, 0)
    starts = [r.start_s for r in result.records]
    for start, due in zip(starts, (0.0, 0.5, 1.0, 2.0), strict=True):
        assert start >= due - 0.01
    assert starts == sorted(starts)
    assert all(r.output_tokens == 4 for r in result.records)
